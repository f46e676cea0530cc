"""A/B of "auto"'s cost correction (`LoopCosts`): its fitted excess over the timed curve against the same loop with
the excess held at 0 (the curve as timed; the rest of a step still measured), prompt batch by prompt batch in
alternating order, the shipped drafter, greedy. Prints new tokens and tokens per second of each.

    python examples/drafters/loop_costs_ab.py --batch-size 4 --sets gsm8k mtbench   # ~1-2 min per set, one thread
"""

import argparse
import time

import torch
from transformers import AutoModel

from hf_dflash import cost_model
from hf_dflash.bench import load_prompt_set
from hf_dflash.packaged import load_packaged

DRAFTER = "examples/drafters/smollm2-135m-instruct-dflash"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", nargs="+", default=["gsm8k", "mtbench"])
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    target, tokenizer = load_packaged(dtype=dtype)
    drafter = AutoModel.from_pretrained(DRAFTER, dtype=dtype)
    drafter.config.block_size = args.block_size
    fitted = cost_model.LoopCosts.step_begins

    def curve_only(self, time):
        fitted(self, time)
        self.excess = (0.0, 0.0)

    for name in args.sets:
        prompts = load_prompt_set(name, args.num_prompts)
        totals = {"fit": [0, 0.0], "curve only": [0, 0.0]}
        for i in range(0, len(prompts), args.batch_size):
            texts = [tokenizer.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=False)
                     for p in prompts[i : i + args.batch_size]]
            inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            order = list(totals) if (i // args.batch_size) % 2 == 0 else list(totals)[::-1]
            for variant in order:
                cost_model.LoopCosts.step_begins = fitted if variant == "fit" else curve_only
                began = time.perf_counter()
                out = target.generate(**inputs, assistant_model=drafter, draft_tree_size="auto", do_sample=False,
                                      max_new_tokens=args.max_new_tokens)
                totals[variant][1] += time.perf_counter() - began
                totals[variant][0] += int((out[:, inputs["input_ids"].shape[1] :] != tokenizer.pad_token_id).sum())
        cost_model.LoopCosts.step_begins = fitted
        for variant, (tokens, seconds) in totals.items():
            print(f"{name} batch {args.batch_size} {variant}: {tokens} new tokens, {seconds:.1f} s, "
                  f"{tokens / seconds:.2f} tokens/s", flush=True)


if __name__ == "__main__":
    main()
