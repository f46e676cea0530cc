"""How well a drafter's first-draft probability predicts acceptance: the measurement behind the shipped SmolLM2
drafter's `assistant_confidence_threshold` (README Results). For each DFlash step it records the drafter's
probability for its first draft and the drafts the target accepted, then prints the mean accepted drafts per
probability bin. A step that skips its drafts pays where the expected accepted drafts are below about
(block verification cost / one-token step cost) - 1 (0.6 on a 2-core CPU for SmolLM2, block 4).

    python examples/drafters/confidence_calibration.py --drafter examples/drafters/smollm2-135m-instruct-dflash
"""

import argparse
from collections import defaultdict

import torch
from transformers import AutoModel

import hf_dflash  # noqa: F401  (registers the drafter with AutoModel)
from hf_dflash.bench import chat_inputs, load_prompt_set
from hf_dflash.generation import _Decoder
from hf_dflash.packaged import load_packaged


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafter", default="examples/drafters/smollm2-135m-instruct-dflash")
    parser.add_argument("--sets", nargs="+", default=["gsm8k", "mbpp", "alpaca", "humaneval", "mtbench"])
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    target, tokenizer = load_packaged()
    drafter = AutoModel.from_pretrained(args.drafter, dtype=target.dtype, block_size=args.block_size).eval()

    confidences = []
    propose = _Decoder.drafter_propose

    def recording(self, newest, verify_len):
        drafts, confidence = propose(self, newest, verify_len)
        confidences.append(float(confidence[0]))
        return drafts, confidence

    _Decoder.drafter_propose = recording
    accepted = defaultdict(list)  # probability bin -> accepted drafts per step
    for name in args.sets:
        for prompt in load_prompt_set(name, args.num_prompts):
            confidences.clear()
            # a threshold far below any top probability (1 / vocabulary) makes the loop compute the confidence
            # without ever skipping a block
            out = target.generate(**chat_inputs(tokenizer, prompt.messages), max_new_tokens=64, do_sample=False,
                                  assistant_model=drafter, assistant_confidence_threshold=1e-9,
                                  return_dict_in_generate=True)
            for p, committed in zip(confidences, out.acceptance_lengths[0]):
                accepted[min(int(p * 10), 9)].append(committed - 1)
    _Decoder.drafter_propose = propose
    steps = sum(map(len, accepted.values()))
    print(f"{steps} steps, block {args.block_size}, sets {', '.join(args.sets)} ({args.num_prompts} prompts each)")
    for b in sorted(accepted):
        print(f"first-draft probability {b / 10:.1f}-{(b + 1) / 10:.1f}: {len(accepted[b]):5d} steps, "
              f"{sum(accepted[b]) / len(accepted[b]):.2f} accepted drafts on average")


if __name__ == "__main__":
    main()
