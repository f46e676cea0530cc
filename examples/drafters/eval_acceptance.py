"""Acceptance length of drafters measured with `generate` on held-out prompt sets (greedy, every block verified).

    python examples/drafters/eval_acceptance.py DRAFTER [DRAFTER ...] --sets gsm8k mbpp alpaca --num-prompts 8 \
        --block-size 8 --out acceptance.json

Prints a markdown table: per drafter, the acceptance length (tokens committed per target forward, pooled over the
prompts' steps) on each set and their mean. The prompt sets are evaluation sets: never train on them. Besides the
bench's sets, "mtbench2": MT-Bench's second turns, after the target's own greedy answer to the first (256 tokens).
"""

import argparse
import importlib.util
import json
from pathlib import Path

import torch
from transformers import AutoModel

import hf_dflash  # noqa: F401  (registers the drafter with AutoModel)
from hf_dflash.bench import PACKAGED_SETS, chat_inputs, load_prompt_set
from hf_dflash.data import Prompt
from hf_dflash.devices import resolve_dtype
from hf_dflash.packaged import load_packaged


@torch.no_grad()
def acceptance(target, drafter, tokenizer, prompts, max_new_tokens):
    committed = steps = 0
    for prompt in prompts:
        out = target.generate(**chat_inputs(tokenizer, prompt.messages), assistant_model=drafter,
                              max_new_tokens=max_new_tokens, do_sample=False, return_dict_in_generate=True,
                              assistant_confidence_threshold=0.0, draft_tree_size=0)  # the chain: every block verified
        committed, steps = committed + sum(out.acceptance_lengths[0]), steps + len(out.acceptance_lengths[0])
    return committed / max(steps, 1)


@torch.no_grad()
def mtbench_second_turns(target, tokenizer, num_prompts, first_answer_tokens=256):
    """MT-Bench's second turns after the target's own greedy answer to the first (multi-turn chat, what ShareGPT's
    later turns train): the set "mtbench2"."""
    _, module, relative = PACKAGED_SETS["mtbench"]
    path = Path(importlib.util.find_spec(module).submodule_search_locations[0]) / relative
    prompts = []
    for line in open(path, encoding="utf-8"):
        if len(prompts) >= num_prompts:
            break
        record = json.loads(line)
        first = [{"role": "user", "content": record["turns"][0]}]
        inputs = chat_inputs(tokenizer, first)
        out = target.generate(**inputs, max_new_tokens=first_answer_tokens, do_sample=False)
        answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        turns = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": record["turns"][1]}]
        prompts.append(Prompt(id=f"{record['question_id']}-2", messages=turns))
    return prompts


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("drafters", nargs="+")
    parser.add_argument("--sets", nargs="+", default=["gsm8k", "mbpp", "alpaca"])
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--block-size", type=int, help="default: each drafter's own")
    parser.add_argument("--dtype", default="float32", help="target dtype (float32: exact, the acceptance of record)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="JSON file for the results")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load_packaged(dtype=resolve_dtype(args.dtype))
    sets = {name: mtbench_second_turns(target, tokenizer, args.num_prompts) if name == "mtbench2"
            else load_prompt_set(name, args.num_prompts) for name in args.sets}
    results = []
    for path in args.drafters:
        kwargs = {"block_size": args.block_size} if args.block_size else {}
        drafter = AutoModel.from_pretrained(path, dtype=target.dtype, **kwargs).eval()
        row = {"drafter": path, "block_size": drafter.block_size}
        row.update({name: acceptance(target, drafter, tokenizer, prompts, args.max_new_tokens)
                    for name, prompts in sets.items()})
        row["mean"] = sum(row[name] for name in sets) / len(sets)
        results.append(row)
        print(json.dumps(row), flush=True)
    print("\n| drafter | block | " + " | ".join(sets) + " | mean |\n|---|---|" + "---|" * (len(sets) + 1))
    for row in results:
        print(f"| {row['drafter']} | {row['block_size']} | " + " | ".join(f"{row[n]:.2f}" for n in sets)
              + f" | {row['mean']:.2f} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"settings": vars(args), "results": results}, indent=2))


if __name__ == "__main__":
    main()
