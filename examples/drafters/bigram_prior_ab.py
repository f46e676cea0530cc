"""A drafter with its bigram prior against the same drafter without, side by side in generation.

    OMP_NUM_THREADS=1 python examples/drafters/bigram_prior_ab.py DRAFTER bfloat16 4   # with its prior; DTYPE, prompts/set

The first prompts of the five sets (plus one untimed warm-up prompt), 128 new tokens, greedy, batch 1, one thread;
per prompt plain `generate` once, then the chain and "auto" with and without the prior, in an order that alternates
between prompts. Prints, per set and setting, tokens per second against plain and the acceptance length.
"""

import copy
import sys
import time
from collections import defaultdict

import torch
from transformers import AutoModel

import hf_dflash  # noqa: F401  (registers the drafter with AutoModel)
from hf_dflash.bench import chat_inputs, load_prompt_set
from hf_dflash.packaged import load_packaged

torch.set_num_threads(1)
folder, dtype, per_set = sys.argv[1], getattr(torch, sys.argv[2]), int(sys.argv[3])
target, tok = load_packaged(dtype=dtype)
with_prior = AutoModel.from_pretrained(folder, dtype=torch.bfloat16).eval()
assert with_prior.bigram_prior is not None, f"{folder} holds no bigram prior (hf-dflash bigram-prior)"
without = copy.deepcopy(with_prior)
without.set_bigram_prior(None, None)
drafters = {"prior": with_prior, "drafter": without}
variants = [(size, kind) for size in (0, "auto") for kind in drafters]
seconds, tokens, accepted = defaultdict(float), defaultdict(int), defaultdict(list)
for name in ("gsm8k", "mbpp", "alpaca", "humaneval", "mtbench"):
    prompts = load_prompt_set(name, per_set + (name == "gsm8k"))
    for i, prompt in enumerate(prompts):
        inputs = chat_inputs(tok, prompt.messages)
        runs = [("plain", None)] + (variants if i % 2 else variants[::-1])
        for size, kind in runs:
            extra = {} if kind is None else {"assistant_model": drafters[kind], "draft_tree_size": size,
                                             "return_dict_in_generate": True}
            began = time.perf_counter()
            out = target.generate(**inputs, max_new_tokens=128, do_sample=False, **extra)
            elapsed = time.perf_counter() - began
            if name == "gsm8k" and i == 0:
                continue  # the warm-up prompt (it also measures "auto"'s forward costs)
            sequences = out if kind is None else out.sequences
            key = (name, size, kind)
            seconds[key] += elapsed
            tokens[key] += sequences.shape[1] - inputs["input_ids"].shape[1]
            if kind is not None:
                accepted[key] += out.acceptance_lengths[0]

print(f"{dtype}, {per_set} prompts per set, 128 new tokens, one thread; tokens/s over plain (acceptance length)")
print("| set | " + " | ".join(f"{'chain' if size == 0 else size}, {kind}" for size, kind in variants) + " |")
print("|---" * (len(variants) + 1) + "|")
for name in ("gsm8k", "mbpp", "alpaca", "humaneval", "mtbench"):
    plain = tokens[name, "plain", None] / seconds[name, "plain", None]
    cells = []
    for size, kind in variants:
        key = (name, size, kind)
        cells.append(f"{tokens[key] / seconds[key] / plain:.2f}x ({sum(accepted[key]) / len(accepted[key]):.2f})")
    print(f"| {name} | " + " | ".join(cells) + " |")
