"""The target's KV cache across verifications: keep each row's accepted slots, drop the rejected ones.

Rows accept different numbers of drafts per step. When every layer is full attention read through an explicit mask
(eager, sdpa), a row's rejected slots may stay in the cache as masked holes, like padding (`holes_allowed`);
otherwise (a sliding window counts slots, so a hole would shorten it) they are moved to the row's left end, so the
row stays left-padded (`keep_verified`). Either way any decoder-only model sees exactly the tokens it would see in
plain `generate`. A verified tree's accepted path is first moved to the front of its block (`gather_path`). A hybrid
target's linear-attention layers hold states, not slots: `linear_attention.keep_states` rolls them back, and these
functions act on the layers' keys and values alone.

The fixed-shape path (`hf_dflash.generation.fixed_shape`) keeps preallocated caches instead (`row_cache`): each row
writes at its own slots and a rejected slot is simply written over by the next step, so nothing is cropped, moved or
concatenated and every step has the same shapes.
"""

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, DynamicSlidingWindowLayer, StaticLayer
from transformers.utils import logging

from .linear_attention import RowLinearLayer, attention_layers, attention_part, crop_attention
from .tree import takes_explicit_masks

logger = logging.get_logger(__name__)


def holes_allowed(target, cache) -> bool:
    """Whether rejected slots may stay in the cache as masked holes: every layer full attention (a sliding window
    counts slots, so a hole would shorten it) through an explicit dense mask (eager, sdpa: a hole is a masked key
    like a padding one). Moving them to the left end instead copies every row that kept less, every layer, every
    step (docs/design.md)."""
    return takes_explicit_masks(target) and all(attention_part(layer) is DynamicLayer
                                                 for layer in attention_layers(cache))


def gather_path(cache, path: torch.LongTensor, block_len: int) -> None:
    """Move each row's path slots `path` [rows, L] (slots of the last `block_len` cache entries, root first) to the
    front of that block, in path order, in every cache layer. Entries of `path` past a row's accepted length are
    ignored by the caller (`keep_verified` drops them), so any slot may fill them."""
    rows, length = path.shape
    if torch.equal(path, torch.arange(length, device=path.device).expand(rows, -1)):
        return  # already in place (a chain, or a tree whose accepted path is its first slots)
    for layer in attention_layers(cache):
        start = layer.keys.shape[-2] - block_len
        index = (start + path.to(layer.keys.device))[:, None, :, None]
        for name in ("keys", "values"):
            states = getattr(layer, name)  # [rows, heads, slots, head_dim]
            moved = states.gather(2, index.expand(-1, states.shape[1], -1, states.shape[-1]))
            states[:, :, start : start + length] = moved


def keep_verified(cache, valid: torch.BoolTensor, keep: torch.BoolTensor, shift: bool = True) -> torch.BoolTensor:
    """Drop the rejected verified slots from the target cache and return the new slot mask `[rows, slots]`.

    `valid` [rows, S] marks real slots before the verified block, `keep` [rows, V] the block slots to keep (a
    prefix per row). Slots past the longest kept prefix are cropped; when rows kept different lengths, each row's
    rejected slots are moved to its left end so every row stays left-padded (`shift`), or stay where they are,
    masked, where every layer reads its keys through the mask alone (`holes_allowed`).
    """
    verify_len = keep.shape[1]
    longest = int(keep.sum(-1).max())
    kept = keep[:, :longest]
    if not shift or kept.all():
        crop_attention(cache, longest - verify_len)
        return torch.cat([valid, kept], dim=1)
    slots = torch.cat([valid, kept], dim=1)  # [rows, S + longest]
    shifts = [(i, r) for i, r in enumerate((longest - keep.sum(-1)).tolist()) if r]  # row i moves right by r
    for layer in attention_layers(cache):
        # A sliding layer stores only its window of the S old slots: shift inside what it stores. The `r` slots it
        # frees at the left are masked, and the window trim below removes them again.
        tail = layer.keys.shape[-2] - verify_len + longest
        layer.keys, layer.values = layer.keys[..., :tail, :], layer.values[..., :tail, :]
        for i, r in shifts:  # in place, row by row: a gather over the whole cache is much slower on a CPU
            layer.keys[i, :, r:] = layer.keys[i, :, :-r].clone()
            layer.values[i, :, r:] = layer.values[i, :, :-r].clone()
        if isinstance(layer, DynamicSlidingWindowLayer):
            layer.cumulative_length = slots.shape[1]
            if tail >= layer.sliding_window:
                layer.keys = layer.keys[..., -layer.sliding_window + 1 :, :]
                layer.values = layer.values[..., -layer.sliding_window + 1 :, :]
    # each row's mask moves as its slots did: right by what it rejected (a masked slot inside a prompt stays masked)
    moved = torch.arange(slots.shape[1], device=slots.device) - (longest - keep.sum(-1))[:, None]
    return slots.gather(1, moved.clamp(min=0)) & (moved >= 0)


def warn_unused_cache(cache) -> None:
    """The loop keeps its own dynamic target cache: it drops rejected draft slots, and the drafter needs the target's
    features at every prompt position, which a cache of past keys/values does not hold. Say so when `generate` was
    given a cache (`cache` / `past_key_values`, `cache_implementation`) that it therefore neither reads nor extends;
    the output is the same, only prompt reuse is lost."""
    if cache is None:
        return
    if cache.get_seq_length() > 0:
        logger.warning_once(
            f"DFlash generation does not read or extend the given cache ({cache.get_seq_length()} cached tokens): "
            "the drafter needs the target's features at every prompt position, so the whole prompt is prefilled "
            "again. The output is unchanged; pass no cache (past_key_values) to skip this warning."
        )
    elif type(cache) is not DynamicCache or getattr(cache, "offloading", False):
        name = "an offloaded DynamicCache" if type(cache) is DynamicCache else type(cache).__name__
        logger.warning_once(
            f"DFlash generation uses its own DynamicCache, not {name} (cache_implementation, cache): its "
            "verification drops rejected draft slots. The output is unchanged."
        )


class RowCacheLayer(StaticLayer):
    """A `StaticLayer` whose rows write at slots of their own: `write_index` [rows, W] names the slots of the first W
    new keys / values of the next `update` (a fixed-shape step writes W = its block, wherever each row's accepted
    tokens ended). Keys past those W (a drafter's block, which is never kept) are returned after the stored ones
    without being stored. Sliding windows are left to the attention mask, counted in positions: every layer stores
    all `max_cache_len` slots."""

    def __init__(self, max_cache_len: int):
        super().__init__(max_cache_len)
        self.write_index = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        width = self.write_index.shape[1]
        write_index = self.write_index.to(self.keys.device)  # a target split over devices: each layer's own
        rows = torch.arange(len(write_index), device=write_index.device)[:, None]
        for stored, new in ((self.keys, key_states), (self.values, value_states)):
            # An index put, in place (the storage keeps its address): compiled, a `scatter_` into a graph's input
            # copied the whole cache every call (docs/design.md, "The fixed-shape path")
            stored.transpose(1, 2)[rows, write_index] = new[:, :, :width].transpose(1, 2)
        if key_states.shape[-2] == width:
            return self.keys, self.values
        return (torch.cat([self.keys, key_states[:, :, width:]], dim=2),
                torch.cat([self.values, value_states[:, :, width:]], dim=2))


def move_slots(states: list, source: torch.LongTensor, target: torch.LongTensor) -> None:
    """In each of `states` (a row cache's keys and values, [rows, heads, capacity, head_dim] each), copy each row's
    slots `source` [rows, n] to its slots `target` [rows, n], in place. The fixed-shape path compiles it into one
    call: eagerly it is two small operations per tensor, each a launch (docs/design.md, "A tree's path moved in one
    compiled call")."""
    rows = torch.arange(source.shape[0], device=source.device)[:, None]
    for stored in states:
        row, old, new = (t.to(stored.device) for t in (rows, source, target))  # a target split over devices
        slots = stored.transpose(1, 2)  # [rows, capacity, heads, head_dim]: a row's slot is one index
        slots[row, new] = slots[row, old]


CAPACITY_STEP = 256  # cache lengths are rounded up to a multiple: one compiled graph serves lengths that differ less


def step_span(block_size: int, tree_size: int) -> int:
    """The most slots a step writes from its root: the block, or a tree's root and nodes."""
    return max(block_size, 1 + tree_size if tree_size else 0)


def cache_capacity(max_length: int) -> int:
    """The slots of a call's caches: `max_length` and a spare one past it, which takes every write past it (a last
    step's tokens that `max_length` cuts: `FixedShapeDecoder.step_slots`), rounded up to `CAPACITY_STEP` so that
    calls of nearby lengths share one shape, hence one compiled graph. Not room for a whole block past `max_length`:
    every forward reads every slot, and that room took a second step where `max_length` was just under one."""
    return -(-(max_length + 1) // CAPACITY_STEP) * CAPACITY_STEP


def row_cache(owner: torch.nn.Module, num_layers: int, capacity: int, batch_size: int, span: int = 0) -> Cache:
    """A cache of `num_layers` `RowCacheLayer`s of `capacity` slots each (allocated at the first update) for `owner`'s
    forwards, kept on `owner` as transformers keeps a static cache (one per model; a call of another shape replaces
    it): every call of the same shape writes the same tensors, so CUDA graphs recorded over their addresses replay
    instead of recording again inside each `generate`. What an earlier call left in it is never read: a step's masks
    show each row only slots written in this call (the prompt's, then each step's from its root on). A hybrid
    target's "linear_attention" layers (`layer_types`) are `RowLinearLayer`s recording steps of up to `span` tokens,
    which each prefill starts afresh."""
    types = getattr(owner.config.get_text_config(), "layer_types", None) or [None] * num_layers
    linear = [kind == "linear_attention" for kind in types[:num_layers]]
    key = (num_layers, capacity, batch_size, owner.dtype, owner.device, span if any(linear) else None)
    kept = owner.__dict__.get("_hf_dflash_row_cache")
    if kept is None or kept[0] != key:
        layers = [RowLinearLayer(span) if is_linear else RowCacheLayer(capacity) for is_linear in linear]
        kept = owner.__dict__["_hf_dflash_row_cache"] = key, Cache(layers=layers)
    return kept[1]


def set_write_index(cache: Cache, write_index: torch.LongTensor) -> None:
    """The slots [rows, W] the next forward writes its first W keys to, in every layer of a `row_cache`."""
    for layer in cache.layers:
        layer.write_index = write_index
