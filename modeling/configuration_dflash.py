"""DFlash drafter configuration, in the z-lab checkpoint format.

The file is self-contained (torch + transformers only) so it can be uploaded to the Hub as remote code.

diff with Qwen3Config: a drafter also records which target it reads (`target_layer_ids`, `num_target_layers`),
its `block_size` and `mask_token_id`. z-lab writes them inside a `dflash_config` block (older files keep
`block_size` at the top level); this class reads both layouts and writes the newer one, plus `block_size` at the
top level for older readers.
"""

from transformers.models.qwen3.configuration_qwen3 import Qwen3Config

# Keys that live inside `dflash_config` in the z-lab format and are typed attributes here.
DFLASH_KEYS = ("block_size", "mask_token_id", "target_layer_ids")


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The DFlash rule: one draft layer reads the middle layer; n > 1 read n layers evenly spaced in [1, L - 3]."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


class DFlashConfig(Qwen3Config):
    r"""
    Configuration of a DFlash drafter: a small stack of Qwen3 decoder layers conditioned on target features.

    Args:
        block_size (`int`, defaults to 16):
            Tokens per draft block: the last committed token plus `block_size - 1` mask slots, so one drafter
            forward proposes `block_size - 1` tokens.
        mask_token_id (`int`):
            Row of the target's input embedding used for the mask slots. Must exist in the target's table.
        target_layer_ids (`list[int]`):
            Target decoder layers whose outputs (`hidden_states[i + 1]`) are concatenated as context features.
            Defaults to the DFlash rule for `num_target_layers` and `num_hidden_layers`.
        num_target_layers (`int`):
            Number of decoder layers of the target the drafter was made for.
        dflash_config (`dict`):
            The z-lab block. Its known keys fill the attributes above (which win when both are set); other keys
            are kept as they are (`input_embedding_scale`, `output_multiplier`, `final_logit_softcapping`,
            `target_model`, ...).
    """

    model_type = "qwen3"  # z-lab format: readers dispatch on `architectures` and `dflash_config`, not on the type

    block_size: int = 16
    mask_token_id: int | None = None
    target_layer_ids: list[int] | None = None
    num_target_layers: int | None = None
    dflash_config: dict | None = None

    def __post_init__(self, **kwargs):
        block = dict(self.dflash_config or {})
        for key in DFLASH_KEYS:
            if key in block:
                setattr(self, key, block[key])
        if self.target_layer_ids is None and self.num_target_layers is not None:
            self.target_layer_ids = default_target_layer_ids(self.num_target_layers, self.num_hidden_layers)
        if self.target_layer_ids is not None:
            self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        # The typed attributes are the source of truth; `dflash_config` mirrors them for readers (vLLM, SGLang,
        # the reference) that look only there, and keeps the optional keys.
        self.dflash_config = {**block, **{key: getattr(self, key) for key in DFLASH_KEYS}}
        kwargs.setdefault("architectures", ["DFlashDraftModel"])
        super().__post_init__(**kwargs)
        self.validate_dflash()

    def validate_dflash(self) -> None:
        if int(self.block_size) < 2:
            raise ValueError(
                f"block_size={self.block_size}: a DFlash block needs at least 2 tokens (the last committed token "
                "and one mask slot). Use block_size >= 2."
            )
        if not self.target_layer_ids:
            raise ValueError(
                "The drafter config has no target_layer_ids and no num_target_layers to derive them from. "
                "Set target_layer_ids (the target layers whose outputs the drafter reads)."
            )
        bad = [i for i in self.target_layer_ids if i < 0 or (self.num_target_layers and i >= self.num_target_layers)]
        if bad:
            raise ValueError(
                f"target_layer_ids {bad} are outside the target's {self.num_target_layers} layers "
                f"(valid: 0..{(self.num_target_layers or 1) - 1})."
            )
        if self.mask_token_id is not None and not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(
                f"mask_token_id={self.mask_token_id} is outside the vocabulary (0..{self.vocab_size - 1}). "
                "Choose an existing embedding row the tokenizer does not use."
            )

    def layer_is_causal(self, layer_type: str) -> bool:
        """Whether the block attends causally in a drafter layer of this type: the config's `is_causal` (or the
        z-lab block's `causal`) where set, for every layer; otherwise sliding-window layers only, as the reference
        reads z-lab files (DFlash2 drafters set `is_causal: false` on their sliding layers)."""
        flag = getattr(self, "is_causal", None)
        flag = (self.dflash_config or {}).get("causal") if flag is None else flag
        return layer_type == "sliding_attention" if flag is None else bool(flag)

    def to_dict(self) -> dict:
        output = super().to_dict()
        block = {key: output.pop(key) for key in ("mask_token_id", "target_layer_ids")}
        output["dflash_config"] = {**(self.dflash_config or {}), **block, "block_size": self.block_size}
        return output


# Keys of a DFlash2 drafter, inside `dflash_config` in the z-lab format.
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


class DFlash2Config(DFlashConfig):
    r"""
    Configuration of a DFlash2 drafter: a DFlash drafter plus dynamic causal convolutions and a candidate selector.

    Args:
        conv_kernel_size (`int`, defaults to 2):
            Taps of the causal convolution along the block, before each layer's attention and before its MLP.
        conv_group_size (`int`, defaults to 16):
            Channels that share one dynamic tap (the hidden size must be a multiple).
        selector_rank (`int`, defaults to 256):
            Rank of the candidate selector's bigram interaction.
        selector_top_k (`int`, defaults to 16):
            Candidates per block position among which the selector chooses.
    """

    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 256
    selector_top_k: int = 16

    def __post_init__(self, **kwargs):
        block = dict(self.dflash_config or {})
        for key in DFLASH2_KEYS:
            if key in block:
                setattr(self, key, int(block[key]))
        self.dflash_config = {**block, **{key: getattr(self, key) for key in DFLASH2_KEYS}}
        kwargs.setdefault("architectures", ["DFlash2DraftModel"])
        super().__post_init__(**kwargs)

    def validate_dflash(self) -> None:
        super().validate_dflash()
        if self.conv_kernel_size < 1 or self.conv_group_size < 1 or self.hidden_size % self.conv_group_size:
            raise ValueError(
                f"conv_kernel_size={self.conv_kernel_size}, conv_group_size={self.conv_group_size}: need both >= 1 "
                f"and hidden_size ({self.hidden_size}) a multiple of conv_group_size."
            )
        if self.selector_rank < 1 or not 1 <= self.selector_top_k <= self.vocab_size:
            raise ValueError(
                f"selector_rank={self.selector_rank}, selector_top_k={self.selector_top_k}: need a rank >= 1 and "
                f"1 <= top_k <= vocab_size ({self.vocab_size})."
            )

    def to_dict(self) -> dict:
        output = super().to_dict()
        output["dflash_config"].update({key: output.pop(key) for key in DFLASH2_KEYS if key in output})
        return output


def default_mask_token_id(target, tokenizer) -> int:
    """An embedding row the tokenizer never produces: a padded row past the tokenizer's vocabulary, else a known
    mask / unused token, else the highest special token that the chat template does not use."""
    if tokenizer is None:
        raise ValueError(
            "Cannot choose a mask token without the tokenizer: pass tokenizer=... so an unused embedding row can be "
            "found, or mask_token_id=<an existing embedding row the tokenizer does not use>."
        )
    rows = target.get_input_embeddings().weight.shape[0]
    if rows > len(tokenizer):
        return len(tokenizer)  # the first padded row, as z-lab's Qwen3 drafters use
    vocab = tokenizer.get_vocab()
    for name in ("<|MASK|>", "<|mask|>", "<mask>", "<unused0>", "<|reserved_special_token_0|>"):
        if name in vocab:
            return vocab[name]
    in_use = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    template = str(getattr(tokenizer, "chat_template", None) or "")
    spare = [i for tok, i in tokenizer.get_added_vocab().items() if i not in in_use and tok not in template]
    if spare:
        return max(spare)
    raise ValueError(
        "Every embedding row is used by the tokenizer: pass mask_token_id=<a rarely used token id>, e.g. a special "
        "token that never appears in your prompts or responses."
    )


__all__ = ["DFlash2Config", "DFlashConfig", "default_mask_token_id", "default_target_layer_ids"]
