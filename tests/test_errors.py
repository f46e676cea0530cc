"""Misuse fails early with an error that names the problem (and the fix), instead of a shape error or silent junk."""

import pytest
from transformers import GenerationConfig
from transformers.modeling_outputs import CausalLMOutputWithPast

import hf_dflash
from hf_dflash import DFlashConfig, DFlashDraftModel

from conftest import MASK, left_padded, make_drafter, make_target, make_tokenizer


@pytest.fixture(scope="module")
def target():
    return make_target("qwen3")


@pytest.fixture(scope="module")
def drafter(target):
    return make_drafter(target)


def generate(target, drafter, ids, **kwargs):
    return target.generate(ids, do_sample=False, max_new_tokens=4, assistant_model=drafter, **kwargs)


def test_hidden_size_mismatch(drafter):
    other = make_target("qwen3", hidden_size=48)
    with pytest.raises(ValueError, match="hidden size 32, the target has 48"):
        generate(other, drafter, left_padded(1)[0])


def test_target_layer_ids_outside_the_target(target):
    deeper = make_target("qwen3", num_hidden_layers=8)
    drafter = make_drafter(deeper, target_layer_ids=[1, 6])  # valid for 8 layers, not for the 4-layer target
    with pytest.raises(ValueError, match=r"reads target layers \[6\], but the target has 4 layers"):
        generate(target, drafter, left_padded(1)[0])
    with pytest.raises(ValueError, match=r"target_layer_ids \[4\] are outside the target's 4 layers"):
        make_drafter(target, target_layer_ids=[1, 4])
    with pytest.raises(ValueError, match=r"target_layer_ids \[-1\] are outside"):
        DFlashConfig(target_layer_ids=[-1], num_target_layers=4)


def test_mask_token_outside_the_embedding_table(target):
    with pytest.raises(ValueError, match=r"mask_token_id=96 is outside the vocabulary \(0..95\)"):
        DFlashDraftModel.from_target(target, mask_token_id=96)
    with pytest.raises(ValueError, match="mask_token_id=96 is outside the vocabulary"):
        DFlashConfig(target_layer_ids=[1], vocab_size=96, mask_token_id=96)
    drafter = make_drafter(target)
    drafter.config.mask_token_id = 500  # set after construction, past the config's own validation
    with pytest.raises(ValueError, match="mask_token_id=500 is not a row of the target's embedding table"):
        generate(target, drafter, left_padded(1)[0])


@pytest.mark.parametrize("block_size", [0, 1])
def test_block_size_below_two(target, block_size):
    with pytest.raises(ValueError, match=f"block_size={block_size}: a DFlash block needs at least 2 tokens"):
        DFlashConfig(target_layer_ids=[1], block_size=block_size)
    with pytest.raises(ValueError, match=f"block_size={block_size}"):
        make_drafter(target, block_size=block_size)
    with pytest.raises(ValueError, match="block_size=1"):
        DFlashConfig(target_layer_ids=[1], dflash_config={"block_size": 1})  # the z-lab spelling


def test_config_without_target_layers():
    with pytest.raises(ValueError, match="no target_layer_ids and no num_target_layers"):
        DFlashConfig()


def test_beam_search(target, drafter):
    ids = left_padded(1)[0]
    with pytest.raises(ValueError, match="does not support beam search"):
        generate(target, drafter, ids, num_beams=2)
    with pytest.raises(ValueError, match="does not support beam search"):
        target.generate(ids, generation_config=GenerationConfig(num_beams=2, max_new_tokens=4), assistant_model=drafter)


def test_target_without_hidden_states(drafter):
    target = make_target("qwen3")
    target.register_forward_hook(
        lambda module, args, out: CausalLMOutputWithPast(logits=out.logits, past_key_values=out.past_key_values)
    )
    with pytest.raises(ValueError, match="returned no hidden_states"):
        generate(target, drafter, left_padded(1)[0])


def test_prompt_as_inputs_embeds(target, drafter):
    embeds = target.get_input_embeddings()(left_padded(1)[0])
    with pytest.raises(ValueError, match="needs input_ids"):
        target.generate(inputs_embeds=embeds, do_sample=False, max_new_tokens=4, assistant_model=drafter)


def test_explicit_api_rejects_other_drafters(target):
    with pytest.raises(TypeError, match="Expected a DFlashDraftModel, got Qwen3ForCausalLM"):
        hf_dflash.generate(target, make_target("qwen3", num_hidden_layers=1), left_padded(1)[0], max_new_tokens=2)


def test_drafter_loaded_as_a_causal_lm(target, drafter, tmp_path):
    """AutoModelForCausalLM reads a drafter folder as a Qwen3 model (missing weights initialised at random): as an
    assistant it would be an ordinary, useless one, so generate says how to load it."""
    from transformers import AutoModel, AutoModelForCausalLM

    drafter.save_pretrained(tmp_path)
    wrong = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=target.dtype)
    with pytest.raises(ValueError, match="DFlash drafter's checkpoint loaded as Qwen3ForCausalLM.*AutoModel"):
        generate(target, wrong, left_padded(1)[0])
    remote = AutoModel.from_pretrained(tmp_path, trust_remote_code=True, dtype=target.dtype)  # the folder's own class
    assert type(remote) is not DFlashDraftModel
    with pytest.raises(ValueError, match="loaded as DFlashDraftModel .*without trust_remote_code"):
        generate(target, remote, left_padded(1)[0])
    assistant = make_target("qwen3", seed=5)  # an ordinary assistant still goes to transformers
    assert generate(target, assistant, left_padded(1)[0]).shape[1] == left_padded(1)[0].shape[1] + 4


def test_from_target_needs_a_tokenizer_or_a_mask_token(target):
    with pytest.raises(ValueError, match="Cannot choose a mask token without the tokenizer.*mask_token_id="):
        DFlashDraftModel.from_target(target)


def test_default_mask_token_is_an_unused_padded_row():
    tokenizer = make_tokenizer()  # 96 tokens
    padded = make_target("qwen3", vocab_size=100)  # embedding rows 96..99 are padding the tokenizer never makes
    assert DFlashDraftModel.from_target(padded, tokenizer=tokenizer).config.mask_token_id == len(tokenizer) == 96
    # without padded rows, the tokenizer's own mask token
    exact = make_target("qwen3")
    assert DFlashDraftModel.from_target(exact, tokenizer=tokenizer).config.mask_token_id == MASK

