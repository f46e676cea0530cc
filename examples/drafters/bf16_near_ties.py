"""Where DFlash's bfloat16 text leaves plain greedy `generate`'s, how close was plain's own choice?

    python examples/drafters/bf16_near_ties.py --sets mtbench --num-prompts 8 --max-new-tokens 96

For each prompt: plain greedy `generate` and DFlash (the shipped drafter as configured, or --drafter) in bfloat16, the
first new token where they differ, and plain's two best logits there, recomputed with plain's own shapes (prefill,
then one token per forward). Their gap is printed in bfloat16 units in the last place (ulp) at that magnitude: a gap
of a few ulps is a near-tie that any other shape of the same forward (a verification over several tokens) may round
the other way; a large gap would point at a bug. float32 is token-identical (the tests check it).
"""

import argparse

import torch
from transformers import AutoModel

import hf_dflash  # noqa: F401  (registers the drafter with AutoModel)
from hf_dflash.bench import chat_inputs, load_prompt_set
from hf_dflash.cli import SHIPPED_DRAFTER
from hf_dflash.packaged import load_packaged


def bf16_ulp(x: float) -> float:
    """The spacing of bfloat16 numbers around `x` (8 significant bits)."""
    return 2.0 ** (torch.tensor(abs(x)).log2().floor().item() - 7)


@torch.no_grad()
def plain_logits(target, inputs, tokens) -> torch.Tensor:
    """Logits for the token after `tokens`, computed as plain greedy decoding computes them."""
    out = target(**inputs, use_cache=True)
    for token in tokens:
        out = target(torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
    return out.logits[0, -1].float()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=["mtbench"])
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--drafter", default=None, help="default: the shipped drafter")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load_packaged(dtype=torch.bfloat16)
    drafter = AutoModel.from_pretrained(args.drafter or str(SHIPPED_DRAFTER), dtype=torch.bfloat16)
    print("| set | prompt | first difference | plain's token / DFlash's | plain's top-2 logits | gap (bf16 ulps) |")
    print("|---|---|---|---|---|---|")
    for name in args.sets:
        for i, prompt in enumerate(load_prompt_set(name, args.num_prompts)):
            inputs = chat_inputs(tokenizer, prompt.messages)
            n = inputs["input_ids"].shape[1]
            kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
            plain = target.generate(**inputs, **kwargs)[0, n:].tolist()
            dflash = target.generate(**inputs, assistant_model=drafter, **kwargs)[0, n:].tolist()
            d = next((j for j, (a, b) in enumerate(zip(plain, dflash)) if a != b), None)
            if d is None:
                print(f"| {name} | {i} | identical | | | |")
                continue
            top, ids = plain_logits(target, inputs, plain[:d]).topk(2)
            shown = tokenizer.convert_ids_to_tokens([plain[d], dflash[d]])
            gap = (top[0] - top[1]).item() / bf16_ulp(top[0].item())
            print(f"| {name} | {i} | {d} | {shown[0]!r} / {shown[1]!r} | {top[0]:.3f}, {top[1]:.3f} | {gap:.0f} |")


if __name__ == "__main__":
    main()
