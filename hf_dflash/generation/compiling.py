"""Compiling the fixed-shape path's forwards where, and as, transformers compiles plain decoding."""

import types

import torch
from transformers.generation import CompileConfig
from transformers.utils import logging

logger = logging.get_logger(__name__)


def compile_everywhere(device=None, **settings) -> CompileConfig:
    """A `CompileConfig` that compiles decoding on any device, a CPU too: `generate(..., compile_config=...)` then
    compiles plain decoding with a static cache and DFlash's fixed-shape path (`cache_implementation="static"`) where
    transformers' default config compiles on accelerators only. transformers' defaults otherwise, with the mode for
    `device` (default: CUDA if present, else the CPU): CUDA graphs ("reduce-overhead") on a GPU, inductor's default
    on a CPU, where CUDA graphs have no part. `settings`: any other `CompileConfig` field (`backend`, `fullgraph`...).
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    settings.setdefault("mode", "default" if torch.device(device).type == "cpu" else "reduce-overhead")
    config = CompileConfig(**settings)
    config._compile_all_devices = True  # transformers' own switch for compiling on any device, kept in this one place
    return config


def compile_config_for(target, cache, generation_config) -> CompileConfig | None:
    """The fixed-shape path's compile settings: where transformers would compile plain decoding with `cache` (its
    `compile_config`, `disable_compile` and device rules), else None, said once unless `disable_compile` asked."""
    if target._valid_auto_compile_criteria({"cache": cache}, generation_config):
        return generation_config.compile_config or CompileConfig()
    if not generation_config.disable_compile:
        logger.warning_once(
            f"cache_implementation='static' runs DFlash's fixed-shape path uncompiled on {target.device.type} "
            "(transformers compiles decoding on accelerators only), which is slower than without a static cache. "
            "Pass compile_config=hf_dflash.compile_everywhere() to compile it on any device, or leave out "
            "cache_implementation='static'."
        )
    return None


def compiled_call(model, compile_config: CompileConfig | None, key=None):
    """`model`'s call compiled with `compile_config` (kept on the model across calls), or as it is with None. Each
    `key` compiles apart, in a function of its own: torch keeps at most 8 graphs per function (`recompile_limit`)
    before it runs the rest eagerly, transformers' own compiled decoding fills `model.__call__`'s, and the fixed-shape
    path gives each verification width its own (a graph dynamic in the width was slower: docs/design.md)."""
    if compile_config is None:
        return model.__call__
    settings = compile_config.to_dict()
    kept = model.__dict__.setdefault("_hf_dflash_compiled", {})
    if key not in kept or kept[key][0] != settings:
        kept[key] = (settings, torch.compile(_own_function(model, key), **settings))
    return kept[key][1]


def _own_function(model, key):
    """`model(...)` behind a function whose code object is its own: torch keys compiled graphs by code object."""
    def call(*args, **kwargs):
        return model(*args, **kwargs)

    code = call.__code__.replace(co_name=f"hf_dflash_call_{key}")
    return types.FunctionType(code, call.__globals__, code.co_name, call.__defaults__, call.__closure__)


def compiled_function(owner, function, compile_config: CompileConfig | None):
    """One of the fixed-shape path's own functions compiled with `compile_config`, kept on `owner` (the target) as
    `compiled_call` keeps a model's call, or `function` itself with None."""
    if compile_config is None:
        return function
    settings = compile_config.to_dict()
    kept = owner.__dict__.setdefault("_hf_dflash_compiled", {})
    if function not in kept or kept[function][0] != settings:
        kept[function] = (settings, torch.compile(function, **settings))
    return kept[function][1]
