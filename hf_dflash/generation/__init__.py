"""DFlash decoding inside `generate`: the loop (`loop`), its drafter side (`proposer`) and target side (`decoder`),
the target's KV cache across verifications (`kv_cache`), draft trees (`tree`), and `draft_tree_size="auto"`
(`auto_size`, reading the forward costs that `forward_costs` measures). `hooks` makes `generate(assistant_model=...)`
and `AutoModel` reach them."""

from .decoder import Decoder, DFlashGenerateOutput
from .loop import DFlashCall, dflash_decode, generate, speculative_loop
from .proposer import Context, DFlashProposer, DraftSettings, check_compatible

__all__ = [
    "Context",
    "DFlashCall",
    "DFlashGenerateOutput",
    "DFlashProposer",
    "Decoder",
    "DraftSettings",
    "check_compatible",
    "dflash_decode",
    "generate",
    "speculative_loop",
]
