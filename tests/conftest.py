"""Tiny random targets built from configs, and an oracle drafter for the multi-token paths."""

import random

import pytest
import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from transformers.generation.streamers import BaseStreamer

import hf_dflash
from hf_dflash import DFlashDraftModel
from hf_dflash.generation import DFlashProposer

# Tiny models gain nothing from threads, and OpenMP threads spinning on a shared 2-core machine slow small ops 100x.
torch.set_num_threads(1)

VOCAB = 96
MASK = VOCAB - 1
PAD = 0
DIMS = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=256,
    pad_token_id=PAD,
    bos_token_id=1,
    eos_token_id=None,
)
ARCHITECTURES = {
    "qwen3": (Qwen3ForCausalLM, Qwen3Config, {}),
    "llama": (LlamaForCausalLM, LlamaConfig, {"tie_word_embeddings": True}),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config, {}),
    "mistral": (MistralForCausalLM, MistralConfig, {"sliding_window": 5}),
    # scaled embeddings and alternating sliding-window layers shorter than the outputs
    "gemma3": (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        {"sliding_window": 6, "layer_types": ["sliding_attention", "full_attention"] * 2},
    ),
}


def make_target(arch: str = "qwen3", dtype=torch.float64, seed: int = 0, **overrides):
    model_class, config_class, extra = ARCHITECTURES[arch]
    torch.manual_seed(seed)
    config = config_class(**{**DIMS, **extra, **overrides})
    return model_class(config).to(dtype).eval()


# Hybrid targets (linear-attention or state-space layers beside attention): a layer pattern with both kinds in 4 layers,
# and the small state sizes a 32-wide model needs. Float32 where an op has no float64 kernel (grouped MoE matmuls).
LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8)
MOE = dict(moe_intermediate_size=16, shared_expert_intermediate_size=16, num_experts=4, num_experts_per_tok=2)
MAMBA = dict(mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16)
HYBRIDS = {
    "qwen3_5_text": (LINEAR, torch.float64),
    "qwen3_5_moe_text": ({**LINEAR, **MOE}, torch.float32),
    "qwen3_next": ({**LINEAR, **MOE}, torch.float32),
    "falcon_h1": ({**MAMBA, "mamba_d_ssm": 64}, torch.float64),  # attention and Mamba side by side in each layer
    "nemotron_h": (dict(layers_block_type=["linear_attention", "full_attention", "linear_attention", "mlp"],
                        mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=1), torch.float32),
    "granitemoehybrid": (dict(layer_types=["linear_attention", "full_attention"] * 2, num_local_experts=2, **MAMBA),
                         torch.float32),
    "jamba": (dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, num_experts=2), torch.float32),
    "bamba": (dict(attn_layer_indices=[1, 3], **MAMBA), torch.float32),
    "zamba2": (dict(layers_block_type=["linear_attention", "hybrid"] * 2, hybrid_layer_ids=[1, 3], n_mamba_heads=4,
                    mamba_headdim=16, mamba_d_state=16), torch.float32),
    "lfm2": (dict(layer_types=["conv", "full_attention"] * 2), torch.float64),  # short convolutions, no recurrence
}


def make_hybrid(model_type: str = "qwen3_5_text", seed: int = 0, **overrides):
    """A tiny random hybrid target of `model_type` (a key of `HYBRIDS`), in its `HYBRIDS` dtype."""
    from transformers import AutoConfig, AutoModelForCausalLM

    extra, dtype = HYBRIDS[model_type]
    # a wider init than the default 0.02: with it, the recurrent states matter to the argmax, so a wrong rollback
    # changes the tokens (checked by breaking it: 8 of the 10 types then differ from plain; LFM2 has no recurrent
    # state, and its convolution windows are checked the same way)
    config = AutoConfig.for_model(model_type, **{**DIMS, "initializer_range": 0.2, **extra, **overrides})
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).to(dtype).eval()


def make_drafter(target, block_size: int = 4, num_hidden_layers: int = 1, seed: int = 1, **kwargs):
    torch.manual_seed(seed)
    kwargs.setdefault("mask_token_id", MASK)
    drafter = DFlashDraftModel.from_target(target, num_hidden_layers=num_hidden_layers, block_size=block_size, **kwargs)
    return drafter.eval()


def left_padded(batch: int, lengths=None, seed: int = 0):
    """Random prompts with different lengths, left-padded: (input_ids, attention_mask)."""
    g = torch.Generator().manual_seed(seed)
    lengths = lengths or [7 - (i % 3) * 2 for i in range(batch)]
    width = max(lengths)
    ids = torch.randint(2, MASK, (batch, width), generator=g)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, width - length :] = 1
    return ids.masked_fill(mask == 0, PAD), mask


class Oracle:
    """Drafts the target's own greedy continuation (computed from each row's committed tokens), right up to a
    position: `correct_upto=None` keeps all drafts right, an int k keeps the first k, "random" picks k per row and
    step. The real drafter still runs first, so its cache bookkeeping is exercised too."""

    def __init__(self, correct_upto=None, seed: int = 0):
        self.correct_upto = correct_upto
        self.rng = random.Random(seed)
        self.calls = 0

    def __call__(self, proposer, decoder, verify_len):
        drafts, confidence = _REAL_CHAIN(proposer, decoder, verify_len)
        self.calls += 1
        rows = []
        for r in decoder.rows.tolist():
            ids = decoder.sequences[r, : decoder.lengths[r]][None]
            padding = (torch.arange(ids.shape[1]) < decoder.prompt_len) & (ids == PAD)  # prompts never hold PAD
            for _ in range(verify_len - 1):
                mask = torch.cat([~padding, torch.ones(1, ids.shape[1] - padding.shape[1], dtype=torch.bool)], 1)
                positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
                logits = decoder.target(ids, attention_mask=mask.long(), position_ids=positions).logits[:, -1].float()
                ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
            continuation = ids[0, -(verify_len - 1) :].clone()
            k = self.correct_upto
            if k == "random":
                k = self.rng.randint(0, verify_len - 1)
            if k is not None:
                continuation[k:] = (continuation[k:] + 1) % MASK  # wrong from position k on
            rows.append(continuation)
        return torch.stack(rows).to(drafts.device), confidence


_REAL_CHAIN = DFlashProposer.draft_chain


@pytest.fixture
def oracle(monkeypatch):
    """oracle(correct_upto=...) installs an Oracle as the drafting step and returns it."""

    def install(correct_upto=None, seed: int = 0) -> Oracle:
        instance = Oracle(correct_upto, seed)
        monkeypatch.setattr(DFlashProposer, "draft_chain", lambda self, decoder, n: instance(self, decoder, n))
        # under sampling too: point-mass drafts, not drafts drawn from the drafter
        monkeypatch.setattr(DFlashProposer, "sample_chain",
                            lambda self, decoder, n: (*instance(self, decoder, n), None))
        return instance

    return install


class ForwardCounter:
    """Counts the target forwards of a generation loop (calls that use a KV cache, so the oracle's own
    cache-free calls are not counted) and the tokens each one read, with a forward pre-hook."""

    def __init__(self, model):
        self.tokens = []

        def count(module, args, kwargs):
            if kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None:
                ids = kwargs.get("input_ids", args[0] if args else None)
                self.tokens.append(ids.shape[1])

        self.handle = model.register_forward_pre_hook(count, with_kwargs=True)

    def remove(self) -> None:
        self.handle.remove()

    @property
    def calls(self) -> int:
        return len(self.tokens)


@pytest.fixture(autouse=True)
def _hooks_installed():
    hf_dflash.install_hooks()
    yield


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """Each test's train() may pick its own mixed precision: accelerate's process-wide state would refuse a change."""
    yield
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


def make_tokenizer(vocab_size: int = VOCAB):
    """An in-memory tokenizer for the tiny targets: one printable character per token id, `<pad>` = PAD, `<s>` = 1,
    `<mask>` = the last id. Decoding concatenates characters, so token boundaries never add text."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD, "<s>": 1, "<mask>": vocab_size - 1}
    vocab.update({chr(33 + i): i + 2 for i in range(vocab_size - 3)})  # "!" .. : ids 2 .. vocab_size - 2
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<mask>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", mask_token="<mask>", padding_side="left"
    )


class Recorder(BaseStreamer):
    """A streamer that keeps every chunk `put` gives it and counts `end` calls."""

    def __init__(self):
        self.chunks, self.ends = [], 0

    def put(self, value):
        self.chunks.append(value.clone())

    def end(self):
        self.ends += 1
