"""The drafter model: same function as the reference implementation, z-lab checkpoint layouts in and out, and
`from_target` on every tiny architecture."""

import copy
import json
import pickle

import pytest
import torch
from dflash.model import DFlashDraftModel as ReferenceDraftModel
from safetensors.torch import load_file, save_file
from transformers import AutoModel, DynamicCache

from hf_dflash import DFlashConfig, DFlashDraftModel, default_target_layer_ids

from conftest import ARCHITECTURES, DIMS, MASK, make_drafter, make_target

HIDDEN = DIMS["hidden_size"]
SLIDING = dict(layer_types=["sliding_attention", "full_attention"], sliding_window=3, use_sliding_window=True)


def randomized(drafter: DFlashDraftModel) -> DFlashDraftModel:
    """Every parameter random (norm weights too, which start at one), so nothing can cancel by accident."""
    torch.manual_seed(2)
    with torch.no_grad():
        for parameter in drafter.parameters():
            parameter.normal_(0, 0.3)
    return drafter


def both_from(tmp_path, drafter):
    """Our class and the reference class loaded from one saved folder, in float64."""
    drafter.save_pretrained(tmp_path)
    ours = DFlashDraftModel.from_pretrained(tmp_path, dtype=torch.float64).eval()
    reference = ReferenceDraftModel.from_pretrained(tmp_path, dtype=torch.float64).eval()
    return ours, reference


def draft_inputs(batch: int, context_len: int, block_len: int, start: int, num_features: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    context = torch.randn(batch, context_len, num_features * HIDDEN, generator=g, dtype=torch.float64)
    noise = torch.randn(batch, block_len, HIDDEN, generator=g, dtype=torch.float64)
    positions = torch.arange(start, start + context_len + block_len)[None].expand(batch, -1)
    return context, noise, positions


@pytest.mark.parametrize("layers", ["full", "sliding"])
@pytest.mark.parametrize("use_cache", [False, True])
def test_same_function_as_the_reference(tmp_path, layers, use_cache):
    """Batch of 3 rows, float64. With a cache: several steps of new context + a block, the block's keys/values
    cropped after each step as both decode loops do; the sliding window (3) is shorter than the block (4)."""
    target = make_target("qwen3")
    extra = SLIDING if layers == "sliding" else {}
    drafter = make_drafter(target, block_size=4, num_hidden_layers=2, target_layer_ids=[0, 2], **extra)
    ours, reference = both_from(tmp_path, randomized(drafter))
    assert [layer.self_attn.sliding_window for layer in reference.layers] == (
        [3, None] if layers == "sliding" else [None, None]
    )
    block = 4
    steps = [6, 2, 3, 1, 5] if use_cache else [6]
    caches = []
    for model in (ours, reference):
        cache = DynamicCache(config=model.config) if use_cache else None
        if cache is not None:
            cache.activate_past_recording()  # sliding layers must be able to drop the block again
        caches.append(cache)
    start = 0
    with torch.no_grad():
        for step, context_len in enumerate(steps):
            context, noise, positions = draft_inputs(3, context_len, block, start, 2, seed=step)
            mine = ours(noise, context, positions, cache=caches[0]).last_hidden_state
            theirs = reference(
                positions, noise_embedding=noise, target_hidden=context, past_key_values=caches[1], use_cache=use_cache
            )
            torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-12)
            assert not torch.allclose(mine[0], mine[1])  # rows differ: batch rows are not mixed up
            for cache in caches if use_cache else []:
                cache.crop(-block)
            start += context_len
    if use_cache:
        assert caches[0].get_seq_length() == caches[1].get_seq_length()


def test_output_head_and_embedding_extras_match_the_reference(tmp_path):
    target = make_target("qwen3")
    extras = {"input_embedding_scale": 2.5, "output_multiplier": 0.5, "final_logit_softcapping": 1.5}
    ours, reference = both_from(tmp_path, make_drafter(target, dflash_config=extras))
    hidden = torch.randn(2, 3, HIDDEN, dtype=torch.float64)
    head = target.get_output_embeddings()
    torch.testing.assert_close(ours.compute_logits(hidden, head), reference.compute_logits(hidden, head))
    assert ours.compute_logits(hidden, head).abs().max() <= 1.5  # soft-capped
    ids = torch.tensor([[3, MASK, MASK]])
    expected = target.get_input_embeddings().weight[ids] * 2.5  # the reference's raw rows times the scale
    torch.testing.assert_close(ours.embed(target, ids), expected)


# --- z-lab checkpoint layouts ---------------------------------------------------------------------------------

ZLAB_NAMES = sorted(
    [f"layers.{i}.self_attn.{p}_proj.weight" for i in range(2) for p in "qkvo"]
    + [f"layers.{i}.self_attn.{p}_norm.weight" for i in range(2) for p in "qk"]
    + [f"layers.{i}.mlp.{p}_proj.weight" for i in range(2) for p in ("gate", "up", "down")]
    + [f"layers.{i}.{n}.weight" for i in range(2) for n in ("input_layernorm", "post_attention_layernorm")]
    + ["fc.weight", "hidden_norm.weight", "norm.weight"]
)


def zlab_config(**changes) -> dict:
    """A config.json as z-lab writes it (older layout: block_size top level, rope_theta top level)."""
    config = {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3",
        "attention_bias": False,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 256,
        "vocab_size": 96,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "block_size": 8,
        "num_target_layers": 4,
        "dflash_config": {"mask_token_id": MASK, "target_layer_ids": [0, 2]},
    }
    config.update(changes)
    return {k: v for k, v in config.items() if v is not None}


def write_checkpoint(folder, config: dict) -> dict[str, torch.Tensor]:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    g = torch.Generator().manual_seed(0)
    shapes = DFlashDraftModel(DFlashConfig.from_dict(zlab_config())).state_dict()
    tensors = {name: torch.randn(shapes[name].shape, generator=g) for name in ZLAB_NAMES}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return tensors


LAYOUTS = {
    "block_size_top_level": zlab_config(),
    "block_size_in_dflash_config": zlab_config(
        block_size=None, dflash_config={"mask_token_id": MASK, "target_layer_ids": [0, 2], "block_size": 8}
    ),
    "rope_parameters": zlab_config(rope_theta=None, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    "sliding_window": zlab_config(**SLIDING),
    "extra_dflash_keys": zlab_config(
        dflash_config={
            "mask_token_id": MASK,
            "target_layer_ids": [0, 2],
            "block_size": 8,
            "input_embedding_scale": 2.0,
            "output_multiplier": 0.75,
            "final_logit_softcapping": 30.0,
        }
    ),
}


@pytest.mark.parametrize("loader", ["DFlashDraftModel", "AutoModel"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_zlab_layouts_load_and_save(tmp_path, layout, loader):
    tensors = write_checkpoint(tmp_path / "zlab", LAYOUTS[layout])
    cls = DFlashDraftModel if loader == "DFlashDraftModel" else AutoModel
    model, info = cls.from_pretrained(tmp_path / "zlab", output_loading_info=True)
    assert type(model) is DFlashDraftModel
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    for name, tensor in model.state_dict().items():
        if name in tensors:
            assert torch.equal(tensor, tensors[name]), name
    config = model.config
    assert (config.block_size, config.mask_token_id, config.target_layer_ids) == (8, MASK, [0, 2])
    assert config.num_target_layers == 4 and config.eos_token_id == 2
    assert config.rope_parameters["rope_theta"] == 1e6
    torch.testing.assert_close(model.rotary_emb.inv_freq[1].double(), torch.tensor(1e6 ** -0.25, dtype=torch.float64))
    if layout == "sliding_window":
        assert config.layer_types == SLIDING["layer_types"] and config.sliding_window == 3
        assert [layer.self_attn.sliding_window for layer in model.layers] == [3, None]

    model.save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert saved["architectures"] == ["DFlashDraftModel"] and saved["model_type"] == "qwen3"
    assert saved["dflash_config"]["mask_token_id"] == MASK and saved["dflash_config"]["target_layer_ids"] == [0, 2]
    assert saved["dflash_config"]["block_size"] == saved["block_size"] == 8
    written = LAYOUTS[layout]["dflash_config"]
    for key in ("input_embedding_scale", "output_multiplier", "final_logit_softcapping"):
        assert saved["dflash_config"].get(key) == written.get(key)
    assert sorted(load_file(tmp_path / "saved" / "model.safetensors")) == ZLAB_NAMES
    reloaded = DFlashDraftModel.from_pretrained(tmp_path / "saved").config.to_dict()
    assert {**reloaded, "_name_or_path": None} == {**config.to_dict(), "_name_or_path": None}


def test_saved_drafter_is_in_zlab_format(tmp_path):
    target = make_target("qwen3")
    make_drafter(target, num_hidden_layers=2, target_layer_ids=[0, 2]).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == ["DFlashDraftModel"]
    assert saved["model_type"] == "qwen3"
    assert saved["dflash_config"]["mask_token_id"] == MASK
    assert saved["dflash_config"]["target_layer_ids"] == [0, 2]
    assert "mask_token_id" not in saved and "target_layer_ids" not in saved  # only inside dflash_config
    assert saved["num_target_layers"] == 4
    assert sorted(load_file(tmp_path / "model.safetensors")) == ZLAB_NAMES  # no model. prefix, embedding, head, rotary


# --- from_target --------------------------------------------------------------------------------------------


def test_default_target_layer_ids_rule():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-8B
    assert default_target_layer_ids(36, 1) == [18]
    assert default_target_layer_ids(28, 3) == [1, 13, 25]
    assert DFlashConfig(num_target_layers=36, num_hidden_layers=5).target_layer_ids == [1, 9, 17, 25, 33]


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_from_target(arch):
    target = make_target(arch, eos_token_id=2)
    text = target.config
    drafter = make_drafter(target, num_hidden_layers=1)
    config = drafter.config
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "vocab_size", "bos_token_id", "eos_token_id", "pad_token_id", "max_position_embeddings"):
        assert getattr(config, key) == getattr(text, key), key
    assert config.num_target_layers == 4 and config.target_layer_ids == [2]  # one draft layer: the middle
    assert drafter.fc.weight.shape == (HIDDEN, HIDDEN)
    assert drafter.fc.weight.dtype == torch.float64  # the target's dtype
    deeper = make_drafter(
        make_target(arch, num_hidden_layers=8, **({"layer_types": ["sliding_attention", "full_attention"] * 4}
                                                   if arch == "gemma3" else {})),
        num_hidden_layers=3,
    )
    assert deeper.config.target_layer_ids == [1, 3, 5] and deeper.fc.weight.shape == (HIDDEN, 3 * HIDDEN)
    scaled = "input_embedding_scale" in config.dflash_config
    assert scaled == (arch == "gemma3")


def test_from_target_gemma_embedding_scale_and_soft_cap():
    target = make_target("gemma3", final_logit_softcapping=3.0)
    drafter = make_drafter(target)
    scale = float(target.get_input_embeddings().embed_scale)
    assert drafter.config.dflash_config["input_embedding_scale"] == pytest.approx(scale) == pytest.approx(HIDDEN**0.5)
    assert drafter.config.dflash_config["final_logit_softcapping"] == 3.0
    assert drafter.config.rope_parameters["rope_theta"] == target.config.rope_parameters["full_attention"]["rope_theta"]
    ids = torch.tensor([[5, 6, MASK, MASK]])
    out = target(ids, output_hidden_states=True)
    # the drafter's embedding and output head reproduce the target's own (scaled embedding, soft-capped logits)
    torch.testing.assert_close(drafter.embed(target, ids), target.get_input_embeddings()(ids))
    logits = drafter.compute_logits(out.hidden_states[-1], target.get_output_embeddings())
    torch.testing.assert_close(logits, out.logits)


def test_draft_tokens_fast_head_equals_compute_logits_argmax():
    target = make_target("qwen3")
    drafter = randomized(make_drafter(target))
    hidden = torch.randn(3, 5, HIDDEN, dtype=torch.float64)
    head = target.get_output_embeddings()
    expected = drafter.compute_logits(hidden, head).argmax(-1)
    assert torch.equal(drafter.draft_tokens(hidden, head, drafter.draft_head(head)), expected)
    assert torch.equal(drafter.draft_tokens(hidden, head), expected)


def test_draft_vocab_restricts_drafts_and_round_trips(tmp_path):
    target = make_target("qwen3")
    drafter = randomized(make_drafter(target))
    head = target.get_output_embeddings()
    hidden = torch.randn(4, 7, HIDDEN, dtype=torch.float64)
    allowed = torch.arange(3, 60, 3)
    drafter.set_draft_vocab(allowed.tolist())
    drafts = drafter.draft_tokens(hidden, head, drafter.draft_head(head))
    # the argmax over the full logits with every other token masked out
    logits = drafter.compute_logits(hidden, head)
    masked = torch.full_like(logits, float("-inf"))
    masked[..., allowed] = logits[..., allowed]
    assert torch.equal(drafts, masked.argmax(-1))
    assert torch.isin(drafts, allowed).all()
    # the confidence is the drafter's probability for its draft within the draft vocabulary
    same, confidence = drafter.draft_tokens(hidden, head, drafter.draft_head(head), return_confidence=True)
    assert torch.equal(same, drafts)
    torch.testing.assert_close(confidence, masked.float().softmax(-1).amax(-1))

    drafter.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["dflash_config"]["draft_vocab_size"] == len(allowed)
    for loaded in (DFlashDraftModel.from_pretrained(tmp_path), AutoModel.from_pretrained(tmp_path)):
        assert torch.equal(loaded.draft_vocab, allowed)
    # the reference reader ignores the extra tensor: the checkpoint stays a z-lab drafter
    reference = ReferenceDraftModel.from_pretrained(tmp_path, dtype=torch.float64)
    assert not hasattr(reference, "draft_vocab")

    drafter.set_draft_vocab(None)
    assert drafter.draft_vocab is None and "draft_vocab_size" not in drafter.config.dflash_config
    assert "draft_vocab" not in drafter.state_dict()


@pytest.mark.parametrize("ids", [[], [0, DIMS["vocab_size"]], [-1, 4]])
def test_draft_vocab_out_of_range_is_refused(ids):
    drafter = make_drafter(make_target("qwen3"))
    with pytest.raises(ValueError, match="draft vocabulary ids"):
        drafter.set_draft_vocab(ids)


def test_draft_head_gather_is_kept_until_its_inputs_change():
    target = make_target("qwen3")
    drafter = randomized(make_drafter(target)).float()  # a float32 drafter beside a float64 target: a copy
    head = target.get_output_embeddings()
    first = drafter.draft_head(head)
    assert drafter.draft_head(head) is first
    with torch.no_grad():
        head.weight[0] += 1.0  # an in-place write, as an optimizer step
    second = drafter.draft_head(head)
    assert second is not first and torch.equal(second[0].weight, head.weight.float())
    drafter.set_draft_vocab(range(10, 40))
    third = drafter.draft_head(head)
    assert torch.equal(third[0].weight, head.weight[10:40].float()) and torch.equal(third[1], torch.arange(10, 40))
    other = make_target("qwen3", seed=3).get_output_embeddings()
    assert torch.equal(drafter.draft_head(other)[0].weight, other.weight[10:40].float())
    # a head already in the drafter's dtype, unrestricted, is used as is and not kept
    drafter.set_draft_vocab(None)
    same_dtype = randomized(make_drafter(target))
    assert same_dtype.draft_head(head)[0].weight.data_ptr() == head.weight.data_ptr()
    assert same_dtype._draft_head_cache is None
    # a drafter holding the cache still copies and pickles (the cache is left out)
    assert drafter.draft_head(head) is drafter._draft_head_cache[1]
    for copied in (copy.deepcopy(drafter), pickle.loads(pickle.dumps(drafter))):
        assert copied._draft_head_cache is None and torch.equal(copied.fc.weight, drafter.fc.weight)
