"""The bigram prior (`hf_dflash.bigram`): counted as documented, children ranked under their own parent, saved with
the drafter, and lossless (it only changes which drafts are verified)."""

import itertools

import pytest
import torch

from hf_dflash import DFlashDraftModel
from hf_dflash.bigram import conditional_chain, conditional_probs, count_bigram_prior, lookup
from hf_dflash.generation import DFlashProposer
from hf_dflash.generation.tree import build_tree

from conftest import MASK, left_padded, make_drafter, make_target
from test_complete import greedy
from test_tree import SETTINGS, draw_tree, exact_distribution, g_test, small_drafter, small_target  # noqa: F401

# Supervised pairs (child masked in): (5,1) (1,2) (2,1) (1,2) and (3,1) (1,4). Children 1: 3, 2: 2, 4: 1 (6 in all);
# parent 1 is followed by 2 twice and by 4 once.
SAMPLES = [([5, 1, 2, 1, 2], [0, 1, 1, 1, 1]), ([3, 1, 4], [0, 1, 1])]


def test_count_bigram_prior_by_hand():
    keys, boosts = count_bigram_prior(SAMPLES, vocab_size=8, beta=1.0, mix=0.5, min_count=1)
    pairs = [(5, 1), (1, 2), (2, 1), (1, 4), (3, 1)]
    assert keys.tolist() == sorted(a * 8 + x for a, x in pairs)
    unigram = {1: 4 / 14, 2: 3 / 14, 4: 2 / 14}  # (count + 1) / (6 + 8)
    conditional = {(5, 1): 1, (1, 2): 2 / 3, (2, 1): 1, (1, 4): 1 / 3, (3, 1): 1}
    expected = {a * 8 + x: 1 + p / unigram[x] for (a, x), p in conditional.items()}  # mix / (1 - mix) = 1
    torch.testing.assert_close(boosts, torch.tensor([expected[k] for k in keys.tolist()], dtype=torch.float32))
    # the defaults: seen twice or more, (1 + 9 * P(x | a) / P(x)) ** 0.5
    keys, boosts = count_bigram_prior(SAMPLES, vocab_size=8)
    assert keys.tolist() == [1 * 8 + 2]
    torch.testing.assert_close(boosts, torch.tensor([(1 + 9 * (2 / 3) / (3 / 14)) ** 0.5]))
    keys, _ = count_bigram_prior(SAMPLES, vocab_size=8, min_count=1, draft_vocab=torch.tensor([1, 4]))
    assert sorted(k % 8 for k in keys.tolist()) == [1, 1, 1, 4]  # children the drafter cannot propose are left out


def test_count_bigram_prior_bad_input():
    with pytest.raises(ValueError, match="0 < mix < 1"):
        count_bigram_prior(SAMPLES, vocab_size=8, mix=1.0)
    for samples in ([([1, 2, 3], [0, 0, 0])], []):
        with pytest.raises(ValueError, match="no supervised tokens"):
            count_bigram_prior(samples, vocab_size=8)


def test_lookup_broadcasts_and_defaults_to_one():
    prior = (torch.tensor([1 * 10 + 2, 3 * 10 + 4]), torch.tensor([5.0, 7.0]), 10)
    boost = lookup(prior, torch.tensor([[1], [3], [9]]), torch.tensor([[2, 4]]))
    assert boost.tolist() == [[5.0, 1.0], [1.0, 7.0], [1.0, 1.0]]
    empty = (torch.zeros(0, dtype=torch.long), torch.zeros(0), 10)
    assert lookup(empty, torch.tensor([1]), torch.tensor([2])).tolist() == [1.0]


def test_conditional_probs_rank_children_under_their_parent():
    # position 1: 10 (.6), 11 (.3); position 2: 20 (.5), 21 (.4). The prior favours 21 after 10, and 11 after the
    # newest token 7, which the drafter reads itself: the first position keeps the drafter's own probabilities.
    ids = torch.tensor([[[10, 11], [20, 21]]])
    probs = torch.tensor([[[0.6, 0.3], [0.5, 0.4]]])
    prior = (torch.tensor([7 * 100 + 11, 10 * 100 + 21]), torch.tensor([1000.0, 4.0]), 100)
    cp = conditional_probs(ids, probs, prior)
    assert cp.shape == (1, 2, 2, 2)
    torch.testing.assert_close(cp.sum(-1), probs.sum(-1)[..., None].expand(1, 2, 2))  # the drafter's mass kept
    torch.testing.assert_close(cp[0, 0], probs[0, 0].expand(2, 2))  # the first position: the drafter's own
    torch.testing.assert_close(cp[0, 1, 0], torch.tensor([0.5, 1.6]) * 0.9 / 2.1)  # under 10
    torch.testing.assert_close(cp[0, 1, 1], probs[0, 1])  # under 11: nothing known, the drafter's own
    drafts, first = conditional_chain(ids, cp)
    assert drafts.tolist() == [[10, 21]]  # the drafter's own chain is 10, 20
    torch.testing.assert_close(first, torch.tensor([0.6]))


def test_conditional_build_tree_is_best_first_over_all_paths():
    g = torch.Generator().manual_seed(0)
    depth, k = 3, 3
    ids = (10 * torch.arange(1, depth + 1)[:, None] + torch.arange(k)).expand(1, depth, k)  # position d: 10d + rank
    cp = torch.rand(1, depth, k, k, generator=g).softmax(-1) * 0.9
    cp[:, 0] = cp[:, 0, :1]  # under the root: one row
    paths = {}  # every path of candidate indices, with its score
    for length in range(1, depth + 1):
        for path in itertools.product(range(k), repeat=length):
            score, parent = 1.0, 0
            for d, c in enumerate(path):
                score, parent = score * float(cp[0, d, parent, c]), c
            paths[tuple(int(ids[0, d, c]) for d, c in enumerate(path))] = score
    for budget in (1, 5, 13, 39):
        tree = build_tree(torch.tensor([7]), ids, cp, budget)
        best = sorted(paths.values(), reverse=True)[:budget]
        torch.testing.assert_close(tree.scores[0], torch.tensor(best, dtype=torch.float64))
        for slot in range(1, budget + 1):  # each node's token path has the score the tree gave it
            path, node = [], slot
            while node > 0:
                path.append(int(tree.tokens[0, node]))
                node = int(tree.parents[0, node])
            assert paths[tuple(path[::-1])] == pytest.approx(float(tree.scores[0, slot - 1]))


def test_conditional_build_tree_without_a_prior_is_the_plain_tree():
    g = torch.Generator().manual_seed(1)
    rows, depth, k = 3, 4, 5
    probs = torch.rand(rows, depth, 30, generator=g).softmax(-1).topk(k, dim=-1).values
    ids = torch.randint(2, 30, (rows, depth, k), generator=g)
    for budget in (3, 20):
        plain = build_tree(torch.zeros(rows, dtype=torch.long), ids, probs, budget)
        same = build_tree(torch.zeros(rows, dtype=torch.long), ids, probs[:, :, None].expand(-1, -1, k, -1), budget)
        for name in ("tokens", "parents", "depths", "scores"):
            assert torch.equal(getattr(plain, name), getattr(same, name)), name


def with_prior(drafter, vocab: int):
    """A prior that makes every even token far likelier than the drafter says, after any token: the drafts change
    wherever an even token is a candidate (even against a random drafter sure of its argmax)."""
    pairs = torch.arange(vocab * vocab)
    even = pairs[pairs % vocab % 2 == 0]
    drafter.set_bigram_prior(even, torch.full(even.shape, 1e12), beta=1.0)
    return drafter


def record_proposals(monkeypatch) -> dict:
    """Each step's verified tree tokens from here on, keyed by whether the drafter had a prior."""
    proposals = {}
    real = DFlashProposer.propose

    def recording(self, decoder, verify_len):
        tree = real(self, decoder, verify_len)
        proposals.setdefault(self.prior is not None, []).append(tree.tokens.tolist())
        return tree

    monkeypatch.setattr(DFlashProposer, "propose", recording)
    return proposals


def test_prior_is_saved_with_the_drafter(tmp_path):
    target = make_target()
    drafter = with_prior(make_drafter(target), target.config.vocab_size)
    drafter.save_pretrained(tmp_path)
    loaded = DFlashDraftModel.from_pretrained(tmp_path)
    entries = target.config.vocab_size**2 // 2
    assert loaded.config.dflash_config["bigram_prior"] == {"entries": entries, "beta": 1.0}
    assert torch.equal(drafter.bigram_prior[0], loaded.bigram_prior[0])
    torch.testing.assert_close(drafter.bigram_prior[1].float(), loaded.bigram_prior[1].float())
    assert drafter.bigram_prior[2] == loaded.bigram_prior[2]
    loaded.set_bigram_prior(None, None)
    assert loaded.bigram_prior is None and "bigram_prior" not in loaded.config.dflash_config
    with pytest.raises(ValueError, match="strictly increasing"):
        loaded.set_bigram_prior(torch.tensor([3, 1]), torch.tensor([1.0, 1.0]))


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
@pytest.mark.parametrize("batch", [1, 3])
def test_prior_is_lossless_and_changes_the_drafts(arch, batch, monkeypatch):
    target = make_target(arch)
    drafter = make_drafter(target, block_size=5)
    ids, mask = left_padded(batch)
    plain = greedy(target, ids, mask, max_new_tokens=24)
    proposals = record_proposals(monkeypatch)
    for size in (0, 9):
        drafter.set_bigram_prior(None, None)
        assert torch.equal(greedy(target, ids, mask, drafter, max_new_tokens=24, draft_tree_size=size), plain)
        with_prior(drafter, MASK + 1)
        assert torch.equal(greedy(target, ids, mask, drafter, max_new_tokens=24, draft_tree_size=size), plain)
    assert proposals[True] != proposals[False]  # the prior did change what was verified


def test_prior_samples_the_target_distribution(small_target, small_drafter):  # noqa: F811
    settings = SETTINGS["top_k_top_p"]
    with_prior(small_drafter, small_target.config.vocab_size)
    try:
        for size in (0, 7):
            counts, _ = draw_tree(small_target, small_drafter, settings, tree_size=size, seed=2)
            g, threshold = g_test(counts, exact_distribution(small_target, settings))
            assert g < threshold
    finally:
        small_drafter.set_bigram_prior(None, None)


def test_the_reference_implementation_loads_a_drafter_with_a_prior(tmp_path):
    """Other readers skip the extension's tensors: the reference package's class loads the same weights."""
    from dflash.model import DFlashDraftModel as ReferenceDraftModel

    target = make_target()
    drafter = with_prior(make_drafter(target), target.config.vocab_size)
    drafter.save_pretrained(tmp_path)
    reference = ReferenceDraftModel.from_pretrained(tmp_path, dtype=torch.float64)
    theirs, compared = reference.state_dict(), 0
    for name, tensor in drafter.state_dict().items():
        if name in ("bigram_keys", "bigram_boosts"):
            assert name not in theirs
        elif name in theirs:
            torch.testing.assert_close(theirs[name], tensor.to(theirs[name].dtype))
            compared += 1
    assert compared == len(dict(drafter.named_parameters()))  # every weight
