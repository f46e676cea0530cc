"""Plain `generate` and DFlash at their best: a static cache of a bucketed length, compiled as transformers compiles
plain decoding, the first call of each shape untimed (it compiles). `benchmark`'s "static" baseline and fixed-shape
runs, and `hf-dflash demo --compile`'s timers."""

import functools

import torch

from transformers import CompileConfig
from transformers.cache_utils import StaticCache

from ..generation.kv_cache import CAPACITY_STEP, cache_capacity
from .timing import timed

# plain `generate` at its best: a static cache of a length rounded up to this step (one compiled graph per step of
# lengths, not per prompt), compiled where transformers compiles it; the fixed-shape path's step, so that both sides
# of a comparison read caches of the same length
STATIC_CACHE_STEP = CAPACITY_STEP


def static_cache_length(prompt_len: int, max_new_tokens: int) -> int:
    """The "static" baseline's cache length: what the call needs, rounded up to `STATIC_CACHE_STEP` (a compiled
    forward is reused across prompts of similar lengths instead of recompiling for each)."""
    return -(-(prompt_len + max_new_tokens) // STATIC_CACHE_STEP) * STATIC_CACHE_STEP


def compile_everywhere(device) -> CompileConfig:
    """The `CompileConfig` of plain `generate` and DFlash at their best (`hf-dflash bench --compile`, `hf-dflash demo
    --compile`): transformers' defaults, compiled on any `device`, a CPU too, where CUDA graphs have no part."""
    config = CompileConfig(mode="default" if torch.device(device).type == "cpu" else "reduce-overhead")
    config._compile_all_devices = True  # transformers' own switch for compiling on any device
    return config


def plain_static_timer(target, max_new_tokens: int, compile_config=None):
    """A timer of plain greedy `generate` at its best (`hf-dflash demo --compile`): a static cache of
    `static_cache_length`, compiled (`compile_config`, by default `compile_everywhere`'s); a new cache length
    compiles once, untimed. Returns f(inputs, plain) -> (seconds, whether the tokens equal `plain`'s)."""
    config = compile_config or compile_everywhere(target.device)
    compiled = set()

    def run(inputs, plain):
        length = static_cache_length(inputs["input_ids"].shape[1], max_new_tokens)
        call = functools.partial(target.generate, **inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                 compile_config=config)
        if length not in compiled:
            compiled.add(length)
            call(cache=StaticCache(config=target.config, max_cache_len=length))
        out, seconds = timed(lambda: call(cache=StaticCache(config=target.config, max_cache_len=length)))
        return seconds, torch.equal(out, plain)

    return run


def dflash_static_timer(target, drafter, max_new_tokens: int, compile_config=None):
    """A timer of greedy DFlash at its best (`hf-dflash demo --compile`): the fixed-shape path (a static cache),
    compiled as `plain_static_timer` compiles plain `generate`; a call of a new shape runs once first, untimed (it
    compiles every verification width). Returns f(inputs) -> (seconds, `DFlashGenerateOutput`)."""
    config = compile_config or compile_everywhere(target.device)
    compiled = set()

    def run(inputs):
        batch, prompt_len = inputs["input_ids"].shape
        shape = (batch, cache_capacity(prompt_len + max_new_tokens))
        call = functools.partial(target.generate, **inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                 assistant_model=drafter, cache_implementation="static", compile_config=config,
                                 return_dict_in_generate=True)
        if shape not in compiled:
            compiled.add(shape)
            call()
        out, seconds = timed(call)
        return seconds, out

    return run
