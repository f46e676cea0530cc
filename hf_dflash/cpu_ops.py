"""Small operations of every decoding step, made cheaper on a CPU without changing a bit of their results.

- `argmax`: the verification's greedy choice over a block's logits. torch's `max(-1)` over a block of bfloat16
  logits cost more than anything else in the loop but the two forwards; a first pass of `amax` over chunks
  (vectorized) and a `max` inside the one chunk holding the maximum take less time, with the same first index of
  the maximum (docs/design.md, "CPU operations").
- `PackedLinear`: `F.linear` with bfloat16 weights hands oneDNN a row-major weight, which it reorders into its
  blocked layout on every call; for the few rows a drafter multiplies per step that reorder is a large share of
  the call. `packed_linears(drafter)` makes its linears multiply with a copy packed once
  (`torch.ops.mkldnn._reorder_linear_weight`, as torch.compile's CPU freezing does), with bitwise the same output
  (the same kernel, the same order of additions) in less time, most of all with its weights out of cache, as after
  the target's forward every step (docs/design.md). The draft head (the drafter's gathered copy of the target's
  head rows, `DFlashDraftModel.draft_head`) is packed too. The user's drafter gets its classes back when the call
  ends; the packed copies are kept (`PACKED`, weakly by layer) for the next call.
"""

import contextlib
import functools
import weakref

import torch
from torch import nn
from torch.nn import functional as F

from .modeling.modeling_dflash import same_states, tensor_states

# layer -> (the weight's state when packed, the packed copy): kept beside the layer, never in it
PACKED: "weakref.WeakKeyDictionary[nn.Linear, tuple]" = weakref.WeakKeyDictionary()
CHUNK = 512  # the fastest chunk width for a block of rows of a large vocabulary (docs/design.md)


def argmax(scores: torch.Tensor) -> torch.LongTensor:
    """The first index of the maximum along the last dimension, as `torch.argmax` (NaN counts as the maximum)."""
    vocab = scores.shape[-1]
    if scores.device.type != "cpu" or vocab < 4 * CHUNK:
        return scores.max(-1).indices  # `max` gives the first maximum too (small vocabularies, accelerators)
    whole = vocab // CHUNK
    maxima = scores[..., : whole * CHUNK].unflatten(-1, (whole, CHUNK)).amax(-1)  # [..., whole]
    if whole * CHUNK < vocab:
        maxima = torch.cat([maxima, scores[..., whole * CHUNK :].amax(-1, keepdim=True)], dim=-1)
    chunk = maxima.max(-1, keepdim=True).indices  # [..., 1]: the first chunk holding the maximum
    # the last chunk may be shorter: clamping repeats its last column, after the first maximum if that is there
    index = (chunk * CHUNK + torch.arange(CHUNK, device=scores.device)).clamp(max=vocab - 1)
    return scores.gather(-1, index).max(-1).indices + chunk.squeeze(-1) * CHUNK


@functools.cache
def packing_available() -> bool:
    """Whether this torch build can prepack bfloat16 linear weights for the CPU (oneDNN with bfloat16 support)."""
    try:
        return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    except (AttributeError, RuntimeError):
        return False


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """A bfloat16 linear weight [out, in] reordered once into oneDNN's blocked layout (as inductor's CPU freezing
    does). `packed_linear` multiplies with it."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 16)


def packed_linear(input: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear(input, weight, bias)` with `packed = pack_weight(weight)`: the same kernel, bitwise the same output."""
    return torch.ops.mkldnn._linear_pointwise(input, packed, bias, "none", [], "")


class PackedLinear(nn.Linear):
    """`nn.Linear` that, in eager CPU inference with bfloat16 input and weight and no gradient, multiplies with a oneDNN
    prepacked copy of its weight, repacked when the weight changes (another tensor, or an in-place write such as an
    optimizer step); anywhere else it is `nn.Linear`. The copy is not part of the state dict. A weight made under
    `torch.inference_mode()` counts no in-place writes, so it is never packed: such a layer is `nn.Linear`."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if (
            torch.compiler.is_compiling()  # compiled (the fixed-shape path): inductor packs weights its own way
            or torch.is_grad_enabled()
            or weight.device.type != "cpu"
            or input.device.type != "cpu"
            or weight.dtype != torch.bfloat16
            or input.dtype != torch.bfloat16
            or weight.is_inference()
        ):
            return F.linear(input, weight, self.bias)
        # the same staleness test as the drafter's gathered head: the same weight object at the same `_version`
        state = (weight.dtype, *tensor_states(weight))
        packed = PACKED.get(self)
        if packed is None or not same_states(packed[0], state):
            packed = PACKED[self] = state, pack_weight(weight)
        return packed_linear(input, packed[1], self.bias)


def available_memory() -> int:
    """Bytes of memory the system can still give (Linux's MemAvailable; 0 where it cannot say)."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return 0


def pack_linears(module: nn.Module) -> nn.Module:
    """Make every plain `nn.Linear` in `module` a `PackedLinear`, in place (idempotent; nothing without oneDNN
    bfloat16 support): for modules of hf-dflash's own, as the drafter's gathered head."""
    if packing_available():
        for child in module.modules():
            if type(child) is nn.Linear:
                child.__class__ = PackedLinear
    return module


@contextlib.contextmanager
def packed_linears(module: nn.Module, memory_bound: bool = False):
    """Inside: `module`'s plain `nn.Linear`s on the CPU are `PackedLinear`s (where this torch can pack); on leaving
    they are `nn.Linear`s again, so a user's model keeps its classes. The generation loop runs in it with the drafter
    and the target; plain `generate` gains as much in it (`with packed_linears(model): model.generate(...)`).
    `memory_bound`: only where the packed copies, kept as large as the bfloat16 weights until the model is freed, fit
    twice in the memory the system has available (a large target on a CPU may not have room for a second copy)."""
    swapped = [child for child in module.modules() if type(child) is nn.Linear and child.weight.device.type == "cpu"]
    swapped = swapped if packing_available() else []
    if memory_bound and swapped:
        unpacked = [child.weight for child in swapped if child not in PACKED and child.weight.dtype == torch.bfloat16]
        if 2 * sum(w.numel() * w.element_size() for w in unpacked) > available_memory():
            swapped = []
    for child in swapped:
        child.__class__ = PackedLinear
    try:
        yield module
    finally:
        for child in swapped:
            child.__class__ = nn.Linear
