"""DFlash drafter model code. Self-contained (torch + transformers only): these files are also the Hub remote code."""

from .configuration_dflash import DFlashConfig, default_target_layer_ids
from .modeling_dflash import DFlashDraftModel

__all__ = ["DFlashConfig", "DFlashDraftModel", "default_target_layer_ids"]
