"""DFlash2 drafter: a DFlash drafter with dynamic causal convolutions and a candidate selector.

Self-contained next to modeling_dflash.py (torch + transformers only), so the two files are also the Hub remote code.
What differs from DFlash (everything else is modeling_dflash.py's):

- in every layer, a grouped dynamic causal convolution along the block wraps the attention and one wraps the MLP:
  the sublayer's normed input is convolved before it and its output after it, with taps that are learned
  (`base_kernel`) plus computed per position from the normed input (`kernel_projection`);
- a candidate selector: each block position keeps the drafter's `selector_top_k` most likely tokens and rescores
  them under the token before it, `logit(x) + <predecessor_codebook[parent] * W h, successor_codebook[x]>`, so the
  drafts of one block fit together.

Tensor names follow the z-lab DFlash2 checkpoints, whose codebooks carry no `.weight` suffix.
"""

import re

import torch
from torch import nn
from torch.nn import functional as F
from transformers import initialization as init

try:
    from .configuration_dflash import DFlash2Config
    from .modeling_dflash import DFlashDecoderLayer, DFlashDraftModel, _rows_through
except ImportError:  # loaded as Hub files
    from configuration_dflash import DFlash2Config
    from modeling_dflash import DFlashDecoderLayer, DFlashDraftModel, _rows_through


class GroupedDynamicCausalConv(nn.Module):
    """A depthwise causal convolution along the block whose taps are shared by groups of `conv_group_size` channels
    and depend on the position. One module serves a sublayer: `prepare` convolves its input and returns the taps
    for `finish`, which convolves its output."""

    def __init__(self, config: DFlash2Config):
        super().__init__()
        self.kernel_size, self.group_size = config.conv_kernel_size, config.conv_group_size
        self.groups = config.hidden_size // self.group_size
        # [before / after the sublayer, tap, channel]: tap t multiplies the input t positions back
        self.base_kernel = nn.Parameter(torch.empty(2, self.kernel_size, config.hidden_size))
        self.kernel_projection = nn.Linear(config.hidden_size, 2 * self.kernel_size * self.groups, bias=False)

    def prepare(self, hidden_states: torch.Tensor, block_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        # taps: [batch, L, 2, kernel, groups], computed from the normed input for both convolutions
        taps = self.kernel_projection(hidden_states).view(*hidden_states.shape[:-1], 2, self.kernel_size, self.groups)
        return self._convolve(hidden_states, taps[:, :, 0], self.base_kernel[0], block_len), taps[:, :, 1]

    def finish(self, hidden_states: torch.Tensor, taps: torch.Tensor, block_len: int | None = None) -> torch.Tensor:
        return self._convolve(hidden_states, taps, self.base_kernel[1], block_len)

    def _convolve(self, hidden_states, taps, base, block_len) -> torch.Tensor:
        # hidden_states [batch, L, hidden] -> [batch, L, groups, group_size]; taps [batch, L, kernel, groups]. The input
        # is one block, or (training) blocks of `block_len` one after the other: no tap reaches into another block.
        batch, length, hidden = hidden_states.shape
        grouped = hidden_states.view(batch, length, self.groups, self.group_size)
        base = base.to(hidden_states.dtype).view(self.kernel_size, self.groups, self.group_size)
        slot = torch.arange(length, device=hidden_states.device) % (block_len or length)
        output = torch.zeros_like(grouped)
        for tap in range(min(self.kernel_size, length)):
            shifted = F.pad(grouped[:, : length - tap], (0, 0, 0, 0, tap, 0))  # zeros before the block's start
            if block_len and block_len < length:
                shifted = shifted * (slot >= tap).to(shifted.dtype)[:, None, None]
            output = output + (base[tap] + taps[:, :, tap, :, None]) * shifted
        return output.view(batch, length, hidden)


class DFlash2DecoderLayer(DFlashDecoderLayer):
    def __init__(self, config: DFlash2Config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.attention_conv = GroupedDynamicCausalConv(config)
        self.mlp_conv = GroupedDynamicCausalConv(config)

    def forward(self, hidden_states, context, position_embeddings, attention_mask=None, cache=None, block_len=None,
                **kwargs):
        residual = hidden_states
        # diff with DFlash: each sublayer's normed input and its output go through the layer's convolutions
        hidden_states, taps = self.attention_conv.prepare(self.input_layernorm(hidden_states), block_len)
        hidden_states, _ = self.self_attn(hidden_states, context, position_embeddings, attention_mask, cache, **kwargs)
        hidden_states = residual + self.attention_conv.finish(hidden_states, taps, block_len)
        residual = hidden_states
        hidden_states, taps = self.mlp_conv.prepare(self.post_attention_layernorm(hidden_states), block_len)
        return residual + self.mlp_conv.finish(self.mlp(hidden_states), taps, block_len)


class CandidateSelector(nn.Module):
    """Rescores each block position's top-k draft tokens under the token before them (a low-rank bigram
    interaction modulated by the drafter's hidden state)."""

    def __init__(self, config: DFlash2Config):
        super().__init__()
        self.top_k = config.selector_top_k
        self.predecessor_codebook = nn.Embedding(config.vocab_size, config.selector_rank)
        self.successor_codebook = nn.Embedding(config.vocab_size, config.selector_rank)
        self.hidden_projection = nn.Linear(config.hidden_size, config.selector_rank, bias=False)

    def scores(self, hidden_states, candidates, logits, parents) -> torch.Tensor:
        """Scores [rows, D, J, K] of the candidates [rows, D, K] (their draft `logits` [rows, D, K]) of each draft
        position under each of the parents [rows, D, J] (the tokens that may come before them), from the draft
        hidden states [rows, D, hidden]."""
        query = self.hidden_projection(hidden_states.to(self.hidden_projection.weight.dtype))  # [rows, D, rank]
        predecessor = self.predecessor_codebook(parents) * query[:, :, None]  # [rows, D, J, rank]
        interaction = predecessor @ self.successor_codebook(candidates).transpose(-1, -2)  # [rows, D, J, K]
        return logits.float()[:, :, None, :] + interaction.float()


class DFlash2DraftModel(DFlashDraftModel):
    """The DFlash2 drafter: `forward` as DFlash's with convolutions in every layer (`block_len=B` when the input
    holds several blocks of B one after the other, as in training); `candidates` gives each draft
    position's top-k tokens with the selector's probabilities under each possible parent, from which the loop drafts
    a chain (the selector's greedy walk, as the reference drafts) or a tree."""

    config_class = DFlash2Config
    decoder_layer_class = DFlash2DecoderLayer
    _no_split_modules = ["DFlash2DecoderLayer"]

    def __init__(self, config: DFlash2Config):
        super().__init__(config)
        self.candidate_selector = CandidateSelector(config)
        self.post_init()

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, GroupedDynamicCausalConv):  # identity taps: a new DFlash2 drafter starts as DFlash
            identity = torch.zeros_like(module.base_kernel)
            identity[:, 0] = 1.0
            init.copy_(module.base_kernel, identity)
            init.zeros_(module.kernel_projection.weight)  # no dynamic taps yet (they learn: their gradient is not 0)

    def candidates(self, hidden_states, output_head, newest, head=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Each draft position's `selector_top_k` most likely tokens, ids [rows, D, K] (most likely first, as target
        token ids), and the selector's probabilities [rows, D, K, K]: entry [r, d, j] is position d's candidates'
        distribution under candidate j of position d - 1 (d = 0: under `newest` [rows], the block's first token,
        for every j). `head`: as in `draft_tokens`."""
        if head is None:
            logits, token_ids = self.compute_logits(hidden_states, output_head), None
        else:
            linear, token_ids = head
            weight = linear.weight
            hidden_states = hidden_states.to(device=weight.device, dtype=weight.dtype)
            logits = self._scale_logits(_rows_through(linear, hidden_states))
        k = min(self.candidate_selector.top_k, logits.shape[-1])
        logits, ids = logits.topk(k, dim=-1)  # [rows, D, K]
        ids = ids if token_ids is None else token_ids[ids]
        parents = torch.cat([newest.to(ids.device)[:, None, None].expand(-1, 1, k), ids[:, :-1]], dim=1)
        scores = self.candidate_selector.scores(hidden_states.to(ids.device), ids, logits, parents)
        return ids, scores.softmax(-1)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Save in the z-lab DFlash2 format (codebooks without a `.weight` suffix), plus the remote code."""
        state_dict = kwargs.pop("state_dict", None) or self.state_dict()
        state_dict = {_CODEBOOK_SUFFIX.sub(r"\1", name): tensor for name, tensor in state_dict.items()}
        super().save_pretrained(save_directory, *args, state_dict=state_dict, **kwargs)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        # z-lab files name the codebooks without `.weight`; files saved by the reference's own code carry it
        kwargs.setdefault("key_mapping", {rf"^(candidate_selector\.{name}_codebook)$": r"\1.weight"
                                          for name in ("predecessor", "successor")})
        return super().from_pretrained(*args, **kwargs)


_CODEBOOK_SUFFIX = re.compile(r"^(candidate_selector\.(?:predecessor|successor)_codebook)\.weight$")

__all__ = ["CandidateSelector", "DFlash2DecoderLayer", "DFlash2DraftModel", "GroupedDynamicCausalConv"]
