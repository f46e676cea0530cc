"""transformers' own DFlash drafters (`muse_glimmer_assistant`) on hf-dflash's loop: the same function as the native
model, the target's greedy tokens (as transformers' own path gives them at batch 1) and its sampling distribution."""

import pytest
import torch
from transformers import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel
from transformers.cache_utils import DFlashCache

from hf_dflash import DFlashDraftModel
from hf_dflash.native import as_dflash_drafter, is_native_drafter

from conftest import ARCHITECTURES, DIMS, MASK, left_padded, make_target


def make_native(target=None, block_size=4, sliding_window=3, seed=1, scale=0.3, dtype=torch.float64):
    """A random native drafter for the tiny targets (weights spread enough that its drafts differ from row to row);
    a window shorter than the block checks how it is counted."""
    hidden = DIMS["hidden_size"] if target is None else target.config.hidden_size
    config = MuseGlimmerAssistantConfig(
        hidden_size=hidden, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, sliding_window=sliding_window, block_size=block_size, mask_token_id=MASK, target_layer_ids=[1, 2],
    )
    torch.manual_seed(seed)
    native = MuseGlimmerAssistantModel(config).eval()
    with torch.no_grad():
        for parameter in native.parameters():
            parameter.normal_(0, scale)
    return native.to(dtype)


def test_the_view_computes_what_the_native_model_computes():
    native = make_native(block_size=8, dtype=torch.float32)
    drafter = as_dflash_drafter(native, vocab_size=96)
    assert isinstance(drafter, DFlashDraftModel) and as_dflash_drafter(native, 96) is drafter  # built once
    shared = drafter.layers[0].self_attn.q_proj.weight, native.layers[0].self_attn.q_proj.weight
    assert shared[0].data_ptr() == shared[1].data_ptr()  # the same storage, not a copy
    assert set(native.state_dict()) == set(MuseGlimmerAssistantModel(native.config).state_dict())  # not a submodule
    g = torch.Generator().manual_seed(0)
    context, noise, positions = torch.randn(1, 5, 64, generator=g), torch.randn(1, 8, 32, generator=g), torch.arange(13)
    with torch.no_grad():
        cache = DFlashCache(config=native.config)
        cache.set_previous_accepted_tokens(5)  # as transformers' candidate generator calls it
        expected = native(noise_embeds=noise, context_hidden_states=context, position_ids=positions[None], cache=cache)
        ours = drafter(noise_embeds=noise, context_hidden_states=context, position_ids=positions[None])
    assert (ours.last_hidden_state - expected.last_hidden_state).abs().max() < 1e-5


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_identity(arch, batch):
    target = make_target(arch)
    native = make_native(target)
    assert is_native_drafter(native)
    ids, mask = left_padded(batch)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
    for tree in (0, 6):
        out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, assistant_model=native,
                              draft_tree_size=tree, assistant_confidence_threshold=0.0)
        assert torch.equal(out, plain), (arch, batch, tree)


def test_the_same_tokens_as_transformers_native_path():
    """At batch 1 transformers' own path (`speculation_type="dflash"`) and ours give the same tokens: the target's
    greedy ones (the hook steps aside for `speculation_type`, so the first call really is transformers' path)."""
    target = make_target("qwen3")
    native = make_native(target, scale=0.02)
    ids, mask = left_padded(1)
    common = dict(attention_mask=mask, do_sample=False, max_new_tokens=24, assistant_model=native)
    theirs = target.generate(ids, speculation_type="dflash", **common)
    ours = target.generate(ids, draft_tree_size=0, assistant_confidence_threshold=0.0, **common)
    assert torch.equal(ours, theirs)
    assert torch.equal(ours, target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24))


def test_sampling_is_exact_with_a_native_drafter():
    from test_sampling import VOCAB, assert_samples_the_target_distribution, sampling_target

    target = sampling_target()
    native = make_native(target, dtype=torch.float32)
    native.config.mask_token_id = VOCAB - 1
    assert_samples_the_target_distribution(target, native)
