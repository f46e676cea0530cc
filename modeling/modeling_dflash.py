"""DFlash drafter: a block-diffusion draft model conditioned on target hidden features.

Self-contained (torch + transformers only) so the file can be uploaded to the Hub as remote code.
What differs from Qwen3 (everything else is imported from transformers' Qwen3 modules):

- no embedding and no lm_head: the drafter borrows the target's (frozen) input embedding and output head;
- context features: the outputs of a few target layers, concatenated, projected by `fc` and normed by `hidden_norm`;
- KV injection: in every layer keys/values come from `[context ; block]`, queries from the block only;
- full-attention layers attend bidirectionally inside the block; sliding-window layers are causal and windowed.
"""

import json
import shutil
import sys
import weakref
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn import functional as F
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.models.qwen3.modeling_qwen3 import (
    ALL_ATTENTION_FUNCTIONS,
    Qwen3Attention,
    Qwen3DecoderLayer,
    Qwen3PreTrainedModel,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    eager_attention_forward,
    rotate_half,
)
from transformers.utils import cached_file

try:
    from .configuration_dflash import DFlashConfig, default_mask_token_id
except ImportError:  # loaded as a single Hub file next to configuration_dflash.py
    from configuration_dflash import DFlashConfig, default_mask_token_id


# hf-dflash's extension tensors, saved beside model.safetensors (which keeps the z-lab names only, as engines load it)
EXTRAS_FILE = "hf_dflash_extras.safetensors"
EXTRA_TENSORS = ("draft_vocab", "bigram_keys", "bigram_boosts")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [batch, heads, length, head_dim]; cos/sin: [batch, length, head_dim]
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


class DFlashAttention(Qwen3Attention):
    def __init__(self, config: DFlashConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.is_causal = False  # diff with Qwen3: the block attends to itself bidirectionally

    def forward(
        self,
        hidden_states: torch.Tensor,
        context: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        cache: Cache | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch, block_len, _ = hidden_states.shape
        context_len = context.shape[1]
        # diff with Qwen3: queries from the block only, keys/values from [context ; block]
        query = self.q_norm(self.q_proj(hidden_states).view(batch, block_len, -1, self.head_dim)).transpose(1, 2)
        kv_input = torch.cat([context, hidden_states], dim=1)
        kv_shape = (batch, context_len + block_len, -1, self.head_dim)
        key = self.k_norm(self.k_proj(kv_input).view(kv_shape)).transpose(1, 2)
        value = self.v_proj(kv_input).view(kv_shape).transpose(1, 2)

        cos, sin = position_embeddings  # [batch, context_len + block_len, head_dim]
        query = _rotate(query, cos[:, context_len:], sin[:, context_len:])
        key = _rotate(key, cos, sin)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)
        if isinstance(attention_mask, torch.Tensor) and attention_mask.shape[-1] > key.shape[-2]:
            attention_mask = attention_mask[..., -key.shape[-2] :]  # a sliding cache layer returns the window only

        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        output, weights = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            sliding_window=self.sliding_window,
            **kwargs,
        )
        return self.o_proj(output.reshape(batch, block_len, -1).contiguous()), weights


class DFlashDecoderLayer(Qwen3DecoderLayer):
    def __init__(self, config: DFlashConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = DFlashAttention(config, layer_idx)

    def forward(
        self,
        hidden_states: torch.Tensor,
        context: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> torch.Tensor:
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        # diff with Qwen3: the context enters every layer un-normed, as keys/values only
        hidden_states, _ = self.self_attn(hidden_states, context, position_embeddings, attention_mask, cache, **kwargs)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
        return residual + hidden_states


class DFlashDraftModel(Qwen3PreTrainedModel):
    """The DFlash drafter. `forward` maps a block of (masked) token embeddings plus target context features to draft
    hidden states; the target's output head turns them into draft logits (`compute_logits`). Tensor names match the
    z-lab checkpoints (`layers.*`, `fc`, `hidden_norm`, `norm`, no `model.` prefix)."""

    config_class = DFlashConfig
    base_model_prefix = "dflash"  # the drafter is its own base model: z-lab tensor names carry no prefix
    _no_split_modules = ["DFlashDecoderLayer"]
    _supports_flash_attn = False  # blocks see arbitrary key subsets: needs an explicit mask
    _keys_to_ignore_on_load_unexpected = [r"rotary_emb\.", r"embed_tokens\.", r"lm_head\."]
    # hf-dflash's extensions are saved apart (`EXTRAS_FILE`): engines refuse unknown tensors in model.safetensors
    _keys_to_ignore_on_load_missing = [rf"^{name}$" for name in EXTRA_TENSORS]

    decoder_layer_class = DFlashDecoderLayer  # DFlash2 swaps in its own
    card_writer = None  # f(folder): writes README.md after `save_pretrained`; the layer above sets it (hf_dflash.hub)

    def __init__(self, config: DFlashConfig):
        if type(self) is DFlashDraftModel and "selector_top_k" in (config.dflash_config or {}):
            raise ValueError("This is a DFlash2 drafter's config: load it with AutoModel.from_pretrained(...) after "
                             "`import hf_dflash`, or hf_dflash.DFlash2DraftModel.from_pretrained(...).")
        super().__init__(config)
        self.layers = nn.ModuleList(self.decoder_layer_class(config, i) for i in range(config.num_hidden_layers))
        self.fc = nn.Linear(len(config.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        # hf-dflash extension (other readers ignore the tensor): the target tokens the drafter may propose. Scoring
        # only these rows of the lm_head makes drafting cheaper; verification, hence the output, is unchanged.
        size = (config.dflash_config or {}).get("draft_vocab_size")
        self.register_buffer("draft_vocab", torch.arange(int(size)) if size else None, persistent=True)
        # hf-dflash extension: the bigram prior that conditions drafts on their parent token (`hf_dflash.bigram`)
        entries = int(((config.dflash_config or {}).get("bigram_prior") or {}).get("entries") or 0)
        self.register_buffer("bigram_keys", torch.zeros(entries, dtype=torch.long) if entries else None)
        self.register_buffer("bigram_boosts", torch.ones(entries) if entries else None)
        self._draft_head_cache = None  # (state, head) of the last `draft_head` gather
        self.post_init()

    @property
    def block_size(self) -> int:
        return int(self.config.block_size)

    @property
    def assistant_confidence_threshold(self) -> float:
        """hf-dflash extension: the default below which a step verifies no drafts (0: always verify)."""
        return float(self.config.dflash_config.get("assistant_confidence_threshold") or 0.0)

    @property
    def draft_tree_size(self) -> int | str:
        """hf-dflash extension: the default number of draft nodes a step verifies as a tree (0: a chain of argmax
        drafts; "auto": chosen per step from the target's measured forward costs)."""
        size = self.config.dflash_config.get("draft_tree_size") or 0
        return size if size == "auto" else int(size)

    @property
    def mask_token_id(self) -> int:
        return self.config.mask_token_id

    @property
    def target_layer_ids(self) -> list[int]:
        return self.config.target_layer_ids

    @classmethod
    def from_target(cls, target: nn.Module, num_hidden_layers: int = 1, block_size: int = 16,
                    mask_token_id: int | None = None, target_layer_ids: list[int] | None = None, tokenizer=None,
                    **config_kwargs) -> "DFlashDraftModel":
        """A randomly initialised drafter whose dimensions match `target` (on its device, in its dtype).
        `target_layer_ids` default to the DFlash rule; `mask_token_id` defaults to an embedding row the tokenizer
        does not use (pass `tokenizer=`), or raises saying how to choose one."""
        text = target.config.get_text_config()
        layers = text.num_hidden_layers
        rope = dict(getattr(text, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0})
        rope = rope.get("full_attention", rope)  # per-layer-type rope (Gemma 3): the drafter's layers are full
        extras = {}
        embed_scale = getattr(target.get_input_embeddings(), "embed_scale", None)
        if embed_scale is not None and float(embed_scale) != 1.0:
            extras["input_embedding_scale"] = float(embed_scale)
        if getattr(text, "final_logit_softcapping", None):
            extras["final_logit_softcapping"] = float(text.final_logit_softcapping)
        extras.update(config_kwargs.pop("dflash_config", None) or {})  # keys the caller sets explicitly win
        config = cls.config_class(
            hidden_size=text.hidden_size,
            intermediate_size=text.intermediate_size,
            num_hidden_layers=num_hidden_layers,
            num_attention_heads=text.num_attention_heads,
            num_key_value_heads=getattr(text, "num_key_value_heads", None) or text.num_attention_heads,
            head_dim=getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads,
            rms_norm_eps=getattr(text, "rms_norm_eps", 1e-6),
            rope_parameters=rope,
            max_position_embeddings=text.max_position_embeddings,
            vocab_size=text.vocab_size,
            bos_token_id=text.bos_token_id,
            eos_token_id=text.eos_token_id,
            pad_token_id=text.pad_token_id,
            block_size=block_size,
            mask_token_id=default_mask_token_id(target, tokenizer) if mask_token_id is None else mask_token_id,
            target_layer_ids=target_layer_ids,
            num_target_layers=layers,
            dflash_config={**({"target_model": target.name_or_path} if target.name_or_path else {}), **extras},
            **config_kwargs,
        )
        weight = stored_weight(target.get_input_embeddings())  # an offloaded target's: where accelerate keeps it
        if not 0 <= config.mask_token_id < weight.shape[0]:
            raise ValueError(
                f"mask_token_id={config.mask_token_id} is not a row of the target's embedding table "
                f"(0..{weight.shape[0] - 1}). Choose an existing row the tokenizer does not use."
            )
        return cls(config).to(device=weight.device, dtype=weight.dtype)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Save in the z-lab format, plus this file and configuration_dflash.py with an `auto_map`, so that
        `AutoModel.from_pretrained(dir, trust_remote_code=True)` works without hf-dflash, and a model card if the
        folder has none and a `card_writer` is set (`import hf_dflash` sets `hf_dflash.hub.write_model_card`)."""
        model_file, folder = Path(sys.modules[type(self).__module__].__file__).stem, Path(save_directory)
        self.config.auto_map = {"AutoConfig": f"configuration_dflash.{type(self.config).__name__}",
                                "AutoModel": f"{model_file}.{type(self).__name__}"}
        state_dict = kwargs.pop("state_dict", None) or self.state_dict()
        extras = {k: state_dict.pop(k).detach().contiguous().cpu() for k in EXTRA_TENSORS if k in state_dict}
        super().save_pretrained(save_directory, *args, state_dict=state_dict, **kwargs)
        (folder / EXTRAS_FILE).unlink(missing_ok=True)  # a folder saved over keeps no stale extension
        if extras:
            save_file(extras, str(folder / EXTRAS_FILE))
            # vLLM and SGLang load every *.safetensors of a folder without an index, and refuse unknown names
            index = folder / "model.safetensors.index.json"  # a sharded save wrote its own
            if not index.exists() and (folder / "model.safetensors").exists():
                with safe_open(str(folder / "model.safetensors"), "pt") as f:
                    index.write_text(json.dumps({"weight_map": dict.fromkeys(f.keys(), "model.safetensors")}))
        for name in {"configuration_dflash.py", "modeling_dflash.py", f"{model_file}.py"}:
            shutil.copyfile(Path(__file__).with_name(name), folder / name)
        if self.card_writer is not None and not (folder / "README.md").exists():
            self.card_writer(save_directory)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """`PreTrainedModel.from_pretrained`, then hf-dflash's extensions (draft vocabulary, bigram prior) from
        `EXTRAS_FILE` where the folder has one (earlier folders hold them in model.safetensors, read above)."""
        model = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        hub = {k: kwargs[k] for k in ("cache_dir", "token", "revision", "local_files_only", "subfolder") if k in kwargs}
        path = cached_file(str(pretrained_model_name_or_path), EXTRAS_FILE, _raise_exceptions_for_missing_entries=False,
                           **hub)
        for name, tensor in (load_file(path) if path else {}).items():
            current = getattr(model, name)  # shaped by the config (`draft_vocab_size`, `bigram_prior["entries"]`)
            setattr(model, name, tensor.to(device=current.device, dtype=current.dtype))
        return model

    def forward(
        self,
        noise_embeds: torch.Tensor,
        context_hidden_states: torch.Tensor,
        position_ids: torch.LongTensor,
        attention_mask: torch.Tensor | dict | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        """`noise_embeds` [batch, block_len, hidden]: the block's target input embeddings; `context_hidden_states`
        [batch, context_len, len(target_layer_ids) * hidden]: the target features of the context not yet in `cache`;
        `position_ids` [batch, context_len + block_len]; `attention_mask`: None (all visible, sliding windows by
        position), a 2-D key mask [batch, past + context_len + block_len] (1 = visible), a boolean 4-D one [batch, 1,
        block_len, keys], or a dict of those by layer type; `cache`: context and block keys / values are appended
        (callers crop the block)."""
        if "past_key_values" in kwargs:  # older transformers spelling
            cache = kwargs.pop("past_key_values")
        dtype = self.fc.weight.dtype
        context = self.hidden_norm(self.fc(context_hidden_states.to(device=self.fc.weight.device, dtype=dtype)))
        hidden_states = noise_embeds.to(device=self.fc.weight.device, dtype=dtype)
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        past_len = cache.get_seq_length() if cache is not None else 0
        masks = self._layer_masks(attention_mask, position_ids, context.shape[1], past_len, dtype)
        for layer in self.layers:
            mask = masks[layer.self_attn.layer_type or "full_attention"]
            hidden_states = layer(hidden_states, context, position_embeddings, mask, cache, **kwargs)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden_states))

    def _layer_masks(self, attention_mask, position_ids, context_len, past_len, dtype) -> dict:
        """One mask per layer type, in the format the attention implementation expects."""
        layer_types = set(self.config.layer_types or ["full_attention"])
        if isinstance(attention_mask, dict):
            masks = dict(attention_mask)
        elif attention_mask is not None and attention_mask.dim() == 4:
            masks = dict.fromkeys(layer_types, attention_mask)
        else:
            block_len = position_ids.shape[1] - context_len
            masks = {}
            for layer_type in layer_types:
                window = self.config.sliding_window if layer_type == "sliding_attention" else None
                causal = self.config.layer_is_causal(layer_type)
                masks[layer_type] = _block_mask(attention_mask, position_ids, block_len, past_len, window, causal)
        if self.config._attn_implementation == "eager":
            masks = {k: _additive(m, dtype) for k, m in masks.items()}
        return masks

    def embed(self, target: nn.Module, input_ids: torch.LongTensor) -> torch.Tensor:
        """Block embeddings from the target's table: raw rows times `input_embedding_scale`, as the reference does
        (a target whose embedding module rescales, like Gemma, records its scale there)."""
        weight = stored_weight(target.get_input_embeddings())
        scale = float(self.config.dflash_config.get("input_embedding_scale", 1.0))
        embeds = F.embedding(input_ids.to(weight.device), weight)
        return embeds * scale if scale != 1.0 else embeds

    def set_draft_vocab(self, token_ids) -> None:
        """Restrict drafts to `token_ids` (e.g. the most frequent tokens of the training responses), or lift the
        restriction with `None`. Saved with the model (`draft_vocab` tensor, `dflash_config.draft_vocab_size`)."""
        if token_ids is None:
            self.draft_vocab = None
            self.config.dflash_config.pop("draft_vocab_size", None)
            return
        ids = torch.as_tensor(list(token_ids), dtype=torch.long).unique()
        if ids.numel() == 0 or ids.min() < 0 or ids.max() >= self.config.vocab_size:
            raise ValueError(
                f"draft vocabulary ids must be non-empty and within 0..{self.config.vocab_size - 1}; got "
                f"{ids.tolist()[:8]}{' ...' if ids.numel() > 8 else ''}. Pass token ids of the target's vocabulary."
            )
        self.draft_vocab = ids.to(self.fc.weight.device)
        self.config.dflash_config["draft_vocab_size"] = int(ids.numel())

    @property
    def bigram_prior(self) -> tuple | None:
        """`(keys, boosts, vocab_size)` of the drafter's bigram prior (`hf_dflash.bigram`; a key is parent *
        vocab_size + child), or None."""
        return None if self.bigram_keys is None else (self.bigram_keys, self.bigram_boosts, self.config.vocab_size)

    def set_bigram_prior(self, keys, boosts, **settings) -> None:
        """Set the bigram prior (`hf_dflash.bigram.count_bigram_prior`'s keys and boosts; `settings`, how it was
        counted, are recorded in the config), or remove it with `None, None`. Saved with the model."""
        if keys is None:
            self.bigram_keys = self.bigram_boosts = None
            self.config.dflash_config.pop("bigram_prior", None)
            return
        keys, boosts = torch.as_tensor(keys, dtype=torch.long), torch.as_tensor(boosts)
        if keys.shape != boosts.shape or keys.dim() != 1 or not bool((keys[1:] > keys[:-1]).all()):
            raise ValueError("bigram prior: keys and boosts must be 1-D, of one length, keys strictly increasing.")
        weight = self.fc.weight  # the boosts in the weights' dtype: a bfloat16 drafter keeps 3 digits of each
        self.bigram_keys, self.bigram_boosts = keys.to(weight.device), boosts.to(weight.device, weight.dtype)
        self.config.dflash_config["bigram_prior"] = {"entries": int(keys.numel()), **settings}

    def draft_head(self, output_head: nn.Module) -> tuple | None:
        """`(head, token_ids)`: an `nn.Linear` over the rows of the target's head that the drafter scores (the
        `draft_vocab` rows, or all rows with `token_ids=None`), in the drafter's dtype, to build once per generation
        and pass to `draft_tokens`. None for a head that is not a plain `nn.Linear` (e.g. quantized): drafts then score
        it whole. The drafter's dtype because drafts only propose: a bfloat16 drafter beside a float32 target reads
        half the bytes per step (the head is memory-bound) and the target's verification keeps the output exact."""
        if type(output_head) is not nn.Linear:
            return None
        weight, bias, dtype = stored_weight(output_head), stored_weight(output_head, "bias"), self.fc.weight.dtype
        # an offloaded head's copy goes where the drafter runs (each step would move the hidden states otherwise)
        device = self.fc.weight.device if output_head.weight.device.type == "meta" else weight.device
        # The gather costs milliseconds per `generate` call at a large head: keep it while the head's tensors and the
        # draft vocabulary are the same objects, unmodified (`_version` counts in-place writes such as optimizer
        # steps), and the drafter's dtype is the same. Weak references: the cache never keeps a target alive.
        state = (dtype, *tensor_states(weight, bias, self.draft_vocab))
        if self._draft_head_cache is not None and same_states(self._draft_head_cache[0], state):
            return self._draft_head_cache[1]
        # ordinary tensors even under inference mode: an inference tensor's version is unknown (`tensor_states`)
        with torch.inference_mode(False):
            rows = None if self.draft_vocab is None else self.draft_vocab.to(weight.device)
            weight, bias = weight.detach(), None if bias is None else bias.detach()  # drafts are an argmax
            if rows is not None:
                weight, bias = weight[rows], None if bias is None else bias[rows]
            # a module rather than bare tensors: a CPU loop makes it multiply a prepacked weight (`hf_dflash.cpu_ops`)
            linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
            linear.weight = nn.Parameter(weight.to(device=device, dtype=dtype), requires_grad=False)
            if bias is not None:
                linear.bias = nn.Parameter(bias.to(device=device, dtype=dtype), requires_grad=False)
            head = linear, None if rows is None else rows.to(device)
        if linear.weight.data_ptr() != weight.data_ptr():  # a copy: keeping the target's own would leak it
            self._draft_head_cache = state, head
        return head

    def __getstate__(self):
        # weak references do not pickle (torch.save, deepcopy, multiprocessing): the cache is rebuilt on use
        return {**self.__dict__, "_draft_head_cache": None}

    def draft_tokens(
        self, hidden_states: torch.Tensor, output_head: nn.Module, head=None, return_confidence=False, top_k=None
    ):
        """Greedy drafts as target token ids: the argmax of the draft logits of `head = draft_head(output_head)`
        (its token ids), or over the whole `output_head` when `head` is None. With `return_confidence`, also the
        drafter's probability for each draft (softmax over the same logits). With `top_k`, the k most likely
        tokens per position instead, most likely first (a last dimension of size k, for draft trees)."""
        if head is None:
            logits, token_ids = self.compute_logits(hidden_states, output_head), None
        else:
            linear, token_ids = head
            weight = linear.weight
            hidden_states = hidden_states.to(device=weight.device, dtype=weight.dtype)
            logits = self._scale_logits(_rows_through(linear, hidden_states))
        if top_k is not None:
            confidence, ids = logits.float().softmax(-1).topk(top_k, dim=-1)
            ids = ids if token_ids is None else token_ids[ids]
            return (ids, confidence) if return_confidence else ids
        ids = logits.max(-1).indices  # the first maximum, like argmax, and several times faster on a CPU
        ids = ids if token_ids is None else token_ids[ids]
        if not return_confidence:
            return ids
        return ids, logits.float().softmax(-1).amax(-1)

    def compute_logits(self, hidden_states: torch.Tensor, output_head: nn.Module) -> torch.Tensor:
        """Draft logits through the target's output head, with the drafter's optional multiplier and soft cap."""
        weight = stored_weight(output_head)  # an offloaded head's hook moves the input where it computes
        hidden_states = hidden_states.to(device=weight.device, dtype=weight.dtype)
        return self._scale_logits(_rows_through(output_head, hidden_states))

    def _scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        multiplier = self.config.dflash_config.get("output_multiplier")
        if multiplier is not None and float(multiplier) != 1.0:
            logits = logits * float(multiplier)
        softcap = self.config.dflash_config.get("final_logit_softcapping")
        if softcap is not None and float(softcap) > 0:
            logits = torch.tanh(logits / float(softcap)) * float(softcap)
        return logits


def _rows_through(head: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """`head(hidden_states)` with the positions as one matrix of rows: a 3-D input to a linear without bias takes a
    batched matmul that can copy the whole weight each call on a CPU (seconds a step at a 248k-token vocabulary)."""
    return head(hidden_states.reshape(-1, hidden_states.shape[-1])).view(*hidden_states.shape[:-1], -1)


def stored_weight(module: nn.Module, name: str = "weight") -> torch.Tensor | None:
    """`module.<name>`, or, where accelerate offloads it (a `device_map` with "cpu" / "disk" entries, `cpu_offload`,
    `disk_offload`: a meta placeholder between forwards), the stored copy its hook loads for each forward."""
    tensor = getattr(module, name, None)
    stored = getattr(getattr(module, "_hf_hook", None), "weights_map", None)
    if tensor is not None and tensor.device.type == "meta" and stored is not None:
        return stored[name]
    return tensor


def tensor_states(*tensors) -> list:
    """A weak reference to each tensor and its `_version` (its in-place writes); None for an inference tensor's, which
    counts none (made under `torch.inference_mode()`): `same_states` never takes such a tensor for unchanged."""
    return [None if t is None else (weakref.ref(t), None if t.is_inference() else t._version) for t in tensors]


def same_states(old: tuple, new: tuple) -> bool:
    """Whether two `(dtype, *tensor_states(...))` describe the same live tensors at the same known versions."""
    return old[0] == new[0] and all((a is None) == (b is None) and (a is None or (
        a[0]() is b[0]() and a[1] is not None and a[1] == b[1])) for a, b in zip(old[1:], new[1:]))


def _block_mask(key_mask, position_ids, block_len, past_len, window, causal=False) -> torch.Tensor | None:
    """Visibility `[batch, 1, block_len, keys]` of the keys `[cache ; context ; block]` for the block's queries:
    within `window` positions either way (`None`: any distance), only earlier ones where `causal`.

    Without a window, a key mask or causality everything is visible (None: no mask needed). Positions of cached keys
    are assumed contiguous before the first new position, which holds for the transformers native loop.
    """
    if window is None and key_mask is None and not causal:
        return None
    batch, new_len = position_ids.shape
    key_len = past_len + new_len
    visible = torch.ones(batch, 1, block_len, key_len, dtype=torch.bool, device=position_ids.device)
    if key_mask is not None:
        visible &= key_mask[:, None, None, -key_len:].bool()
    if window is not None or causal:
        first = position_ids[:, :1] - past_len
        key_pos = torch.cat([first + torch.arange(past_len, device=first.device), position_ids], dim=1)
        query_pos = position_ids[:, -block_len:]
        visible &= block_visibility(query_pos[:, None, :, None] - key_pos[:, None, None, :], window, causal)
    return visible


def block_visibility(distance: torch.Tensor, window: int | None, causal: bool) -> torch.Tensor:
    """Which keys (at query position - `distance`) a block query sees: within `window` either way, no later ones if
    `causal`."""
    visible = distance >= 0 if causal else torch.ones_like(distance, dtype=torch.bool)
    return visible if window is None else visible & (distance.abs() < window)


def _additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


__all__ = ["DFlashDraftModel", "DFlashAttention", "DFlashDecoderLayer"]
