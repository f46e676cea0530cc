"""The Markov head (`hf_dflash.markov`): children ranked under their own parent by a learned head, saved with the
drafter, trained on a frozen drafter, and lossless (it only changes which drafts are verified)."""

import json

import pytest
import torch

from conftest import MASK, left_padded, make_drafter, make_target
from hf_dflash import DFlashDraftModel
from hf_dflash.generation import _Decoder
from hf_dflash.markov import markov_probs
from test_bigram import with_prior
from test_complete import greedy
from test_training import tiny_data
from test_tree import SETTINGS, draw_tree, exact_distribution, g_test, small_drafter, small_target  # noqa: F401


def with_head(drafter, rank: int = 8, scale: float = 3.0, seed: int = 0):
    """A random head strong enough to change which candidate wins under most parents."""
    drafter.set_markov_head(rank)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.markov_head.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale / p.shape[-1] ** 0.5)
    return drafter


def record_proposals(monkeypatch) -> dict:
    """Each step's verified tree tokens, keyed by whether the drafter had a head."""
    proposals = {}
    real = _Decoder.propose

    def recording(self):
        tree = real(self)
        proposals.setdefault(self.markov is not None, []).append(tree.tokens.tolist())
        return tree

    monkeypatch.setattr(_Decoder, "propose", recording)
    return proposals


def test_markov_probs_keep_each_position_mass_and_the_first_position():
    target = make_target()
    drafter = with_head(make_drafter(target, block_size=5))
    rows, depth, k, H = 2, 4, 3, drafter.config.hidden_size
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(rows, depth, H, generator=g, dtype=drafter.dtype)
    ids = torch.randint(0, MASK, (rows, depth, k), generator=g)
    probs = torch.softmax(torch.randn(rows, depth, 10, generator=g), -1)[..., :k].sort(-1, descending=True).values
    head = target.get_output_embeddings().weight
    q = markov_probs(drafter, hidden, ids, probs, drafter.embed(target, ids[:, :-1]), head[ids[:, 1:]])
    assert q.shape == (rows, depth, k, k)
    torch.testing.assert_close(q[:, 0], probs.float()[:, :1].expand(-1, k, -1))  # the drafter's own, every parent
    torch.testing.assert_close(q.sum(-1), probs.float().sum(-1)[:, :, None].expand(-1, -1, k))
    assert not torch.allclose(q[:, 1:, 0], q[:, 1:, 1])  # children depend on the parent


def test_an_untrained_head_changes_no_draft(monkeypatch):
    target = make_target()
    drafter = make_drafter(target, block_size=5)
    ids, mask = left_padded(2)
    proposals = record_proposals(monkeypatch)
    for size in (0, 9):
        drafter.set_markov_head(None)
        plain = greedy(target, ids, mask, drafter, max_new_tokens=16, draft_tree_size=size)
        drafter.set_markov_head(8)  # out_proj starts at zero
        assert torch.equal(greedy(target, ids, mask, drafter, max_new_tokens=16, draft_tree_size=size), plain)
    assert proposals[True] == proposals[False]


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
@pytest.mark.parametrize("batch", [1, 3])
def test_head_is_lossless_and_changes_the_drafts(arch, batch, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DFLASH_CACHE", str(tmp_path))
    target = make_target(arch)
    drafter = make_drafter(target, block_size=5)
    ids, mask = left_padded(batch)
    plain = greedy(target, ids, mask, max_new_tokens=24)
    proposals = record_proposals(monkeypatch)
    for size in (0, 9, "auto"):
        drafter.set_markov_head(None)
        assert torch.equal(greedy(target, ids, mask, drafter, max_new_tokens=24, draft_tree_size=size), plain)
        with_head(drafter)
        assert torch.equal(greedy(target, ids, mask, drafter, max_new_tokens=24, draft_tree_size=size), plain)
        with_prior(drafter, MASK + 1)  # both: the head's probabilities, reweighted by the prior
        assert torch.equal(greedy(target, ids, mask, drafter, max_new_tokens=24, draft_tree_size=size), plain)
        drafter.set_bigram_prior(None, None)
    assert proposals[True] != proposals[False]  # the head did change what was verified


def test_head_samples_the_target_distribution(small_target, small_drafter):  # noqa: F811
    settings = SETTINGS["top_k_top_p"]
    with_head(small_drafter)
    try:
        for size in (0, 7):
            counts, _ = draw_tree(small_target, small_drafter, settings, tree_size=size, seed=3)
            g, threshold = g_test(counts, exact_distribution(small_target, settings))
            assert g < threshold
    finally:
        small_drafter.set_markov_head(None)


def test_head_is_saved_with_the_drafter_and_other_readers_skip_it(tmp_path):
    from dflash.model import DFlashDraftModel as ReferenceDraftModel

    target = make_target()
    drafter = with_head(make_drafter(target), rank=6)
    drafter.save_pretrained(tmp_path)
    loaded = DFlashDraftModel.from_pretrained(tmp_path)
    assert loaded.config.dflash_config["markov_head_rank"] == 6
    for name, tensor in drafter.markov_head.state_dict().items():
        torch.testing.assert_close(loaded.markov_head.state_dict()[name], tensor)
    reference = ReferenceDraftModel.from_pretrained(tmp_path, dtype=torch.float64)
    assert not any(name.startswith("markov_head.") for name in reference.state_dict())
    loaded.set_markov_head(None)
    assert loaded.markov_head is None and "markov_head_rank" not in loaded.config.dflash_config


def test_markov_head_command_trains_the_head_alone_and_keeps_the_folder(tmp_path):
    from hf_dflash.cli import main

    target = make_target("qwen3", dtype=torch.float32, vocab_size=48)
    target.save_pretrained(tmp_path / "target")
    tiny_data(target, tmp_path / "data.jsonl", n=16)
    drafter = make_drafter(target, block_size=4, mask_token_id=47)
    drafter.save_pretrained(tmp_path / "d")
    (tmp_path / "d" / "README.md").write_text("my card")
    weights = (tmp_path / "d" / "model.safetensors").read_bytes()
    assert main(["markov-head", str(tmp_path / "d"), "--data", str(tmp_path / "data.jsonl"), "--target",
                 str(tmp_path / "target"), "--output", str(tmp_path / "out"), "--rank", "16", "--steps", "400",
                 "--batch-size", "4", "--num-anchors", "8", "--learning-rate", "1e-2"]) == 0
    assert (tmp_path / "d" / "model.safetensors").read_bytes() == weights  # the source is left as it was
    written = DFlashDraftModel.from_pretrained(tmp_path / "out")
    assert written.config.dflash_config["markov_head_rank"] == 16
    for name, tensor in drafter.state_dict().items():  # the drafter itself frozen
        torch.testing.assert_close(written.state_dict()[name], tensor)
    assert written.markov_head.out_proj.weight.abs().sum() > 0
    log = [json.loads(line) for line in open(tmp_path / "out" / "markov_head_log.jsonl")]
    assert log[-1]["loss"] < 0.8 * log[0]["loss"] and log[-1]["accuracy"] > log[0]["accuracy"]
    assert (tmp_path / "out" / "README.md").read_text() == "my card"
