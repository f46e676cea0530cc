"""DFlash2 drafters: the z-lab format both ways with the reference, the same drafts as the reference's selector, and
decoding through `generate` (greedy identity, trees, the fixed-shape path)."""

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModel

import hf_dflash
from hf_dflash import DFlash2Config, DFlash2DraftModel, DFlashDraftModel
from hf_dflash.bigram import conditional_chain
from hf_dflash.generation import DFlashProposer

from conftest import ARCHITECTURES, MASK, Recorder, left_padded, make_target, make_tokenizer

# The published drafters' layout: sliding-window layers that see the whole block (`is_causal: false`). A window
# shorter than the block checks that it is counted both ways.
CONFIG = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, vocab_size=100, layer_types=["sliding_attention"] * 2, sliding_window=6, num_target_layers=6,
    is_causal=False, dtype="float32",
)
BLOCK = dict(block_size=8, conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=4,
             target_layer_ids=[1, 3], mask_token_id=99)


def _reference():
    return pytest.importorskip("dflash.model", reason="the reference: pip install --no-deps dflash==0.1.0")


def _random_weights(model, seed=0):
    """Every tensor random (the reference leaves its base taps uninitialised), large enough that the convolutions
    and the selector change the drafts."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    return model.eval()


def _inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    context, noise = torch.randn(2, 5, 128, generator=g), torch.randn(2, 8, 64, generator=g)
    return context, noise, torch.arange(13)[None].expand(2, -1), torch.tensor([3, 7])


def _compare(ours, reference):
    """Hidden states, draft logits and the selector's greedy path of the two implementations, on the same inputs."""
    context, noise, positions, anchor = _inputs()
    head = torch.nn.Linear(64, 100, bias=False)
    with torch.no_grad():
        hidden = ours(noise_embeds=noise, context_hidden_states=context, position_ids=positions).last_hidden_state
        expected = reference(target_hidden=context, noise_embedding=noise, position_ids=positions)
        assert (hidden - expected).abs().max() < 1e-5
        logits = ours.compute_logits(hidden[:, 1:], head)
        assert (logits - reference.compute_logits(expected[:, 1:], head)).abs().max() < 1e-5
        path, candidates, _ = reference.propose(expected[:, 1:], anchor, head, 0.0)
        ids, probs = ours.candidates(hidden[:, 1:], head, anchor)
    assert torch.equal(ids.sort(-1).values, candidates.sort(-1).values)  # the reference's top-k is unsorted
    drafts, _ = conditional_chain(ids, probs)
    assert torch.equal(drafts, path)
    assert not torch.equal(drafts, logits.argmax(-1)), "the selector should change some drafts in this test"


def test_our_files_load_in_the_reference(tmp_path):
    reference = _reference()
    ours = _random_weights(DFlash2DraftModel(DFlash2Config(**CONFIG, dflash_config=BLOCK)))
    ours.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        names = set(f.keys())
    assert {"candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook"} <= names  # z-lab's
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"] and config["is_causal"] is False
    assert {k: config["dflash_config"][k] for k in BLOCK} == BLOCK
    _compare(ours, reference.DFlash2DraftModel.from_pretrained(tmp_path, dtype=torch.float32).eval())


def test_reference_files_load_here(tmp_path):
    reference = _reference()
    from transformers import Qwen3Config

    config = Qwen3Config(**CONFIG)
    config.dflash_config, config.architectures = dict(BLOCK), ["DFlash2DraftModel"]
    theirs = _random_weights(reference.DFlash2DraftModel(config))
    theirs.save_pretrained(tmp_path)
    loaded = AutoModel.from_pretrained(tmp_path, dtype=torch.float32)
    assert type(loaded) is DFlash2DraftModel
    _compare(loaded.eval(), theirs)
    # and as published, codebooks without `.weight`
    published = tmp_path / "published"
    loaded.save_pretrained(published)
    again = hf_dflash.DFlash2DraftModel.from_pretrained(published, dtype=torch.float32)
    codebooks = (model.candidate_selector.successor_codebook.weight for model in (again, theirs))
    assert torch.equal(*codebooks)


def test_a_dflash2_config_is_refused_by_the_dflash_class(tmp_path):
    DFlash2DraftModel(DFlash2Config(**CONFIG, dflash_config=BLOCK)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="DFlash2 drafter's config"):
        DFlashDraftModel.from_pretrained(tmp_path)


def test_a_new_dflash2_drafter_starts_as_dflash():
    """Identity base taps and no dynamic taps: a DFlash2 drafter given a DFlash drafter's weights (`--init-from`)
    computes the same hidden states until it trains."""
    target = make_target("qwen3")
    dflash = _random_weights(DFlashDraftModel.from_target(target, num_hidden_layers=2, block_size=4,
                                                          mask_token_id=MASK).to(torch.float64))
    dflash2 = DFlash2DraftModel.from_target(target, num_hidden_layers=2, block_size=4, mask_token_id=MASK,
                                            dflash_config={"conv_group_size": 8, "selector_rank": 8})
    assert dflash2.load_state_dict(dflash.state_dict(), strict=False).unexpected_keys == []
    g = torch.Generator().manual_seed(0)
    inputs = dict(noise_embeds=torch.randn(2, 4, 32, generator=g, dtype=torch.float64),
                  context_hidden_states=torch.randn(2, 5, 64, generator=g, dtype=torch.float64),
                  position_ids=torch.arange(9)[None].expand(2, -1))
    with torch.no_grad():
        torch.testing.assert_close(dflash2(**inputs).last_hidden_state, dflash(**inputs).last_hidden_state)


def make_dflash2(target, block_size=4, seed=1, **kwargs):
    torch.manual_seed(seed)
    drafter = DFlash2DraftModel.from_target(
        target, num_hidden_layers=1, block_size=block_size, mask_token_id=MASK,
        dflash_config={"conv_kernel_size": 2, "conv_group_size": 8, "selector_rank": 8, "selector_top_k": 4}, **kwargs,
    )
    return _random_weights(drafter, seed).to(target.dtype)


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_identity(arch, batch):
    target = make_target(arch)
    drafter = make_dflash2(target)
    ids, mask = left_padded(batch)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
    for tree in (0, 6, "auto"):
        out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, assistant_model=drafter,
                              draft_tree_size=tree, assistant_confidence_threshold=0.0)
        assert torch.equal(out, plain), (arch, batch, tree)


def test_generate_features_with_dflash2():
    """What the DFlash path serves, with a DFlash2 drafter: stop strings, a streamer, scores, a custom criterion
    (greedy: the same as plain `generate`), num_return_sequences with sampling."""
    target = make_target("qwen3", dtype=torch.float64)
    drafter = make_dflash2(target)
    tokenizer = make_tokenizer()
    ids, mask = left_padded(3)
    unbounded = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=16)
    stop = tokenizer.decode(unbounded[0, ids.shape[1] + 5 : ids.shape[1] + 7])  # row 0 stops at its 7th token
    eos = next(t for t in range(2, 95) if t not in set(unbounded.flatten().tolist()))  # pads the stopped rows
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=16, stop_strings=[stop], tokenizer=tokenizer,
                  eos_token_id=eos, output_scores=True, return_dict_in_generate=True)
    plain_stream, stream = Recorder(), Recorder()
    plain = target.generate(ids, streamer=plain_stream, **kwargs)
    out = target.generate(ids, streamer=stream, assistant_model=drafter, draft_tree_size=0,
                          assistant_confidence_threshold=0.0, **kwargs)
    assert torch.equal(out.sequences, plain.sequences)
    assert tokenizer.decode(out.sequences[0, ids.shape[1] :], skip_special_tokens=True).endswith(stop)
    # while every row runs (a finished row's later scores are filler, which differs)
    torch.testing.assert_close(torch.stack(out.scores[:7]), torch.stack(plain.scores[:7]))
    # after the prompt: plain streams a token per row per step, DFlash each step's committed tokens [rows, n]
    assert torch.equal(torch.cat(stream.chunks[1:], -1), torch.stack(plain_stream.chunks[1:], -1))
    assert stream.ends == plain_stream.ends == 1
    torch.manual_seed(0)
    sampled = target.generate(ids, attention_mask=mask, do_sample=True, max_new_tokens=8, num_return_sequences=2,
                              assistant_model=drafter)
    assert sampled.shape == (6, ids.shape[1] + 8) and torch.equal(sampled[::2, : ids.shape[1]], ids)


def test_the_chain_is_the_selectors_walk(monkeypatch):
    """In the loop, each step's drafts are the selector's greedy path, which differs from the per-position argmax."""
    from hf_dflash.generation import DFlashProposer

    target = make_target("qwen3")
    drafter = make_dflash2(target)
    seen = []
    original = DFlashProposer.conditional_candidates

    def spy(self, decoder, verify_len, k):
        ids, probs = original(self, decoder, verify_len, k)
        seen.append((ids, probs))
        return ids, probs

    monkeypatch.setattr(DFlashProposer, "conditional_candidates", spy)
    ids, mask = left_padded(1)
    result = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12, assistant_model=drafter,
                             draft_tree_size=0, assistant_confidence_threshold=0.0)
    assert torch.equal(result, target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12))
    assert seen and all(ids.shape[-1] == 4 and probs.shape[-2:] == (4, 4) for ids, probs in seen)
    walks = [conditional_chain(ids, probs)[0] for ids, probs in seen]
    assert any(not torch.equal(walk, ids[..., 0]) for walk, (ids, _) in zip(walks, seen))


def test_fixed_shape_path_serves_dflash2():
    target = make_target("qwen3")
    drafter = make_dflash2(target)
    ids, mask = left_padded(3)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
    out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, assistant_model=drafter,
                          draft_tree_size=0, assistant_confidence_threshold=0.0, cache_implementation="static")
    assert torch.equal(out, plain)


@pytest.mark.parametrize("path", [{}, {"cache_implementation": "static"}])
def test_sampling_is_exact_with_dflash2(monkeypatch, path):
    """Under sampling the chain is drawn from the selector's distribution, each draft under the one before it, and
    the rejection step reads that distribution: a G-test against the enumerated distribution (the harness of
    test_sampling), on the general loop and on the fixed-shape one."""
    from test_sampling import VOCAB, assert_samples_the_target_distribution, sampling_target

    proposals = []
    real_sample_chain = DFlashProposer.sample_chain

    def sample_chain(self, decoder, verify_len):
        drafts, confidence, (ids, q) = real_sample_chain(self, decoder, verify_len)
        assert ids.shape[-1] == self.drafter.config.dflash_config["selector_top_k"]
        proposals.append(q)
        return drafts, confidence, (ids, q)

    monkeypatch.setattr(DFlashProposer, "sample_chain", sample_chain)

    target = sampling_target()
    torch.manual_seed(1)
    drafter = DFlash2DraftModel.from_target(
        target, num_hidden_layers=1, block_size=4, mask_token_id=VOCAB - 1,
        dflash_config={"conv_kernel_size": 2, "conv_group_size": 8, "selector_rank": 8, "selector_top_k": 4},
    )
    assert_samples_the_target_distribution(target, _random_weights(drafter, 2), **path)
    assert proposals and all(torch.allclose(q.sum(-1), torch.ones(())) for q in proposals)


def test_the_convolutions_stay_inside_each_block():
    """Training lays blocks of B one after the other: with `block_len=B` each block is convolved as if alone."""
    from hf_dflash.modeling.modeling_dflash2 import GroupedDynamicCausalConv

    conv = _random_weights(GroupedDynamicCausalConv(DFlash2Config(**{**CONFIG, "dtype": "float64"},
                                                                  dflash_config={**BLOCK, "conv_kernel_size": 3})))
    conv = conv.double()
    blocks = torch.randn(2, 3 * 4, 64, dtype=torch.float64)
    together, taps = conv.prepare(blocks, block_len=4)
    for n in range(3):
        alone, alone_taps = conv.prepare(blocks[:, 4 * n : 4 * n + 4])
        torch.testing.assert_close(together[:, 4 * n : 4 * n + 4], alone)
        torch.testing.assert_close(conv.finish(blocks, taps, 4)[:, 4 * n : 4 * n + 4],
                                   conv.finish(blocks[:, 4 * n : 4 * n + 4], alone_taps))
    assert not torch.allclose(together, conv.prepare(blocks)[0])  # without it the taps reach across blocks


def test_one_training_step_updates_the_convolutions_and_the_selector():
    from hf_dflash.training import TrainingConfig, drafter_loss, slot_weights

    from test_training import one_step_inputs

    target = make_target("qwen3", dtype=torch.float32).requires_grad_(False)
    drafter = make_dflash2(target).float().train()
    before = {k: v.clone() for k, v in drafter.named_parameters()}
    batch, features = one_step_inputs(target, drafter)
    config = TrainingConfig(target="", data="", output="", block_size=4, architecture="dflash2", loss="ce",
                            selector_loss_alpha=1.0)
    loss, metrics = drafter_loss(drafter, target, batch, features, config, slot_weights(4))
    assert metrics["selector_count"] > 0  # the labels that are among the candidates train the selector
    unary_only, _ = drafter_loss(drafter, target, batch, features, TrainingConfig(
        **{**config.__dict__, "selector_loss_alpha": 0.0}), slot_weights(4))
    assert loss > unary_only
    loss.backward()
    torch.optim.AdamW(drafter.parameters(), lr=1e-2).step()
    for name, value in drafter.named_parameters():
        assert not torch.equal(value, before[name]), f"{name} did not change"


def test_train_a_dflash2_drafter_from_a_dflash_one(tmp_path):
    """`--architecture dflash2`, warm-started from a DFlash drafter (`--init-from`): its convolutions start as the
    identity, so the first loss is the DFlash drafter's; the saved folder is a DFlash2 drafter in the z-lab format."""
    from hf_dflash.training import TrainingConfig, train

    from conftest import make_tokenizer
    from test_training import tiny_data

    target = make_target("qwen3", dtype=torch.float32, vocab_size=48)
    tiny_data(target, tmp_path / "data.jsonl", n=8)
    common = dict(target="tiny", data=str(tmp_path / "data.jsonl"), block_size=4, mask_token_id=47, num_anchors=8,
                  batch_size=2, save_steps=1000, logging_steps=1, loss="ce")
    train(TrainingConfig(**common, output=str(tmp_path / "dflash"), max_steps=20, learning_rate=3e-3),
          target=target, tokenizer=make_tokenizer(48))
    config = TrainingConfig(**common, output=str(tmp_path / "dflash2"), max_steps=20, learning_rate=3e-3,
                            architecture="dflash2", selector_rank=8, init_from=str(tmp_path / "dflash"),
                            selector_loss_alpha=0.0)
    train(config, target=target, tokenizer=make_tokenizer(48))
    log = [json.loads(line) for line in (tmp_path / "dflash2" / "train_log.jsonl").read_text().splitlines()]
    dflash_log = [json.loads(line) for line in (tmp_path / "dflash" / "train_log.jsonl").read_text().splitlines()]
    first = [r for r in log if "loss" in r][0]
    assert "selector_accuracy" in first
    assert first["loss"] < [r for r in dflash_log if "loss" in r][0]["loss"]  # starts where the DFlash run ended
    loaded = AutoModel.from_pretrained(tmp_path / "dflash2")
    assert type(loaded) is DFlash2DraftModel and loaded.config.selector_rank == 8
