"""Plain `generate` and DFlash with the target's attention as SDPA (transformers' default) and as eager, side by side.

    OMP_NUM_THREADS=1 python examples/drafters/attention_baseline_ab.py bfloat16 4   # DTYPE, prompts per set

Why: on a CPU, SDPA's kernel for one query without a mask is slow in bfloat16 (`cpu_ops_micro.py one-token-mask`:
56 against 49 ms at batch 1 here), and plain `generate` at batch 1 takes that path at every step. So part of a
bfloat16 speedup over plain `generate` can come from the baseline. This measures plain with both implementations,
and DFlash ("auto", the shipped drafter) with both, so the speedup over the faster plain is known.

The first prompts of GSM8K (plus one untimed warm-up prompt) and MT-Bench, 128 new tokens, greedy, one thread; per
prompt each variant once, in an order that alternates between prompts. Prints seconds, tokens per second and the
speedups over each plain.
"""

import sys
import time

import torch
from transformers import AutoModel

import hf_dflash  # noqa: F401  (registers the drafter with AutoModel)
from hf_dflash.bench import chat_inputs, load_prompt_set
from hf_dflash.packaged import load_packaged

torch.set_num_threads(1)
dtype, per_set = getattr(torch, sys.argv[1]), int(sys.argv[2])
target, tok = load_packaged(dtype=dtype)
drafter = AutoModel.from_pretrained("examples/drafters/smollm2-135m-instruct-dflash", dtype=torch.bfloat16).eval()


def run(attention: str, dflash: bool):
    def call(inputs):
        target.set_attn_implementation(attention)
        extra = {"assistant_model": drafter, "draft_tree_size": "auto"} if dflash else {}
        return target.generate(**inputs, max_new_tokens=128, do_sample=False, **extra)

    return call


variants = {f"{'dflash' if d else 'plain'} {a}": run(a, d) for a in ("sdpa", "eager") for d in (False, True)}
seconds, tokens = dict.fromkeys(variants, 0.0), dict.fromkeys(variants, 0)
for name in ("gsm8k", "mtbench"):
    prompts = load_prompt_set(name, per_set + (name == "gsm8k"))
    for i, prompt in enumerate(prompts):
        inputs = chat_inputs(tok, prompt.messages)
        order = list(variants) if i % 2 else list(variants)[::-1]
        for variant in order:
            began = time.perf_counter()
            out = variants[variant](inputs)
            elapsed = time.perf_counter() - began
            if name == "gsm8k" and i == 0:
                continue  # the warm-up prompt (it also measures "auto"'s forward costs, once per attention)
            seconds[variant] += elapsed
            tokens[variant] += out.shape[1] - inputs["input_ids"].shape[1]

print(f"{dtype}, {per_set} GSM8K + {per_set} MT-Bench prompts, 128 new tokens, one thread")
for variant in variants:
    print(f"{variant:13s} {seconds[variant]:7.1f} s  {tokens[variant] / seconds[variant]:6.1f} tokens/s")
for plain in ("plain sdpa", "plain eager"):
    for dflash in ("dflash sdpa", "dflash eager"):
        print(f"{dflash} over {plain}: {seconds[plain] / seconds[dflash]:.2f}x in time, "
              f"{tokens[dflash] / seconds[dflash] / (tokens[plain] / seconds[plain]):.2f}x in tokens/s")
