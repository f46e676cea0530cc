"""Quick timing of draft trees against the chain with the shipped SmolLM2 drafter (about a minute on one CPU thread).

    python examples/draft_trees_timing.py --dtype bfloat16 --sizes 4,8,16,31,auto

For a few prompts of a set, greedy, batch 1: plain `generate`, the chain (every block verified, and with the
drafter's confidence threshold 0.5), then each `draft_tree_size`; prints the time, the speedup over plain, the
acceptance length and whether the text equals plain greedy (bfloat16 can flip near-ties: every verification shape
rounds differently). The forward costs "auto" needs are measured (or read from the cache) before the timings.
"""

import argparse
import time

import torch

import hf_dflash  # noqa: F401 (the generate hook)
from hf_dflash import DFlashDraftModel
from hf_dflash.bench import chat_inputs, load_prompt_set
from hf_dflash.cost_model import load_forward_costs
from hf_dflash.packaged import load_packaged

DRAFTER = "examples/drafters/smollm2-135m-instruct-dflash"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--sizes", default="4,8,16,31,auto", help="draft_tree_size values, comma-separated")
    parser.add_argument("--set", default="gsm8k")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=None, help="the drafter's block (default: as shipped, 4)")
    parser.add_argument("--drafter", default=DRAFTER)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    target, tokenizer = load_packaged(dtype=dtype)
    extra = {} if args.block_size is None else {"block_size": args.block_size}
    drafter = DFlashDraftModel.from_pretrained(args.drafter, dtype=dtype, **extra).eval()
    prompts = [chat_inputs(tokenizer, p.messages) for p in load_prompt_set(args.set, args.prompts)]

    def run(**kwargs):
        start, sequences, lengths = time.perf_counter(), [], []
        for inputs in prompts:
            out = target.generate(
                **inputs, max_new_tokens=args.max_new_tokens, do_sample=False, return_dict_in_generate=True, **kwargs
            )
            sequences.append(out.sequences)
            lengths += getattr(out, "acceptance_lengths", None) and out.acceptance_lengths[0] or []
        return time.perf_counter() - start, sequences, sum(lengths) / len(lengths) if lengths else 1.0

    run()  # warm-up
    if "auto" in args.sizes.split(","):
        load_forward_costs(target)
    plain, reference, _ = run()
    print(f"{args.dtype}, block {drafter.block_size}, {args.set} x {args.prompts}, {args.max_new_tokens} new tokens: "
          f"plain {plain:.2f}s")
    settings = [("chain", {"assistant_confidence_threshold": 0.0}), ("chain, threshold 0.5", {})]
    for size in args.sizes.split(","):
        if size == "auto":  # "auto" ignores the drafter's default threshold by itself
            settings.append(("tree auto", {"draft_tree_size": "auto"}))
        else:  # every tree verified, as the first chain
            settings.append((f"tree {size}", {"draft_tree_size": int(size), "assistant_confidence_threshold": 0.0}))
    for name, kwargs in settings:
        seconds, sequences, tau = run(assistant_model=drafter, **kwargs)
        same = all(torch.equal(a, b) for a, b in zip(sequences, reference))
        print(f"  {name:22s} {seconds:6.2f}s  speedup {plain / seconds:.2f}  acceptance length {tau:.2f}  "
              f"identical {same}")


if __name__ == "__main__":
    main()
