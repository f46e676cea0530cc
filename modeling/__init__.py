"""DFlash drafter model code. Self-contained (torch + transformers only): these files are also the Hub remote code."""

from .configuration_dflash import DFlash2Config, DFlashConfig, default_target_layer_ids
from .modeling_dflash import DFlashDraftModel
from .modeling_dflash2 import DFlash2DraftModel

__all__ = ["DFlash2Config", "DFlash2DraftModel", "DFlashConfig", "DFlashDraftModel", "default_target_layer_ids"]
