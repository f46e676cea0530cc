"""The two hooks that make DFlash drafters drop-in: `generate(assistant_model=drafter)` and `AutoModel`.

Each hook wraps one transformers entry point, acts only when a DFlash drafter is involved, and otherwise calls the
original unchanged. `install_hooks()` runs on `import hf_dflash` and is idempotent; `uninstall_hooks()` restores
transformers exactly.

- `GenerationMixin.generate`: with `assistant_model=<DFlashDraftModel>` (or a DFlash2 one, or transformers' own
  `muse_glimmer_assistant` drafter, seen through `hf_dflash.native`) and no `speculation_type` (which selects
  transformers' native DFlash path), the call goes to `hf_dflash.generate` (`generation.loop`); a drafter's checkpoint
  loaded as another class (`AutoModelForCausalLM`, `trust_remote_code=True`) is refused with how to load it.
- `AutoModel.from_pretrained`: z-lab checkpoints say `model_type: "qwen3"` (so vLLM / SGLang read them), which
  transformers maps to `Qwen3Model`; a checkpoint whose config names `DFlashDraftModel` or `DFlash2DraftModel` (or
  carries a `dflash_config` block) loads as `hf_dflash.DFlashDraftModel` / `DFlash2DraftModel` instead, unless
  `trust_remote_code=True` asks for the repository's own code.
"""

import functools

from transformers import AutoModel, GenerationMixin, PretrainedConfig

from ..modeling import DFlash2Config, DFlash2DraftModel, DFlashConfig, DFlashDraftModel
from ..native import is_native_drafter
from .loop import generate, original_generate, unhooked

_original_auto_from_pretrained = unhooked(AutoModel.from_pretrained.__func__)
_HUB_KWARGS = ("cache_dir", "force_download", "proxies", "token", "revision", "local_files_only", "subfolder")


@functools.wraps(original_generate)
def _generate(self, *args, assistant_model=None, **kwargs):
    config = kwargs.get("generation_config") or self.generation_config
    native = kwargs.get("speculation_type") or getattr(config, "speculation_type", None)
    if (isinstance(assistant_model, DFlashDraftModel) or is_native_drafter(assistant_model)) and not native:
        return generate(self, assistant_model, *args, **kwargs)
    if assistant_model is not None and not native and is_dflash_checkpoint(getattr(assistant_model, "config", None)):
        # AutoModelForCausalLM on a drafter folder gives a Qwen3 model without the drafter's weights, which would run
        # as a (useless) ordinary assistant; trust_remote_code=True gives the repository's class, not hf_dflash's
        raise ValueError(
            f"assistant_model is a DFlash drafter's checkpoint loaded as {type(assistant_model).__name__} (by "
            "AutoModelForCausalLM, or with trust_remote_code=True): load it with AutoModel.from_pretrained(...) "
            "after `import hf_dflash`, without trust_remote_code, or with hf_dflash.DFlashDraftModel.from_pretrained "
            "(or pass speculation_type='dflash' for transformers' own DFlash path)."
        )
    return original_generate(self, *args, assistant_model=assistant_model, **kwargs)


@functools.wraps(_original_auto_from_pretrained)
def _auto_from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
    hub_kwargs = {k: kwargs[k] for k in _HUB_KWARGS if k in kwargs}
    if cls is AutoModel and not kwargs.get("trust_remote_code") and is_dflash_checkpoint(
        kwargs.get("config"), pretrained_model_name_or_path, **hub_kwargs
    ):
        config = kwargs.get("config")
        if not isinstance(config, DFlashConfig):
            kwargs.pop("config", None)
            config, _ = PretrainedConfig.get_config_dict(pretrained_model_name_or_path, **hub_kwargs)
        return drafter_class(config).from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
    return _original_auto_from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs)


_generate._hf_dflash_hook = _auto_from_pretrained._hf_dflash_hook = True


def is_dflash_checkpoint(config, pretrained_model_name_or_path=None, **hub_kwargs) -> bool:
    """Whether a config (object, or the one at a path / Hub id) describes a DFlash drafter."""
    if isinstance(config, PretrainedConfig):
        config = config.to_dict()
    elif pretrained_model_name_or_path is not None:
        try:
            config, _ = PretrainedConfig.get_config_dict(pretrained_model_name_or_path, **hub_kwargs)
        except (OSError, ValueError):
            return False  # let AutoModel raise its own error
    if not isinstance(config, dict):
        return False
    architectures = config.get("architectures") or []
    return bool({"DFlashDraftModel", "DFlash2DraftModel"} & set(architectures)) or "dflash_config" in config


def drafter_class(config) -> type:
    """`DFlash2DraftModel` for a config (object or dict) that names it or carries its selector, else
    `DFlashDraftModel`."""
    if isinstance(config, PretrainedConfig):
        config = config.to_dict()
    block = config.get("dflash_config") or {}
    dflash2 = "DFlash2DraftModel" in (config.get("architectures") or []) or "selector_top_k" in block
    return DFlash2DraftModel if dflash2 else DFlashDraftModel


def install_hooks() -> None:
    """Register the drafters with `AutoModel` and hook `generate` / `AutoModel.from_pretrained`. Idempotent."""
    AutoModel.register(DFlashConfig, DFlashDraftModel, exist_ok=True)
    AutoModel.register(DFlash2Config, DFlash2DraftModel, exist_ok=True)
    GenerationMixin.generate = _generate
    AutoModel.from_pretrained = classmethod(_auto_from_pretrained)


def uninstall_hooks() -> None:
    """Restore transformers' own `generate` and `AutoModel.from_pretrained`."""
    GenerationMixin.generate = original_generate
    AutoModel.from_pretrained = classmethod(_original_auto_from_pretrained)


__all__ = ["install_hooks", "is_dflash_checkpoint", "original_generate", "uninstall_hooks"]
