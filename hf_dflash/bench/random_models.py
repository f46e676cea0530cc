"""Random targets for measuring without weights: a named shape (`RANDOM_SHAPES`) or a config file built with random
weights on any device, with a matching random drafter (`build_random_models`), so a benchmark runs on a GPU without
downloading a model."""

import json
from pathlib import Path

import torch

# Shapes of public models (their config.json dims), for random targets; `draft_layers`: the drafter they get by
# default (z-lab's Qwen3-8B drafter has 5 layers).
RANDOM_SHAPES = {
    "qwen3-8b": dict(
        model_type="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, rope_theta=1e6, max_position_embeddings=40960,
        rms_norm_eps=1e-6, tie_word_embeddings=False, draft_layers=5,
    ),
    "smollm2-135m": dict(
        model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, head_dim=64, vocab_size=49152, rope_theta=1e5, max_position_embeddings=8192,
        rms_norm_eps=1e-5, tie_word_embeddings=True, draft_layers=2,
    ),
    # hybrid targets: 3 of every 4 layers Gated DeltaNet (`layer_types` defaults to that pattern)
    "qwen3.5-0.8b": dict(
        model_type="qwen3_5_text", hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
        num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=16,
        linear_key_head_dim=128, linear_value_head_dim=128, vocab_size=248320, tie_word_embeddings=True,
        draft_layers=5,
    ),
    "qwen3.5-4b": dict(
        model_type="qwen3_5_text", hidden_size=2560, intermediate_size=9216, num_hidden_layers=32,
        num_attention_heads=16, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32,
        linear_key_head_dim=128, linear_value_head_dim=128, vocab_size=248320, tie_word_embeddings=True,
        draft_layers=5,
    ),
    # for smoke tests: a few milliseconds per forward on a CPU
    "tiny": dict(
        model_type="qwen3", hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=256, rope_theta=1e6, max_position_embeddings=1024,
        tie_word_embeddings=False, draft_layers=1,
    ),
}



def random_target_config(spec: str):
    """A transformers config from a named shape (`RANDOM_SHAPES`), a config.json path or a folder holding one;
    returns (config, default drafter layers)."""
    from transformers import AutoConfig

    if spec in RANDOM_SHAPES:
        values = dict(RANDOM_SHAPES[spec])
    else:
        path = Path(spec)
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise FileNotFoundError(
                f"--random-target {spec!r}: not a named shape ({', '.join(RANDOM_SHAPES)}) nor a config.json file."
            )
        values = json.loads(path.read_text())
    layers = values.pop("draft_layers", 1)
    return AutoConfig.for_model(values.pop("model_type"), **values), layers


def build_random_models(spec: str, device, dtype, block_size: int = 16, num_draft_layers: int | None = None,
                        seed: int = 0):
    """(target, drafter) with random weights: the target from `random_target_config(spec)`, the drafter from
    `DFlashDraftModel.from_target` (the shape's drafter layers unless `num_draft_layers`), both built directly on
    `device` in `dtype` (an 8B model never passes through CPU memory). No stop token: every row generates
    max_new_tokens. The drafter's mask token is the last embedding row."""
    from transformers import AutoModelForCausalLM

    from ..modeling import DFlashDraftModel

    config, layers = random_target_config(spec)
    config.eos_token_id, config.pad_token_id = None, 0
    torch.manual_seed(seed)
    with torch.device(device):
        target = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
        target.generation_config.eos_token_id, target.generation_config.pad_token_id = None, 0
        drafter = DFlashDraftModel.from_target(
            target, num_hidden_layers=num_draft_layers or layers, block_size=block_size,
            mask_token_id=config.vocab_size - 1,
        ).eval()
    return target, drafter


def random_prompts(num_prompts: int, length: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    """Prompts of `length` random token ids, none the pad (0) or the drafter's mask token (the last id)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab_size - 1, (num_prompts, length), generator=generator).tolist()
