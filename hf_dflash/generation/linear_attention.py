"""Hybrid targets: linear-attention and state-space layers (Gated DeltaNet, Mamba, short convolutions) rolled back
to each row's accepted drafts.

Such a layer keeps no key per token, only a state: a convolution window of its last inputs and a recurrent state. A
verification runs the target over a block, and each row must go on from the state after its own last accepted token,
rows accepting different lengths. transformers' cache can record what that needs (`activate_past_recording`): the
convolution inputs of the whole block, and with `recurrent_states_to_keep` = the block's length, the recurrent state
after each of its tokens (the block's tokens run one by one after the chunked part; `record_block`). `keep_states`
then gives each row its own: the window ending at its last kept token, the state after it. transformers' own `crop`
rolls every row back by one amount, so it serves a batch only where all rows keep alike.

A recurrent layer reads a block in order: it cannot read a tree through an attention mask, so hybrid targets verify
chains (`hf_dflash.generation.proposer.draft_settings`; docs/design.md, "Hybrid targets"). The fixed-shape path keeps
the states in tensors written in place instead (`RowLinearLayer`, `keep_row_states`).
"""

import torch
from torch.nn import functional as F
from transformers.cache_utils import CacheLayerMixin, DynamicCache, LinearAttentionCacheLayerMixin, LinearAttentionLayer


def linear_layers(cache) -> list:
    """The cache's layers with linear-attention (or state-space) states, mixed layers included."""
    return [layer for layer in cache.layers if isinstance(layer, LinearAttentionCacheLayerMixin)]


def is_hybrid(target) -> bool:
    """Whether the target's cache, as `generate` would make it, has linear-attention or state-space layers."""
    return bool(linear_layers(DynamicCache(config=target.config)))


def new_cache(target) -> DynamicCache:
    """The loop's dynamic target cache: sliding-window layers keep what a rollback needs (their `crop`), linear ones
    record their states (`record_block` says how many per forward; none in a prefill)."""
    cache = DynamicCache(config=target.config)
    cache.activate_past_recording(recurrent_states_to_keep=0)
    for layer in linear_layers(cache):
        # one list per state: transformers' `dict.fromkeys(..., [])` shares one between a layer's states
        layer.recurrent_states_history = {i: [] for i in range(layer.number_of_states)}
    return cache


def record_block(cache, length: int) -> None:
    """The next forward reads `length` tokens: keep the recurrent state after each of them."""
    for layer in linear_layers(cache):
        layer.recurrent_states_to_keep = length


def keep_states(cache, block_len: int, kept: torch.LongTensor | None = None, model_type: str = "these") -> None:
    """After a forward over `block_len` new tokens (`record_block`): each row's linear-attention states as they were
    after its first `kept` [rows] tokens of the block (None: all of them, as after a prefill), and the recordings
    dropped. Every row's count of tokens goes back to the longest kept, as the attention layers' cache (`crop`).
    `model_type` names the target in the error raised where its layers recorded too few states."""
    layers = linear_layers(cache)
    if not layers:  # an attention-only target: nothing to read back
        return
    counts = None if kept is None else kept.tolist()  # the loop has read them already: no new sync
    for layer in layers:
        for i in range(layer.number_of_states):
            if layer.is_conv_states_initialized[i]:
                layer.conv_states[i] = _window(layer.conv_states[i], layer.conv_kernel_size[i], block_len, kept)
            history = layer.recurrent_states_history[i]
            if layer.is_recurrent_states_initialized[i] and kept is not None:
                if len(history) < block_len:
                    raise ValueError(
                        f"DFlash cannot serve {model_type} targets: a {type(layer).__name__} recorded "
                        f"{len(history)} recurrent states over a block of {block_len} tokens (its layers do not "
                        "honour the cache's `recurrent_states_to_keep`), so rejected drafts cannot be rolled back. "
                        "Generate without assistant_model."
                    )
                _keep_recurrent(layer.recurrent_states[i], history[-block_len:], counts)
            layer.recurrent_states_history[i] = []
        if kept is not None:
            layer.cumulative_length_linear.sub_(block_len - max(counts))


def _keep_recurrent(state: torch.Tensor, history: list, counts: list) -> None:
    """`state` [rows, ...] (after the whole block) := each row's state after its first `counts[row]` tokens,
    `history[k]` being the state after k (k < the block's length). Row by row: a state is large (Qwen3.5: 1-2 MB a
    layer in float32) and stacking the whole history to gather from it cost more than the forward saved."""
    if len(set(counts)) == 1:
        if counts[0] < len(history):
            state.copy_(history[counts[0]])
        return
    for row, count in enumerate(counts):
        if count < len(history):
            state[row].copy_(history[count][row])


def _window(inputs: torch.Tensor, width: int, block_len: int, kept: torch.LongTensor | None) -> torch.Tensor:
    """The convolution window [rows, channels, width] of each row: the `width` inputs up to its last kept token of
    the block, from `inputs` [rows, channels, W] (the window before the block, then the block's `block_len` inputs);
    zeros before the first input, as the layer pads a short prompt."""
    if inputs.shape[-1] < width + block_len:
        inputs = F.pad(inputs, (width + block_len - inputs.shape[-1], 0))
    if kept is None:
        return inputs[..., -width:]
    ends = inputs.shape[-1] - block_len + kept.to(inputs.device)  # [rows]: one past each row's last kept input
    index = ends[:, None] - width + torch.arange(width, device=inputs.device)  # [rows, width]
    return inputs.gather(-1, index[:, None, :].expand(-1, inputs.shape[1], -1))


def attention_part(layer):
    """`layer`'s attention cache class (`DynamicLayer`, ...), whose methods act on its keys and values alone; None
    for a layer with no attention part (a linear-attention one, or a `DummyLayer` of a layer with no cache)."""
    if not isinstance(layer, LinearAttentionCacheLayerMixin):
        return type(layer) if isinstance(layer, CacheLayerMixin) else None
    return next((c for c in type(layer).__mro__ if issubclass(c, CacheLayerMixin)
                 and not issubclass(c, LinearAttentionCacheLayerMixin) and c is not CacheLayerMixin), None)


def attention_layers(cache) -> list:
    """The layers with keys and values (mixed linear / attention layers included)."""
    return [layer for layer in cache.layers if attention_part(layer) is not None]


def crop_attention(cache, tokens_to_remove: int) -> None:
    """`Cache.crop` of the attention layers' keys and values alone (the linear ones are `keep_states`'s)."""
    for layer in attention_layers(cache):
        attention_part(layer).crop(layer, tokens_to_remove)


def select_rows(cache, rows: torch.LongTensor) -> None:
    """`Cache.batch_select_indices` for every kind of layer: transformers' linear-attention layers have none."""
    for layer in cache.layers:
        part = attention_part(layer)
        if part is not None:
            part.batch_select_indices(layer, rows)
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            for i in range(layer.number_of_states):
                for states in (layer.conv_states, layer.recurrent_states):
                    if states[i] is not None:
                        states[i] = states[i][rows.to(states[i].device)]


FIXED_SHAPE_LAYER_TYPES = {"full_attention", "linear_attention"}  # configs whose linear layers take the 2-D mask


def fixed_shape_unsupported(target) -> str | None:
    """Why the fixed-shape path cannot serve this hybrid target, or None: it keeps one convolution window and one
    recurrent state per linear layer (`RowLinearLayer`), and gives linear layers the prompt's 2-D padding mask under
    `layer_types`' "linear_attention" key; mixed layers (attention and state space in one) are the general loop's."""
    layers = linear_layers(DynamicCache(config=target.config))
    if not layers:  # attention only: nothing of the target's for this path to refuse
        return None
    config = target.config.get_text_config()
    types = set(getattr(config, "layer_types", None) or [])
    if not types <= FIXED_SHAPE_LAYER_TYPES or any(type(layer) is not LinearAttentionLayer
                                                   or layer.number_of_states != 1 for layer in layers):
        return (f"a {config.model_type} target (the fixed-shape path keeps one state per 'linear_attention' layer; "
                "this one has other layer kinds, or layers mixing attention and state space: general loop only)")
    return None


class RowLinearLayer(LinearAttentionLayer):
    """The fixed-shape path's linear-attention layer (`kv_cache.row_cache`): its window and state live in tensors
    allocated once and written in place, so compiled steps (CUDA graphs) keep their addresses. A step's forward over
    W tokens (`record_block`: W) leaves them as they were and records, into buffers of `span` tokens, the convolution
    inputs (the window before the block, then the block's) and the state after each token; `keep_row_states` then
    gives each row the window and state after its own last kept token. A prompt (no previous state) sets them."""

    is_compileable = True  # recording writes preallocated buffers: nothing grows, nothing is reassigned

    def __init__(self, span: int):
        super().__init__(number_of_states=1)
        self.span = span
        self.record_past = True  # the model asks `recurrent_states_to_keep` of recording layers only
        self.recurrent_states_to_keep = 0
        self.conv_inputs = None  # [rows, channels, kernel + span]
        self.recorded = None  # [span, rows, *state]: the state after each of a step's tokens

    def start(self) -> None:
        """A new call: its prompt has no previous state (the tensors stay, for the next compiled step)."""
        self.has_previous_state[0] = False
        self.recurrent_states_to_keep = 0

    def lazy_initialization(self, conv_states=None, recurrent_states=None, state_idx=0, conv_kernel_size=None):
        super().lazy_initialization(conv_states, recurrent_states, state_idx, conv_kernel_size)
        if conv_states is not None:
            window = self.conv_states[0]
            self.conv_inputs = window.new_zeros(*window.shape[:-1], window.shape[-1] + self.span)
            torch._dynamo.mark_static_address(window)
            torch._dynamo.mark_static_address(self.conv_inputs)
        if recurrent_states is not None:
            self.recorded = self.recurrent_states[0].new_zeros(self.span, *self.recurrent_states[0].shape)
            torch._dynamo.mark_static_address(self.recorded)

    def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0, conv_kernel_size: int | None = None,
                          **kwargs) -> torch.Tensor:
        if not self.is_conv_states_initialized[0]:
            self.lazy_initialization(conv_states=conv_states, conv_kernel_size=conv_kernel_size)
        window = self.conv_states[0]
        if not self.has_previous_state[0]:  # a prompt: its last inputs, zeros before its first
            self.has_previous_state[0] = True
            window.copy_(F.pad(conv_states, (window.shape[-1], 0))[..., -window.shape[-1]:])
            return conv_states
        inputs = torch.cat([window, conv_states], dim=-1)
        self.conv_inputs[..., : inputs.shape[-1]].copy_(inputs)
        return inputs

    def update_recurrent_state(self, recurrent_states, state_idx: int = 0, **kwargs) -> torch.Tensor:
        # a list: the state after each recorded token; a tensor: a prompt's last state, or a one-token step's
        states = [recurrent_states] if isinstance(recurrent_states, torch.Tensor) else recurrent_states
        if not self.is_recurrent_states_initialized[0]:
            self.lazy_initialization(recurrent_states=states[0])
        if not self.recurrent_states_to_keep:
            self.recurrent_states[0].copy_(states[-1])
        elif len(states) != self.recurrent_states_to_keep:
            raise ValueError(f"A step over {self.recurrent_states_to_keep} tokens recorded {len(states)} recurrent "
                             "states: this target's layers do not honour `recurrent_states_to_keep`. Generate "
                             "without cache_implementation='static'.")
        else:
            for k, state in enumerate(states):
                self.recorded[k].copy_(state)
        return self.recurrent_states[0]


def row_linear_states(cache) -> list:
    """`keep_row_states`' tensors: each `RowLinearLayer`'s window, recorded inputs, state and recorded states."""
    return [(layer.conv_states[0], layer.conv_inputs, layer.recurrent_states[0], layer.recorded)
            for layer in cache.layers if isinstance(layer, RowLinearLayer)]


def keep_row_states(states: list, kept: torch.LongTensor) -> None:
    """After a step (`row_linear_states(cache)`): each row's window and state after its first `kept` [rows] >= 1
    tokens of the step, in place. The fixed-shape path compiles it into one call, as `kv_cache.move_slots`."""
    for window, inputs, state, recorded in states:
        rows, channels, width = window.shape
        index = kept.to(window.device)[:, None] + torch.arange(width, device=window.device)  # [rows, width]
        window.copy_(inputs.gather(-1, index[:, None, :].expand(-1, channels, -1)))
        state.copy_(recorded[kept.to(state.device) - 1, torch.arange(rows, device=state.device)])
