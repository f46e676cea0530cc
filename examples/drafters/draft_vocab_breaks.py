"""How often the chain breaks at a token the drafter cannot propose (outside its draft vocabulary), per prompt set
(RESULTS.md, "Drafter I", the draft vocabulary).

A drafter trained with `--draft-vocab-size N` drafts only the N most frequent response tokens of its training data.
Greedy DFlash generation, the chain, every block verified; for each step that did not accept its whole block, the
token the target chose where the drafts stopped matching, and whether it lies outside the draft vocabulary.

    python examples/drafters/draft_vocab_breaks.py --drafter examples/drafters/smollm2-135m-instruct-dflash
"""

import argparse

import torch
from transformers import AutoModel

import hf_dflash  # noqa: F401  (registers the drafter with AutoModel)
from hf_dflash.bench import chat_inputs, load_prompt_set
from hf_dflash.packaged import load_packaged


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafter", default="examples/drafters/smollm2-135m-instruct-dflash")
    parser.add_argument("--sets", nargs="+", default=["gsm8k", "mbpp", "alpaca", "humaneval", "mtbench"])
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args()
    torch.set_num_threads(1)
    target, tokenizer = load_packaged(dtype=torch.float32)  # float32: the text is plain greedy's
    drafter = AutoModel.from_pretrained(args.drafter, dtype=torch.float32)
    if drafter.draft_vocab is None:
        raise SystemExit(f"{args.drafter} drafts over the whole vocabulary: no token is outside it.")
    vocab = set(drafter.draft_vocab.tolist())
    block = drafter.config.block_size
    print(f"| set | new tokens outside the draft vocabulary | chain breaks at such a token |\n|---|---|---|")
    for name in args.sets:
        new = outside = breaks = breaks_outside = 0
        for prompt in load_prompt_set(name, args.num_prompts):
            inputs = chat_inputs(tokenizer, prompt.messages)
            out = target.generate(**inputs, assistant_model=drafter, max_new_tokens=args.max_new_tokens,
                                  do_sample=False, return_dict_in_generate=True, assistant_confidence_threshold=0.0,
                                  draft_tree_size=0)
            text = out.sequences[0, inputs["input_ids"].shape[1] :].tolist()
            new, outside = new + len(text), outside + sum(t not in vocab for t in text)
            position = 0
            # accepted drafts + the target's own token per step; the last step may end at a stop instead of a break
            for committed in out.acceptance_lengths[0][:-1]:
                position += committed
                if committed < block:  # a break: the step's last token is the target's, where the drafts went wrong
                    breaks += 1
                    breaks_outside += text[position - 1] not in vocab
        print(f"| {name} | {outside / new:.3f} ({outside} of {new}) | {breaks_outside / max(breaks, 1):.3f} "
              f"({breaks_outside} of {breaks}) |", flush=True)


if __name__ == "__main__":
    main()
