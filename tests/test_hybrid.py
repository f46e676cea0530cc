"""Hybrid targets: linear-attention (Gated DeltaNet), Mamba and short-convolution layers beside attention layers.
Each row's recurrent and convolution states must go on from its own last accepted token
(`hf_dflash.generation.linear_attention`), so rows accepting different lengths at batch > 1 with left padding are the
case that matters; the oracle drafter makes steps accept several tokens, "random" a different number per row."""

import pytest
import torch
from transformers import pipeline
from transformers.cache_utils import DynamicCache
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from hf_dflash import DFlashDraftModel, compile_everywhere, generate
from hf_dflash.generation import Decoder
from hf_dflash.generation.fixed_shape import FixedShapeDecoder
from hf_dflash.generation.tree import DraftTree

from conftest import HYBRIDS, MASK, ForwardCounter, Recorder, left_padded, make_drafter, make_hybrid, make_tokenizer
from test_cost_model import FLAT, STEEP, with_costs
from test_fixed_shape import REUSED_OUTPUTS, STATIC, loops_run
from test_sampling import assert_samples_the_target_distribution, greedy_oracle  # noqa: F401 (a fixture)
from test_tree import tree_oracle  # noqa: F401 (a fixture)


def logged(function):
    """What hf_dflash's generation modules log while `function()` runs (messages said once are said again)."""
    logger = logging.get_logger("hf_dflash.generation")
    type(logger).warning_once.cache_clear()
    with CaptureLogger(logger) as captured:
        function()
    return captured.out


@pytest.mark.parametrize("model_type", sorted(HYBRIDS))
@pytest.mark.parametrize("correct_upto", [None, "random"])
def test_oracle_drafter_matches_plain_greedy(model_type, correct_upto, oracle):
    target = make_hybrid(model_type)
    drafter = make_drafter(target, block_size=4)
    oracle(correct_upto)
    for batch in (1, 3):
        ids, mask = left_padded(batch)
        plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
        out = generate(target, drafter, ids, attention_mask=mask, do_sample=False, max_new_tokens=20,
                       return_dict_in_generate=True)
        assert torch.equal(out.sequences, plain)
        # several tokens a step, and under "random" different counts in one step's rows: per-row rollback
        assert max(max(row) for row in out.acceptance_lengths) > 1
        if correct_upto == "random" and batch == 3:
            assert any(len({row[k] for row in out.acceptance_lengths}) > 1 for k in range(3))


@pytest.mark.parametrize("decoder", [Decoder, FixedShapeDecoder])
def test_recorded_states_are_rolled_back_per_row(decoder, oracle, monkeypatch):
    """After each step, every row's linear-attention states equal those of a fresh prefill over its committed tokens
    (less the newest, which the next step reads): what plain decoding holds, row by row. On both paths (the fixed
    one keeps a stopped row frozen: its states are no one's)."""
    target = make_hybrid("qwen3_5_text")
    drafter = make_drafter(target, block_size=5)
    oracle("random")
    checked = []
    original = decoder.accept

    def accept_and_check(self, logits, tree, features):
        result = original(self, logits, tree, features)
        for i, r in enumerate(self.rows.tolist()):
            if decoder is FixedShapeDecoder and self.finished[r]:
                continue
            start = int(self.prompt_mask[r].long().argmax())  # the first real prompt token
            fresh = DynamicCache(config=target.config)
            target(self.sequences[r, start : self.lengths[r] - 1][None], cache=fresh, use_cache=True)
            for layer, expected in zip(self.cache.layers, fresh.layers):
                if hasattr(layer, "recurrent_states"):
                    # float64 targets, but the gated decay runs in float32 (`A_log.float()`); a wrong rollback is off
                    # by the states' own size (about 1)
                    for ours, fresh in ((layer.recurrent_states[0][i], expected.recurrent_states[0][0]),
                                        (layer.conv_states[0][i], expected.conv_states[0][0])):
                        torch.testing.assert_close(ours, fresh, rtol=1e-4, atol=1e-4)
            checked.append(r)
        return result

    monkeypatch.setattr(decoder, "accept", accept_and_check)
    ids, mask = left_padded(3)
    generate(target, drafter, ids, attention_mask=mask, do_sample=False, max_new_tokens=16,
             **(STATIC if decoder is FixedShapeDecoder else {}))
    assert sorted(set(checked)) == [0, 1, 2]


def test_qwen3_5_as_its_checkpoints_load_it(oracle, monkeypatch):
    """Qwen3.5 / 3.6 checkpoints load as `Qwen3_5ForConditionalGeneration` (a vision tower beside the text model):
    text-only prompts run through it."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    text = dict(HYBRIDS["qwen3_5_text"][0], vocab_size=MASK + 1, hidden_size=32, intermediate_size=64,
                num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0,
                eos_token_id=None, bos_token_id=1)
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32)
    config = AutoConfig.for_model("qwen3_5", text_config=text, vision_config=vision, image_token_id=MASK - 1,
                                  video_token_id=MASK - 2)
    torch.manual_seed(0)
    target = AutoModelForImageTextToText.from_config(config).double().eval()
    drafter = make_drafter(target, block_size=4)
    oracle("random")
    runs = loops_run(monkeypatch)
    ids, mask = left_padded(3)
    ids = ids.clamp(max=MASK - 3)  # no image or video tokens
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=16)
    for static in ({}, STATIC):  # both paths
        assert torch.equal(target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=16,
                                           assistant_model=drafter, **static), plain)
    assert runs == ["general", "fixed"]


def verified_trees(monkeypatch) -> list:
    """The trees each verification reads, recorded."""
    trees = []
    original = Decoder.verify_forward

    def record(self, tree: DraftTree):
        trees.append(tree)
        return original(self, tree)

    monkeypatch.setattr(Decoder, "verify_forward", record)
    return trees


@pytest.mark.parametrize("costs", [FLAT, STEEP])
def test_auto_chooses_chain_lengths(costs, monkeypatch):
    """"auto" on a hybrid target sizes chains (a recurrent layer cannot read a tree), by the same cost rule: a flat
    curve verifies the whole block, a steep one no drafts (the random drafter is unsure). Lossless either way."""
    target = make_hybrid("qwen3_next")
    drafter = make_drafter(target, block_size=4)
    ids, _ = left_padded(1)
    plain = target.generate(ids, do_sample=False, max_new_tokens=16)
    with_costs(monkeypatch, costs.__class__(costs.tokens, tuple(100 * t for t in costs.seconds)))
    trees = verified_trees(monkeypatch)
    counter = ForwardCounter(target)
    said = logged(lambda: trees.append(generate(target, drafter, ids, do_sample=False, max_new_tokens=16,
                                                 draft_tree_size="auto")))
    assert torch.equal(trees.pop(), plain)
    assert all(tree.is_chain for tree in trees)
    if costs is FLAT:  # nodes the drafter gives a chance pay: whole blocks (no trees, no wider than the block)
        assert max(counter.tokens[1:]) == 4
    else:
        assert counter.tokens[1:] == [1] * 15
    assert said == ""  # chains are what "auto" does here: nothing to warn of


def test_auto_is_lossless_with_measured_costs(tmp_path, monkeypatch):
    """The cost curve measured on the hybrid target itself (its timed forwards record and drop their states)."""
    monkeypatch.setenv("HF_DFLASH_CACHE", str(tmp_path))
    target = make_hybrid("qwen3_5_text")
    drafter = make_drafter(target, block_size=5)
    ids, mask = left_padded(3)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
    out = generate(target, drafter, ids, attention_mask=mask, do_sample=False, max_new_tokens=20,
                   draft_tree_size="auto")
    assert torch.equal(out, plain)
    assert len(list((tmp_path / "forward_costs").glob("forward_costs-*.json"))) == 1


def test_a_tree_size_verifies_chains_and_says_so(oracle, monkeypatch):
    target = make_hybrid("qwen3_5_text")
    drafter = make_drafter(target, block_size=4)
    oracle("random")
    trees = verified_trees(monkeypatch)
    ids, mask = left_padded(3)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=16)
    outs = []
    said = logged(lambda: outs.append(generate(target, drafter, ids, attention_mask=mask, do_sample=False,
                                               max_new_tokens=16, draft_tree_size=6)))
    assert torch.equal(outs[0], plain)
    assert trees and all(tree.is_chain and tree.num_drafts == 3 for tree in trees[:-1])
    assert "qwen3_5_text targets verify chains of drafts, not trees" in said


# the types whose linear layers keep one state each under `layer_types`' "linear_attention" (`RowLinearLayer`)
FIXED_SHAPE = {"bamba", "granitemoehybrid", "jamba", "qwen3_5_moe_text", "qwen3_5_text", "qwen3_next"}


@pytest.mark.parametrize("model_type", sorted(HYBRIDS))
def test_the_fixed_shape_path(model_type, oracle, monkeypatch):
    """`cache_implementation="static"`: the fixed-shape path where its static layers serve the type, else the general
    loop, said once; plain's tokens either way, rows accepting different lengths."""
    runs = loops_run(monkeypatch)
    target = make_hybrid(model_type)
    drafter = make_drafter(target, block_size=4)
    oracle("random")
    for batch in (1, 3):
        ids, mask = left_padded(batch)
        plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=16)
        outs = []
        said = logged(lambda ids=ids, mask=mask, outs=outs: outs.append(generate(
            target, drafter, ids, attention_mask=mask, do_sample=False, max_new_tokens=16,
            return_dict_in_generate=True, **STATIC)))
        assert torch.equal(outs[0].sequences, plain)
        assert max(max(row) for row in outs[0].acceptance_lengths) > 1
    assert any(len({row[k] for row in outs[0].acceptance_lengths}) > 1 for k in range(3))  # batch 3's rows
    if model_type in FIXED_SHAPE:
        assert runs == ["fixed"] * 2
    else:
        assert runs == ["general"] * 2 and f"runs on the general loop, because of a {model_type} target" in said


@pytest.mark.slow
@pytest.mark.parametrize("tree_size", [0, "auto"])
def test_fixed_shape_steps_compile_once(tree_size, oracle, tree_oracle, monkeypatch, request):
    """fullgraph=True, one graph per verification width and no recompile over a generation whose rows accept
    different lengths, nor in a second call with other prompt lengths; "auto" verifies chains of the widths it
    compiled (its candidates: one per position, right up to a depth of each row's own)."""
    torch._dynamo.reset()
    recompiles = torch._dynamo.config.patch(error_on_recompile=True)  # monkeypatch would delete the config entry
    recompiles.__enter__()
    request.addfinalizer(lambda: recompiles.__exit__(None, None, None))
    with_costs(monkeypatch, FLAT)
    widths = []
    real = FixedShapeDecoder.verify_forward
    monkeypatch.setattr(FixedShapeDecoder, "verify_forward",
                        lambda self, tree: widths.append((tree.is_chain, tree.tokens.shape[1])) or real(self, tree))
    target = make_hybrid("qwen3_5_text")
    drafter = make_drafter(target, block_size=4)
    compile_config = compile_everywhere(backend="aot_eager", fullgraph=True, mode=None)
    for seed, lengths in ((0, None), (1, [2, 8, 5])):
        ids, mask = left_padded(3, lengths=lengths, seed=seed)
        plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24)
        oracle("random", seed=seed)
        tree_oracle({0: [0, 0, 0], 1: [0, None], 2: [None]} if seed else {0: [0], 1: [0, 0, 0], 2: [0, 0]})
        out = generate(target, drafter, ids, attention_mask=mask, do_sample=False, max_new_tokens=24,
                       draft_tree_size=tree_size, compile_config=compile_config, return_dict_in_generate=True,
                       **STATIC)
        assert torch.equal(out.sequences, plain)
        assert any(len({row[k] for row in out.acceptance_lengths}) > 1 for k in range(3))
    assert all(chain for chain, _ in widths) and {width for _, width in widths} <= {1, 4}


def test_fixed_shape_reads_no_output_after_the_next_compiled_call(oracle):
    """Under a backend that overwrites earlier outputs at every compiled call, as CUDA graphs do: the recorded states
    are kept in the cache's own buffers, so the rollback after the verification reads what it recorded."""
    torch._dynamo.reset()
    target = make_hybrid("qwen3_next")
    drafter = make_drafter(target, block_size=4)
    oracle("random")
    ids, mask = left_padded(3)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=16)
    out = generate(target, drafter, ids, attention_mask=mask, do_sample=False, max_new_tokens=16,
                   compile_config=compile_everywhere(backend=REUSED_OUTPUTS.name, mode=None), **STATIC)
    assert torch.equal(out, plain)


SAMPLES = 6000


@pytest.mark.slow
def test_sampling_draws_the_target_distribution(greedy_oracle):
    """6000 rows in one call, rows accepting different lengths every step, against the enumerated distribution."""
    target = make_hybrid("qwen3_5_text", vocab_size=8, initializer_range=0.3, seed=3).float()
    torch.manual_seed(1)
    drafter = DFlashDraftModel.from_target(target, block_size=4, mask_token_id=7).eval()
    assert_samples_the_target_distribution(target, drafter, samples=SAMPLES)


def test_generate_features_on_a_hybrid_target(oracle):
    """Stop strings, a streamer, scores and logits, rows finishing at different steps and num_return_sequences, as
    plain `generate` gives them."""
    target = make_hybrid("qwen3_next")
    drafter = make_drafter(target, block_size=4)
    tokenizer = make_tokenizer()
    oracle("random")
    ids, mask = left_padded(3)
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=16, return_dict_in_generate=True,
                  output_scores=True, output_logits=True)
    plain = target.generate(ids, **kwargs)
    out = target.generate(ids, assistant_model=drafter, **kwargs)
    assert torch.equal(out.sequences, plain.sequences)
    for ours, theirs in ((out.scores, plain.scores), (out.logits, plain.logits)):
        # float32: a block's forward and one-token steps round differently
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    streamed = []
    for assistant in (None, drafter):
        streamer = Recorder()
        target.generate(ids[:1], do_sample=False, max_new_tokens=16, streamer=streamer, assistant_model=assistant)
        streamed.append(torch.cat([chunk.reshape(-1) for chunk in streamer.chunks]))
    assert torch.equal(*streamed) and len(streamer.chunks) < 17  # the same tokens, several at a time
    stop = tokenizer.decode(plain.sequences[0, ids.shape[1] + 5 : ids.shape[1] + 7])
    stopped = dict(do_sample=False, max_new_tokens=16, stop_strings=[stop], tokenizer=tokenizer)
    assert torch.equal(target.generate(ids[:1], assistant_model=drafter, **stopped),
                       target.generate(ids[:1], **stopped))
    # rows stopping at different steps (an EOS in one row's continuation) leave the batch: the others' states follow
    eos = int(plain.sequences[1, ids.shape[1] + 6])
    stopping = dict(attention_mask=mask, do_sample=False, max_new_tokens=16, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(target.generate(ids, assistant_model=drafter, **stopping), target.generate(ids, **stopping))
    # num_return_sequences samples; top_k=1 makes each copy its prompt's greedy continuation, rows kept in order
    repeated = dict(attention_mask=mask, do_sample=True, top_k=1, max_new_tokens=12, num_return_sequences=2)
    assert torch.equal(target.generate(ids, assistant_model=drafter, **repeated),
                       plain.sequences[:, : ids.shape[1] + 12].repeat_interleave(2, dim=0))


def test_pipeline_with_a_hybrid_target(oracle):
    target = make_hybrid("qwen3_5_text")
    drafter = make_drafter(target, block_size=4)
    tokenizer = make_tokenizer()
    oracle()
    prompts = ["abcde", "xy"]
    plain = pipeline("text-generation", model=target, tokenizer=tokenizer)
    ours = pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=drafter)
    kwargs = dict(max_new_tokens=12, do_sample=False, batch_size=2)
    with torch.inference_mode():
        assert ours(prompts, **kwargs) == plain(prompts, **kwargs)


def test_layers_that_record_no_states_are_refused_by_name(monkeypatch):
    """A model whose linear-attention layers ignore `recurrent_states_to_keep` cannot be rolled back: a ValueError
    naming it at the first verification, not a wrong continuation."""
    target = make_hybrid("qwen3_5_text")
    drafter = make_drafter(target, block_size=4)
    monkeypatch.setattr(DynamicCache, "get_recurrent_states_to_keep", lambda self, layer_idx=None: 0)
    with pytest.raises(ValueError, match="qwen3_5_text targets.*recurrent_states_to_keep"):
        generate(target, drafter, left_padded(1)[0], do_sample=False, max_new_tokens=8)


def test_dflash2_drafters_serve_hybrid_targets():
    """A DFlash2 drafter (its selector walks the chain) on a hybrid target: chains and "auto" (chain lengths)."""
    from test_dflash2 import make_dflash2

    target = make_hybrid("qwen3_5_text")
    drafter = make_dflash2(target)
    ids, mask = left_padded(3)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
    for tree in (0, "auto"):
        out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, assistant_model=drafter,
                              draft_tree_size=tree, assistant_confidence_threshold=0.0)
        assert torch.equal(out, plain), tree
