"""DFlash decoding inside `generate`: the loop (`loop`), its drafter side (`proposer`) and target side (`decoder`),
the target's KV cache across verifications (`kv_cache`), draft trees (`tree`), and `draft_tree_size="auto"`
(`auto_size`, reading the forward costs that `forward_costs` measures). `hooks` makes `generate(assistant_model=...)`
and `AutoModel` reach them."""

from .decoder import Decoder, DFlashGenerateOutput
from .loop import dflash_decode, generate, speculative_loop
from .proposer import DFlashProposer, check_compatible

__all__ = [
    "DFlashGenerateOutput",
    "DFlashProposer",
    "Decoder",
    "check_compatible",
    "dflash_decode",
    "generate",
    "speculative_loop",
]
