"""Plain `generate` and DFlash at their best: static caches of one bucketed length (`kv_cache.cache_capacity`), compiled
as transformers compiles plain decoding, the first call of each shape untimed (it compiles). `benchmark`'s "static"
baseline and fixed-shape runs, and `hf-dflash demo --compile`'s timers."""

import functools

import torch
from transformers.cache_utils import StaticCache

from ..generation.compiling import compile_everywhere
from ..generation.kv_cache import cache_capacity
from .timing import timed


def plain_static_timer(target, max_new_tokens: int, compile_config=None):
    """A timer of plain greedy `generate` at its best (`hf-dflash demo --compile`): a static cache as long as the
    fixed-shape path's (`kv_cache.cache_capacity`: one length for both sides of a comparison), compiled
    (`compile_config`, by default `compile_everywhere`'s); a new cache length compiles once, untimed. Returns
    f(inputs, plain) -> (seconds, whether the tokens equal `plain`'s)."""
    config = compile_config or compile_everywhere(target.device)
    compiled = set()

    def run(inputs, plain):
        length = cache_capacity(inputs["input_ids"].shape[1] + max_new_tokens)
        call = functools.partial(target.generate, **inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                 compile_config=config)
        if length not in compiled:
            compiled.add(length)
            call(cache=StaticCache(config=target.config, max_cache_len=length))
        out, seconds = timed(lambda: call(cache=StaticCache(config=target.config, max_cache_len=length)), target.device)
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
        out, seconds = timed(call, target.device)
        return seconds, out

    return run
