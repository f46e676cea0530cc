"""Acceptance of several drafters side by side on the same prompts: tokens committed per target forward (tau). Greedy:
the chain, the chain of each position's own argmax (no DFlash2 selector, no bigram prior), a tree of 16. Sampling: a
chain drawn from the drafter (what `generate` does), the greedy chain as point masses (what it did before), a tree of
16 (point masses). Acceptance only: nothing is timed, so it may share the machine.

    python examples/compare_drafters.py --drafter dflash=out/dflash --drafter dflash2=out/dflash2 \
        --sets gsm8k mbpp alpaca humaneval mtbench --num-prompts 8 --output acceptance.json

The JSON (machine, settings, {drafter: {mode: {set: tau}}}) goes in docs/results/comparisons/<name>/ with the command
in command.txt; `python examples/results_md.py` renders it into docs/results.md.
"""

import argparse
import json
import sys

import torch
from tqdm import tqdm
from transformers import AutoModel

import hf_dflash  # noqa: F401  (registers the drafters with AutoModel)
from hf_dflash.bench import load_prompt_set, machine_info
from hf_dflash.generation import DFlashCall, DFlashProposer
from hf_dflash.generation.loop import original_generate
from hf_dflash.packaged import SMOLLM2_ID, load_target
from hf_dflash.prompts import chat_inputs

MODES = {  # name: (generate's arguments, draft tree size, proposer)
    "chain": (dict(do_sample=False), 0, None),
    "chain_unconditional": (dict(do_sample=False), 0, "unconditional"),
    "tree16": (dict(do_sample=False), 16, None),
    "sampling": (dict(do_sample=True), 0, None),
    "sampling_point_mass": (dict(do_sample=True), 0, "point_mass"),
    "sampling_tree16": (dict(do_sample=True), 16, None),  # trees verify point masses
}


class PointMassProposer(DFlashProposer):
    """Under sampling, the greedy chain (point masses) instead of drafts drawn from the drafter."""

    def sample_chain(self, decoder, verify_len):
        return (*self.draft_chain(decoder, verify_len), None)


class UnconditionalProposer(DFlashProposer):
    """Each position's own argmax: a DFlash2 drafter without its selector, a DFlash one without its bigram prior."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.selector, self.prior = False, None


PROPOSERS = {None: DFlashProposer, "point_mass": PointMassProposer, "unconditional": UnconditionalProposer}


def acceptance(target, drafter, prompts, tokenizer, mode: str, max_new_tokens: int, temperature: float) -> float:
    kwargs, tree_size, proposer = MODES[mode]
    if kwargs["do_sample"]:
        kwargs = dict(kwargs, temperature=temperature, top_k=0, top_p=1.0)
    decode = DFlashCall.custom_generate(drafter, PROPOSERS[proposer], draft_tree_size=tree_size,
                                        assistant_confidence_threshold=0.0)
    committed = steps = 0
    torch.manual_seed(0)
    for prompt in prompts:
        inputs = chat_inputs(tokenizer, prompt.messages, target.device)
        out = original_generate(target, **inputs, max_new_tokens=max_new_tokens, custom_generate=decode,
                                return_dict_in_generate=True, **kwargs)
        committed += sum(out.acceptance_lengths[0])
        steps += len(out.acceptance_lengths[0])
    return committed / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", action="append", required=True, metavar="NAME=PATH",
                        help="a drafter folder or Hub id, under the name the table shows (repeat)")
    parser.add_argument("--target", default=SMOLLM2_ID)
    parser.add_argument("--sets", nargs="+", default=["gsm8k", "mbpp", "alpaca", "humaneval", "mtbench"])
    parser.add_argument("--bench-dir", help="folder of the gsm8k/mbpp/alpaca files (default: $HF_DFLASH_BENCH_DIR)")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--dtype", default="float32", help="float32: greedy acceptance free of bfloat16 near-ties")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", required=True, help="the JSON to write")
    args = parser.parse_args()
    drafters = dict(spec.split("=", 1) for spec in args.drafter)
    torch.set_num_threads(args.threads)
    target, tokenizer = load_target(args.target, args.dtype)
    prompts = {name: load_prompt_set(name, args.num_prompts, args.bench_dir) for name in args.sets}
    results = {}
    with tqdm(total=len(drafters) * len(args.modes) * len(prompts), desc="acceptance") as bar:
        for name, path in drafters.items():
            drafter = AutoModel.from_pretrained(path, dtype=target.dtype).to(target.device)
            for mode in args.modes:
                for set_name, set_prompts in prompts.items():
                    tau = acceptance(target, drafter, set_prompts, tokenizer, mode, args.max_new_tokens,
                                     args.temperature)
                    results.setdefault(name, {}).setdefault(mode, {})[set_name] = round(tau, 3)
                    bar.set_postfix_str(f"{name} {mode} {set_name} {tau:.2f}")
                    bar.update()
    record = {
        "machine": machine_info(args.threads),
        "settings": {"target": args.target, "dtype": args.dtype, "drafters": drafters, "sets": args.sets,
                     "num_prompts": args.num_prompts, "max_new_tokens": args.max_new_tokens,
                     "temperature": args.temperature, "modes": args.modes},
        "tau": results,
    }
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
