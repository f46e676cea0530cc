"""hf-dflash: DFlash block-diffusion speculative decoding as a drop-in transformers extension.

    import hf_dflash
    drafter = AutoModel.from_pretrained("z-lab/Qwen3-8B-DFlash-b16")  # DFlash and DFlash2 drafters alike
    target.generate(**inputs, assistant_model=drafter)

Importing the package registers the drafter with `AutoModel` and installs the `generate` hook
(`hf_dflash.generation.hooks`); both act only on DFlash drafters.
"""

from . import hub  # noqa: F401 (it gives save_pretrained its model card writer)
from .generation import DFlashGenerateOutput, check_compatible, dflash_decode, generate
from .generation.compiling import compile_everywhere
from .generation.hooks import install_hooks, uninstall_hooks
from .modeling import DFlash2Config, DFlash2DraftModel, DFlashConfig, DFlashDraftModel, default_target_layer_ids

__version__ = "0.1.0"

install_hooks()

__all__ = [
    "DFlash2Config",
    "DFlash2DraftModel",
    "DFlashConfig",
    "DFlashDraftModel",
    "DFlashGenerateOutput",
    "check_compatible",
    "compile_everywhere",
    "default_target_layer_ids",
    "dflash_decode",
    "generate",
    "install_hooks",
    "uninstall_hooks",
]
