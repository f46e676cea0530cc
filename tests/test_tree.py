"""Draft trees (`draft_tree_size`): lossless like the chain, and accepting what the tree holds.

The tree oracle replaces the drafter's per-position candidates: the target's own greedy continuation is placed at a
chosen rank of each position's candidate list (or left out), with fixed drafter probabilities per rank, so which
nodes a best-first tree of N nodes holds, hence how many tokens each step accepts, is known in advance."""

from collections import Counter

import pytest
import torch
from torch.nn import functional as F
from transformers import GenerationConfig

from hf_dflash import DFlashDraftModel
from hf_dflash.generation import Decoder, DFlashProposer
from hf_dflash.generation.tree import DraftTree, ancestors, build_tree, build_tree_on_device, greedy_paths

from conftest import (
    ARCHITECTURES,
    MASK,
    PAD,
    ForwardCounter,
    Recorder,
    left_padded,
    make_drafter,
    make_target,
    make_tokenizer,
)
from test_sampling import NEW_TOKENS, PROMPT, SAMPLES, SETTINGS, exact_distribution, g_test

_REAL_CANDIDATES = DFlashProposer.draft_candidates

# The drafter's probabilities by rank at block positions 1, 2, 3...: a best-first tree of 6 nodes (under the root) is
# (0) .5, (0,0) .45, (0,0,0) .405, (1) .4, (1,0) .36, (1,0,0) .324, where (1,0) = rank 1 at position 1, then rank 0.
PROBS = [[0.5, 0.4], [0.9, 0.05], [0.9, 0.05]]


def probabilities(position: int, k: int) -> list[float]:
    head = PROBS[min(position, len(PROBS) - 1)]
    return (head + [0.01 / (i + 1) for i in range(k)])[:k]  # the tail decreasing too


@torch.no_grad()
def greedy_continuation(decoder, row: int, length: int) -> list[int]:
    """The target's greedy continuation of batch row `row`'s committed tokens (prompt padding masked), cache-free."""
    ids = decoder.sequences[row, : decoder.lengths[row]][None]
    padding = (torch.arange(ids.shape[1]) < decoder.prompt_len) & (ids == PAD)  # prompts never hold PAD
    out = []
    for _ in range(length):
        mask = (~padding).long()
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        token = decoder.target(ids, attention_mask=mask, position_ids=positions).logits[0, -1].argmax()
        ids = torch.cat([ids, token.view(1, 1)], dim=1)
        padding = torch.cat([padding, torch.zeros(1, 1, dtype=torch.bool)], dim=1)
        out.append(int(token))
    return out


class TreeOracle:
    """Candidates [rows, D, k] per step: at position d, the right token (the target's continuation) at rank
    `ranks[d]` among wrong ones, or only wrong ones where the rank is None or past the list. `ranks` is one list for
    every row, or a dict {batch row: list}. The real drafter still runs first (its cache bookkeeping)."""

    def __init__(self, ranks):
        self.ranks = ranks

    def __call__(self, proposer, decoder, verify_len, k):
        _REAL_CANDIDATES(proposer, decoder, verify_len, k)
        depth = verify_len - 1
        ids = torch.empty(len(decoder.rows), depth, k, dtype=torch.long)
        probs = torch.empty(len(decoder.rows), depth, k)
        for i, row in enumerate(decoder.rows.tolist()):
            ranks = self.ranks[row] if isinstance(self.ranks, dict) else self.ranks
            right = greedy_continuation(decoder, row, depth)
            for d in range(depth):
                wrong = [t for t in range(2, MASK) if t != right[d]][d : d + k]  # distinct, never the right one
                rank = ranks[d] if d < len(ranks) else None
                if rank is not None and rank < k:
                    wrong.insert(rank, right[d])
                ids[i, d] = torch.tensor(wrong[:k])
                probs[i, d] = torch.tensor(probabilities(d, k))
        return ids, probs


@pytest.fixture
def tree_oracle(monkeypatch):
    def install(ranks) -> TreeOracle:
        oracle = TreeOracle(ranks)
        monkeypatch.setattr(DFlashProposer, "draft_candidates", lambda self, *args: oracle(self, *args))
        return oracle

    return install


def greedy(target, ids, mask=None, drafter=None, **kwargs):
    kwargs.setdefault("max_new_tokens", 13)
    return target.generate(ids, attention_mask=mask, do_sample=False, assistant_model=drafter, **kwargs)


# --- building trees --------------------------------------------------------------------------------------------


def test_build_tree_is_best_first():
    probs = torch.tensor([[0.5, 0.4, 0.1], [0.9, 0.06, 0.04], [0.9, 0.07, 0.03]])[None]
    ids = torch.tensor([[10, 11, 12], [20, 21, 22], [30, 31, 32]])[None]
    tree = build_tree(torch.tensor([7]), ids, probs, budget=6)
    assert tree.tokens.tolist() == [[7, 10, 20, 30, 11, 20, 30]]  # the runner-up at position 1, then favourites
    assert tree.parents.tolist() == [[-1, 0, 1, 2, 0, 4, 5]]
    assert tree.depths.tolist() == [[0, 1, 2, 3, 1, 2, 3]]
    torch.testing.assert_close(tree.scores, torch.tensor([[0.5, 0.45, 0.405, 0.4, 0.36, 0.324]], dtype=torch.float64))
    assert tree.first(2).tokens.tolist() == [[7, 10, 20]]
    family = ancestors(tree)[0]
    assert family[6].nonzero().view(-1).tolist() == [0, 4, 5, 6]  # the root, (1), (1,0), itself
    assert family[3].nonzero().view(-1).tolist() == [0, 1, 2, 3]


def test_build_tree_random_properties():
    g = torch.Generator().manual_seed(0)
    rows, depth, k = 5, 4, 6
    probs = torch.rand(rows, depth, 30, generator=g).softmax(-1).topk(k, dim=-1).values
    ids = torch.randperm(30, generator=g)[:k].expand(rows, depth, k)
    for budget in (1, 7, 40, 10_000):
        tree = build_tree(torch.zeros(rows, dtype=torch.long), ids, probs, budget)
        assert tree.num_drafts == min(budget, k + k**2 + k**3 + k**4)
        assert (tree.scores[:, 1:] <= tree.scores[:, :-1] + 1e-12).all()  # best first
        slots = torch.arange(tree.tokens.shape[1])
        assert (tree.parents[:, 1:] < slots[1:]).all()  # parents first
        parent_depth = tree.depths.gather(1, tree.parents[:, 1:])
        assert torch.equal(parent_depth + 1, tree.depths[:, 1:])
        assert torch.equal(tree.tokens[:, 1], ids[:, 0, 0])  # the chain's first draft comes first
        for d in range(1, int(tree.depths.max()) + 1):  # the best node of each depth is the argmax chain's
            best = tree.scores.masked_fill(tree.depths[:, 1:] != d, 0).amax(-1)
            torch.testing.assert_close(best, probs[:, :d, 0].double().prod(-1))
    # a brute force over all paths of depth <= 2: the 5 best scores
    tree = build_tree(torch.zeros(1, dtype=torch.long), ids[:1, :2, :3], probs[:1, :2, :3], budget=5)
    p = probs[0, :2, :3].double()
    paths = sorted([float(p[0, a]) for a in range(3)] + [float(p[0, a] * p[1, b]) for a in range(3) for b in range(3)])
    torch.testing.assert_close(tree.scores[0], torch.tensor(paths[::-1][:5], dtype=torch.float64))


def _paths(tree: DraftTree) -> list[list[tuple]]:
    """Each row's nodes as root-to-node token tuples, sorted: the tree as a set, whatever its slot order."""
    rows = []
    for tokens, parents in zip(tree.tokens.tolist(), tree.parents.tolist()):
        def path(slot, tokens=tokens, parents=parents):
            return path(parents[slot]) + (tokens[slot],) if slot >= 0 else ()
        rows.append(sorted(path(slot) for slot in range(len(tokens))))
    return rows


@pytest.mark.parametrize("conditional", [False, True])
def test_the_device_tree_is_build_tree_s(conditional):
    """`build_tree_on_device` (tensor ops only, the fixed-shape path) holds the same nodes as the host heap's
    best-first tree, parents before children, best first."""
    g = torch.Generator().manual_seed(1)
    rows, depth, k = 3, 5, 4
    for trial in range(30):
        ids = torch.stack([torch.randperm(60, generator=g)[: depth * k].view(depth, k) for _ in range(rows)])
        if conditional:  # each parent's children, in the layout of `hf_dflash.bigram.conditional_probs`
            probs = torch.rand(rows, depth, k, k, generator=g).softmax(-1)
        else:
            probs = torch.rand(rows, depth, k, generator=g).softmax(-1).sort(-1, descending=True).values
        budget = 1 + trial * 3
        host = build_tree(torch.tensor([1, 2, 3]), ids, probs, budget)
        device = build_tree_on_device(torch.tensor([1, 2, 3]), ids, probs, budget)
        assert _paths(device) == _paths(host)
        torch.testing.assert_close(device.scores, host.scores)  # best first
        assert (device.parents[:, 1:] < torch.arange(1, device.tokens.shape[1])).all()  # parents first
        assert torch.equal(device.depths.gather(1, device.parents[:, 1:]) + 1, device.depths[:, 1:])
        assert torch.equal(ancestors(device, max_depth=depth), ancestors(device))


def test_ancestors_of_random_trees():
    g = torch.Generator().manual_seed(2)
    for depth, k, budget in ((1, 4, 3), (3, 3, 12), (7, 5, 31), (9, 2, 40)):
        probs = torch.rand(3, depth, k, generator=g).sort(-1, descending=True).values
        tree = build_tree(torch.zeros(3, dtype=torch.long), torch.randint(0, 50, (3, depth, k), generator=g), probs,
                          budget)
        family = ancestors(tree)
        for r in range(3):
            for i in range(tree.tokens.shape[1]):
                line, j = [], i
                while j >= 0:  # up the parents to the root
                    line.append(j)
                    j = int(tree.parents[r, j])
                assert family[r, i].nonzero().view(-1).tolist() == sorted(line)


def test_greedy_paths_follow_the_argmax_down_the_tree():
    """Per depth over the reached slots (a tree) or every slot at once (a chain): the same walk as a brute force."""
    g = torch.Generator().manual_seed(1)
    rows, depth, k, vocab = 6, 4, 3, 5  # a small vocabulary: the argmax is often a drafted token, and ties occur
    probs = torch.rand(rows, depth, k, generator=g).sort(-1, descending=True).values
    ids = torch.stack([torch.randperm(vocab, generator=g)[:k] for _ in range(rows * depth)]).view(rows, depth, k)
    tree = build_tree(torch.zeros(rows, dtype=torch.long), ids, probs, budget=20)
    scores = torch.randint(0, 3, (rows, tree.tokens.shape[1], vocab), generator=g).float()
    for walk in (tree, DraftTree(tree.tokens, tree.parents, tree.depths, tree.scores, is_chain=True)):
        paths, choices = greedy_paths(scores, walk)
        for r in range(rows):
            slot, expected_path, expected_choices = 0, [0], []
            while True:
                choice = int(scores[r, slot].argmax())  # the first maximum, as plain greedy decoding takes
                expected_choices.append(choice)
                slots = range(tree.tokens.shape[1])
                child = [c for c in slots if tree.parents[r, c] == slot and tree.tokens[r, c] == choice]
                if not child:
                    break
                slot = child[0]
                expected_path.append(slot)
            assert paths[r] == expected_path and choices[r] == expected_choices
    assert max(len(p) for p in paths) > 1  # some walks went down the tree


# --- accepting what the tree holds ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tree_size, tokens",
    [
        (1, [5] + [2] * 11 + [1]),  # the chain's first node only: wrong, one token per step (the last: no room)
        (3, None),  # (0), (0,0), (0,0,0): the argmax chain, wrong
        (4, [5] + [5] * 6),  # + (1): one draft accepted per step
        (5, [5] + [6] * 4),  # + (1,0): two
        (6, [5] + [7] * 3),  # + (1,0,0): the whole block
    ],
)
def test_accepts_the_path_the_tree_holds(tree_size, tokens, tree_oracle):
    target = make_target("llama")
    drafter = make_drafter(target, block_size=4)
    ids, _ = left_padded(1, lengths=[5])
    plain = greedy(target, ids)
    tree_oracle([1, 0, 0])  # the right token is the runner-up at position 1, the favourite after it
    counter = ForwardCounter(target)
    out = greedy(target, ids, drafter=drafter, draft_tree_size=tree_size, return_dict_in_generate=True)
    assert torch.equal(out.sequences, plain)
    if tokens is not None:
        assert counter.tokens == tokens  # the prefill, then the root + the tree's nodes per verification
    per_step = {1: 1, 3: 1, 4: 2, 5: 3, 6: 4}[tree_size]
    assert out.acceptance_lengths[0][0] == per_step
    assert out.draft_lengths[0][0] == tree_size


def test_chain_is_unchanged_without_a_tree(tree_oracle, oracle):
    target = make_target("llama")
    drafter = make_drafter(target, block_size=4)
    ids, _ = left_padded(1, lengths=[5])
    oracle(correct_upto=None)
    tree_oracle([None])  # never called: no tree
    counter = ForwardCounter(target)
    for size in (None, 0):
        counter.tokens.clear()
        out = greedy(target, ids, drafter=drafter, draft_tree_size=size)
        assert counter.tokens == [5, 4, 4, 4]
        assert torch.equal(out, greedy(target, ids))


def test_rows_accept_paths_of_different_lengths(tree_oracle):
    target = make_target("gemma3")  # sliding windows shorter than the outputs
    drafter = make_drafter(target, block_size=4)
    ids, mask = left_padded(3)
    plain = greedy(target, ids, mask, max_new_tokens=25)
    tree_oracle({0: [1, 0, 0], 1: [0, 1, 0], 2: [None]})  # 4, 2 and 1 tokens per step with 6 nodes
    counter = ForwardCounter(target)
    out = greedy(target, ids, mask, drafter, max_new_tokens=25, draft_tree_size=6, return_dict_in_generate=True)
    assert torch.equal(out.sequences, plain)
    assert counter.calls == 1 + len(out.acceptance_lengths[2])  # one forward per step for the whole batch
    assert out.acceptance_lengths[0][:5] == [4] * 5
    assert out.acceptance_lengths[1][:5] == [2] * 5
    assert out.acceptance_lengths[2][:5] == [1] * 5


# --- lossless: greedy -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
@pytest.mark.parametrize("batch", [1, 3])
def test_random_drafter_trees_match_plain_greedy(arch, batch):
    target = make_target(arch)
    drafter = make_drafter(target, block_size=5)
    ids, mask = left_padded(batch)
    plain = greedy(target, ids, mask, max_new_tokens=24)
    for size in (2, 9, 40):
        assert torch.equal(greedy(target, ids, mask, drafter, max_new_tokens=24, draft_tree_size=size), plain)


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
@pytest.mark.parametrize("batch", [1, 3])
def test_tree_oracle_matches_plain_greedy(arch, batch, tree_oracle):
    target = make_target(arch)  # mistral: window 5, gemma3: window 6, both shorter than the outputs
    drafter = make_drafter(target, block_size=5)
    ids, mask = left_padded(batch)
    plain = greedy(target, ids, mask, max_new_tokens=24)
    tree_oracle({0: [1, 0, 2, 0], 1: [0, 0, 1, None], 2: [2, 1]})
    out = greedy(target, ids, mask, drafter, max_new_tokens=24, draft_tree_size=12, return_dict_in_generate=True)
    assert torch.equal(out.sequences, plain)
    assert max(max(lengths) for lengths in out.acceptance_lengths) >= 3


def test_eager_attention(tree_oracle):
    target = make_target("qwen3", attn_implementation="eager")  # adds the mask to the scores
    drafter = make_drafter(target, block_size=4)
    ids, _ = left_padded(1, lengths=[5])
    plain = greedy(target, ids)
    tree_oracle([1, 0, 0])
    counter = ForwardCounter(target)
    assert torch.equal(greedy(target, ids, drafter=drafter, draft_tree_size=6), plain)
    assert counter.tokens == [5, 7, 7, 7]


def test_attention_without_a_tree_mask_falls_back_to_the_chain(oracle):
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import sdpa_mask
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging

    AttentionInterface.register("sdpa_by_another_name", sdpa_attention_forward)
    AttentionMaskInterface.register("sdpa_by_another_name", sdpa_mask)
    target = make_target("qwen3", attn_implementation="sdpa_by_another_name")
    drafter = make_drafter(target, block_size=4)
    ids, _ = left_padded(1, lengths=[5])
    plain = greedy(target, ids)
    oracle(correct_upto=None)
    counter = ForwardCounter(target)
    with CaptureLogger(logging.get_logger("hf_dflash.generation")) as captured:
        out = greedy(target, ids, drafter=drafter, draft_tree_size=6)
    assert torch.equal(out, plain)
    assert counter.tokens == [5, 4, 4, 4]  # the chain of block 4
    assert "needs eager or sdpa attention" in captured.out and "A chain of drafts is verified instead" in captured.out


# --- lossless: sampling ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_target():
    return make_target("qwen3", vocab_size=8, initializer_range=0.3, seed=3, dtype=torch.float32)  # test_sampling's


@pytest.fixture(scope="module")
def small_drafter(small_target):
    torch.manual_seed(1)
    return DFlashDraftModel.from_target(small_target, block_size=4, mask_token_id=7).eval()


@pytest.fixture
def calibrated_oracle(monkeypatch):
    """Candidates = the target's own k most likely tokens along its greedy continuation, with its probabilities:
    trees then hold most samples, and accept paths through runner-up nodes too."""

    @torch.no_grad()
    def candidates(proposer, decoder, verify_len, k):
        _REAL_CANDIDATES(proposer, decoder, verify_len, k)
        lengths = decoder.lengths[decoder.rows]
        ids = torch.empty(len(lengths), verify_len - 1, k, dtype=torch.long)
        probs = torch.empty(len(lengths), verify_len - 1, k)
        for length in lengths.unique().tolist():
            group = (lengths == length).nonzero().squeeze(1)
            context = decoder.sequences[decoder.rows[group], :length]
            for d in range(verify_len - 1):
                p = F.softmax(decoder.target(context).logits[:, -1].float(), dim=-1)
                probs[group, d], ids[group, d] = p.topk(k, dim=-1)
                context = torch.cat([context, ids[group, d, :1]], dim=1)
        return ids, probs

    monkeypatch.setattr(DFlashProposer, "draft_candidates", candidates)


def draw_tree(target, drafter, settings: dict, tree_size: int, seed: int = 0):
    """test_sampling's `draw` with trees: (Counter of generated tuples, acceptance_lengths)."""
    torch.manual_seed(seed)
    out = target.generate(
        PROMPT.expand(SAMPLES, -1), do_sample=True, max_new_tokens=NEW_TOKENS, assistant_model=drafter,
        return_dict_in_generate=True, draft_tree_size=tree_size, **settings,
    )
    return Counter(map(tuple, out.sequences[:, PROMPT.shape[1] :].tolist())), out.acceptance_lengths


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_tree_oracle_samples_the_target_distribution(small_target, small_drafter, calibrated_oracle, setting):
    settings = SETTINGS[setting]
    dist = exact_distribution(small_target, settings)
    counts, acceptance = draw_tree(small_target, small_drafter, settings, tree_size=5)
    assert set(counts) <= set(dist), "sampled a sequence the processors give probability 0"
    g, threshold = g_test(counts, dist)
    assert g < threshold
    assert sum(row[0] == 3 for row in acceptance) > SAMPLES // 10  # whole paths accepted
    assert sum(row[0] >= 2 for row in acceptance) > SAMPLES // 2
    g_other, threshold_other = g_test(counts, exact_distribution(small_target, {**settings, "temperature": 1.0}))
    assert g_other > 2 * threshold_other, g_other  # negative control


def test_random_drafter_trees_sample_the_target_distribution(small_target, small_drafter):
    settings = SETTINGS["top_k_top_p"]
    counts, _ = draw_tree(small_target, small_drafter, settings, tree_size=7, seed=1)
    g, threshold = g_test(counts, exact_distribution(small_target, settings))
    assert g < threshold


@pytest.mark.parametrize("tree_size", [0, 7])
def test_step_at_once_equals_token_by_token(tree_size, tree_oracle, oracle, monkeypatch):
    """Greedy steps with only max length / EOS criteria are verified and committed at once (`_verify_greedy`,
    `_commit_at_once`); a processor that reads the ids and a criterion of the user's take the token-by-token walk.
    Both give the same text and the same tokens per step, EOS inside an accepted path included."""
    from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

    class Identity(LogitsProcessor):  # not position-free: it could read the ids
        def __call__(self, input_ids, scores):
            return scores

    class Never(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    calls = {"_verify_greedy": 0, "_commit_at_once": 0}
    for name in calls:
        original = getattr(Decoder, name)
        monkeypatch.setattr(Decoder, name, lambda self, *a, _o=original, _n=name: calls.__setitem__(_n, calls[_n] + 1)
                            or _o(self, *a))
    target = make_target("gemma3")
    drafter = make_drafter(target, block_size=5)
    ids, mask = left_padded(3)
    eos = int(greedy(target, ids, mask, max_new_tokens=20)[0, ids.shape[1] + 6])  # row 0's 7th new token
    kwargs = dict(max_new_tokens=20, eos_token_id=eos, draft_tree_size=tree_size, return_dict_in_generate=True)
    oracle(correct_upto="random", seed=1)  # the same random drafts in both runs
    tree_oracle({0: [1, 0, 0, None], 1: [0, 1], 2: [None]})
    at_once = greedy(target, ids, mask, drafter, **kwargs)
    assert calls["_verify_greedy"] > 1 and calls["_commit_at_once"] > 1
    calls.update(_verify_greedy=0, _commit_at_once=0)
    oracle(correct_upto="random", seed=1)
    by_token = greedy(target, ids, mask, drafter, logits_processor=LogitsProcessorList([Identity()]),
                      stopping_criteria=StoppingCriteriaList([Never()]), **kwargs)
    assert calls == {"_verify_greedy": 0, "_commit_at_once": 0}
    assert torch.equal(at_once.sequences, by_token.sequences)
    assert torch.equal(at_once.sequences, greedy(target, ids, mask, max_new_tokens=20, eos_token_id=eos))
    assert at_once.acceptance_lengths == by_token.acceptance_lengths
    assert max(max(lengths) for lengths in at_once.acceptance_lengths) >= 3


# --- everything else keeps working ----------------------------------------------------------------------------


def test_eos_and_stop_strings_inside_an_accepted_path(tree_oracle):
    target = make_target("qwen3")
    drafter = make_drafter(target, block_size=5)
    tokenizer = make_tokenizer()
    ids, mask = left_padded(2)
    unbounded = greedy(target, ids, mask, max_new_tokens=20)[:, ids.shape[1] :]
    eos = int(unbounded[0, 6])  # row 0's 7th new token: inside its second accepted path of 4 tokens
    stop = tokenizer.decode(unbounded[1, 4:6])  # row 1 stops at its 6th
    kwargs = dict(max_new_tokens=20, eos_token_id=eos, stop_strings=[stop], tokenizer=tokenizer)
    plain = greedy(target, ids, mask, **kwargs)
    tree_oracle([1, 0, 0, None])  # 7 nodes hold (1,0,0): 4 tokens per step
    out = greedy(target, ids, mask, drafter, draft_tree_size=7, return_dict_in_generate=True, **kwargs)
    assert torch.equal(out.sequences, plain)
    assert out.acceptance_lengths[0][0] == 4 and sum(out.acceptance_lengths[0]) < 19  # cut inside a path


def test_streamer_gets_each_accepted_path(tree_oracle):
    target = make_target("qwen3")
    drafter = make_drafter(target, block_size=4)
    ids, _ = left_padded(1)
    tree_oracle([1, 0, 0])
    streamer = Recorder()
    out = greedy(target, ids, drafter=drafter, draft_tree_size=6, streamer=streamer)
    assert torch.equal(torch.cat([c.view(-1) for c in streamer.chunks[1:]]), out[0, ids.shape[1] :])
    assert [c.numel() for c in streamer.chunks[1:]] == [1, 4, 4, 4]
    assert streamer.ends == 1


@pytest.mark.parametrize("batch", [1, 2])
def test_scores_and_logits_match_plain_generate(batch, tree_oracle):
    target = make_target("qwen3")
    drafter = make_drafter(target, block_size=4)
    ids, mask = left_padded(batch)
    kwargs = dict(
        max_new_tokens=12, return_dict_in_generate=True, output_scores=True, output_logits=True,
        repetition_penalty=1.3,
    )
    plain = greedy(target, ids, mask, **kwargs)
    tree_oracle({0: [1, 0, 0], 1: [0, 1]})
    fast = greedy(target, ids, mask, drafter, draft_tree_size=6, **kwargs)
    assert torch.equal(fast.sequences, plain.sequences)
    assert max(fast.acceptance_lengths[0]) > 1
    assert len(fast.scores) == len(fast.logits) == len(plain.scores) == 12
    for mine, theirs in zip(fast.scores + fast.logits, plain.scores + plain.logits):
        torch.testing.assert_close(mine, theirs)


def test_num_return_sequences_with_sampling():
    target = make_target("qwen3")
    drafter = make_drafter(target)
    ids, mask = left_padded(3)
    torch.manual_seed(0)
    out = target.generate(
        ids, attention_mask=mask, do_sample=True, temperature=1.5, num_return_sequences=3, max_new_tokens=8,
        assistant_model=drafter, draft_tree_size=8,
    )
    assert out.shape == (9, ids.shape[1] + 8)
    copies = target.generate(
        ids, attention_mask=mask, do_sample=True, top_k=1, num_return_sequences=2, max_new_tokens=8,
        assistant_model=drafter, draft_tree_size=8,
    )
    assert torch.equal(copies, greedy(target, ids, mask, max_new_tokens=8).repeat_interleave(2, dim=0))


# --- settings -------------------------------------------------------------------------------------------------


def test_num_assistant_tokens_caps_the_depth(tree_oracle):
    target = make_target("llama")
    drafter = make_drafter(target, block_size=8)
    ids, _ = left_padded(1, lengths=[5])
    plain = greedy(target, ids)
    tree_oracle([1, 0, 0, 0, 0, 0, 0])
    out = greedy(target, ids, drafter=drafter, draft_tree_size=10, num_assistant_tokens=2,
                 return_dict_in_generate=True)
    assert torch.equal(out.sequences, plain)
    assert out.acceptance_lengths[0] == [3] * 4  # depth 2 + the target's token


def test_confidence_threshold_skips_unsure_trees(tree_oracle):
    target = make_target("llama")
    drafter = make_drafter(target, block_size=4)
    ids, _ = left_padded(1, lengths=[5])
    plain = greedy(target, ids)
    tree_oracle([1, 0, 0])  # the first favourite has probability 0.5
    counter = ForwardCounter(target)
    out = greedy(target, ids, drafter=drafter, draft_tree_size=6, assistant_confidence_threshold=0.6)
    assert torch.equal(out, plain)
    assert counter.tokens == [5] + [1] * 12
    counter.tokens.clear()
    greedy(target, ids, drafter=drafter, draft_tree_size=6, assistant_confidence_threshold=0.4)
    assert counter.tokens == [5, 7, 7, 7]


def test_one_token_steps_carry_a_tree_mask_on_a_cpu(tree_oracle):
    # SDPA's one-query CPU kernel without a mask is slow in bfloat16 (`hf_dflash.generation.tree.mask_one_token`)
    target = make_target("llama")
    drafter = make_drafter(target, block_size=4)
    ids, mask = left_padded(2, lengths=[5, 7])
    plain = greedy(target, ids, mask)
    tree_oracle([1, 0, 0])  # the first favourite has probability 0.5: under the threshold, every step is one token
    masks = []
    def record(module, args, kwargs):  # the loop's one-token verifications (the oracle's calls have no cache)
        if kwargs.get("cache") is not None and kwargs["input_ids"].shape[1] == 1:
            masks.append(kwargs.get("attention_mask"))

    hook = target.register_forward_pre_hook(record, with_kwargs=True)
    out = greedy(target, ids, mask, drafter=drafter, draft_tree_size=6, assistant_confidence_threshold=0.6)
    assert torch.equal(out, plain)
    assert len(masks) == 12 and all(m is not None and m.dim() == 4 for m in masks)
    masks.clear()
    greedy(target, ids, mask, drafter=drafter, draft_tree_size=0, assistant_confidence_threshold=0.6)
    assert len(masks) == 12 and all(m is None or m.dim() == 2 for m in masks)  # the chain's: as before
    hook.remove()


@pytest.mark.parametrize("where", ["argument", "generation_config", "drafter_config"])
def test_where_the_tree_size_comes_from(where, tree_oracle):
    target = make_target("llama")
    drafter = make_drafter(target, block_size=4)
    ids, _ = left_padded(1, lengths=[5])
    tree_oracle([1, 0, 0])
    counter = ForwardCounter(target)
    if where == "argument":
        greedy(target, ids, drafter=drafter, draft_tree_size=6)
    elif where == "generation_config":
        config = GenerationConfig(draft_tree_size=6, max_new_tokens=13, do_sample=False)
        target.generate(ids, assistant_model=drafter, generation_config=config)
    else:
        drafter.config.dflash_config["draft_tree_size"] = 6
        assert drafter.draft_tree_size == 6
        greedy(target, ids, drafter=drafter)
        counter.tokens.clear()
        greedy(target, ids, drafter=drafter, draft_tree_size=0)  # the argument wins over the drafter's default
        assert counter.tokens[:2] == [5, 4]  # the chain of block 4 (the real drafter's)
        return
    assert counter.tokens == [5, 7, 7, 7]


@pytest.mark.parametrize("size", [-1, 2.5, "big", True])
def test_bad_tree_size(size):
    target = make_target("llama")
    drafter = make_drafter(target, block_size=4)
    ids, _ = left_padded(1, lengths=[5])
    with pytest.raises(ValueError, match="draft_tree_size="):
        greedy(target, ids, drafter=drafter, draft_tree_size=size)


def test_chain_tree_is_a_chain():
    tree = DraftTree.chain(torch.tensor([[5, 6, 7]]))
    assert tree.is_chain and tree.num_drafts == 2
    assert tree.parents.tolist() == [[-1, 0, 1]] and tree.depths.tolist() == [[0, 1, 2]]
