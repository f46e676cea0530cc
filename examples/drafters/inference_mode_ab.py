"""The decoding loop in inference mode (as shipped) against the same loop under `generate`'s no_grad, side by side.

    OMP_NUM_THREADS=1 python examples/drafters/inference_mode_ab.py bfloat16 4   # DTYPE, prompts per set

The shipped drafter with its "auto" trees, the first prompts of GSM8K (plus one untimed warm-up prompt) and MT-Bench,
128 new tokens, one thread; per prompt plain `generate` and both variants in alternating order. Prints the seconds of
each, the speedups over plain and how many outputs the two variants share (bfloat16 trees sized from timings can round
a near-tie differently).
"""

import contextlib
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
inference_mode = torch.inference_mode


@contextlib.contextmanager
def without_inference_mode():
    """The loop's `torch.inference_mode()` made a no-op: the loop then runs under `generate`'s no_grad."""
    torch.inference_mode = lambda *args, **kwargs: contextlib.nullcontext()
    try:
        yield
    finally:
        torch.inference_mode = inference_mode


variants = {
    "plain": lambda inputs: target.generate(**inputs, max_new_tokens=128, do_sample=False),
    "inference_mode": lambda inputs: target.generate(**inputs, max_new_tokens=128, do_sample=False,
                                                     assistant_model=drafter),
}


def no_grad_loop(inputs):
    with without_inference_mode():
        return variants["inference_mode"](inputs)


variants["no_grad"] = no_grad_loop
seconds, same, count = dict.fromkeys(variants, 0.0), 0, 0
for name in ("gsm8k", "mtbench"):
    prompts = load_prompt_set(name, per_set + (name == "gsm8k"))
    for i, prompt in enumerate(prompts):
        inputs = chat_inputs(tok, prompt.messages)
        outputs = {}
        for variant in list(variants) if i % 2 else list(variants)[::-1]:
            began = time.perf_counter()
            outputs[variant] = variants[variant](inputs)
            if name != "gsm8k" or i > 0:  # the first GSM8K prompt warms up (and measures "auto"'s forward costs)
                seconds[variant] += time.perf_counter() - began
        if name != "gsm8k" or i > 0:
            same += torch.equal(outputs["inference_mode"], outputs["no_grad"])
            count += 1
print(f"{dtype}, {per_set} prompts per set: seconds", {k: round(v, 2) for k, v in seconds.items()})
ratio = {name: seconds["plain"] / seconds[name] for name in ("inference_mode", "no_grad")}
print(f"speedup over plain: inference mode {ratio['inference_mode']:.3f}x, no_grad {ratio['no_grad']:.3f}x "
      f"(inference mode / no_grad {ratio['inference_mode'] / ratio['no_grad']:.3f}x); identical outputs {same} of "
      f"{count}")
