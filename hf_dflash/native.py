"""transformers' own DFlash drafters (`model_type: "muse_glimmer_assistant"`) on hf-dflash's loop.

Such a drafter is a DFlash drafter under other names: Exaone 4 layers that compute what DFlash's Qwen3 layers do
(pre-norm, QK-norm, a gated MLP, rotary positions in every layer), its context projection `encoder.fc` +
`encoder.output_norm_enc` (DFlash's `fc` + `hidden_norm`), sliding-window layers whose block sees itself whole. No
embeddings and no head of its own, as DFlash. `as_dflash_drafter` gives the `DFlashDraftModel` that computes the same,
sharing the native model's tensors, so the loop's batches, trees, exact stopping and fixed-shape path serve it;
transformers' own path stays one `speculation_type="dflash"` away.
"""

import torch
from torch import nn

from .modeling import DFlashConfig, DFlashDraftModel
from .modeling.modeling_dflash import Qwen3RotaryEmbedding

NATIVE_MODEL_TYPES = ("muse_glimmer_assistant",)
_RENAMED = {"encoder.fc.weight": "fc.weight", "encoder.output_norm_enc.weight": "hidden_norm.weight"}


def is_native_drafter(model) -> bool:
    """Whether `model` is one of transformers' own DFlash drafters."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    return isinstance(model, nn.Module) and model_type in NATIVE_MODEL_TYPES


def as_dflash_drafter(native: nn.Module, vocab_size: int) -> DFlashDraftModel:
    """The `DFlashDraftModel` that computes what `native` computes, over a target of `vocab_size` tokens (the
    native config has none: it borrows the target's head). It shares the native model's tensors, so nothing is copied
    and later changes to them show; it is built once per native model and vocabulary size."""
    cached = getattr(native, "_hf_dflash_drafter", None)
    if cached is not None and cached.config.vocab_size == vocab_size:
        return cached
    native_config = native.config
    if not native_config.target_layer_ids or native_config.mask_token_id is None:
        raise ValueError(
            f"This {native_config.model_type} drafter's config lacks target_layer_ids or mask_token_id: set them (the "
            "target layers it reads, and its mask token) before decoding with it."
        )
    config = DFlashConfig(
        **{name: getattr(native_config, name) for name in (
            "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "rms_norm_eps", "rope_parameters", "max_position_embeddings", "hidden_act",
            "bos_token_id", "eos_token_id", "pad_token_id", "block_size", "mask_token_id",
        )},
        layer_types=list(native_config.layer_types), use_sliding_window=True, vocab_size=vocab_size,
        target_layer_ids=list(native_config.target_layer_ids),
        is_causal=False,  # its masks are bidirectional, windowed both ways
        # transformers' bidirectional window keeps keys at distance <= window; DFlash's (the reference's), < window
        sliding_window=None if native_config.sliding_window is None else native_config.sliding_window + 1,
        architectures=["DFlashDraftModel"],
    )
    config._attn_implementation = native_config._attn_implementation or "sdpa"
    weight = next(native.parameters())
    with torch.device("meta"):
        drafter = DFlashDraftModel(config)
    state = {_RENAMED.get(name, name): tensor for name, tensor in native.state_dict().items()}
    drafter.load_state_dict(state, strict=True, assign=True)
    drafter.rotary_emb = Qwen3RotaryEmbedding(config).to(weight.device)  # its buffers are not in the state dict
    drafter.eval().requires_grad_(False)
    object.__setattr__(native, "_hf_dflash_drafter", drafter)  # not a submodule: the native state dict stays as it is
    return drafter


__all__ = ["NATIVE_MODEL_TYPES", "as_dflash_drafter", "is_native_drafter"]
