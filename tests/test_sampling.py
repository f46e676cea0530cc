"""Sampling losslessness: `generate(do_sample=True, assistant_model=drafter)` draws from exactly the target's
distribution. On an 8-token vocabulary the joint distribution of the first generated tokens is enumerated with
transformers' own logits processors, and many DFlash samples are compared with it by a G-test."""

import math
from collections import Counter

import pytest
import torch
from torch.nn import functional as F
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from hf_dflash import DFlashDraftModel
from hf_dflash.bigram import sample_conditional_chain
from hf_dflash.generation import Decoder, DFlashProposer
from hf_dflash.sampling import exponential_race, rejection_sample

from conftest import _REAL_CHAIN, make_target

VOCAB = 8
PROMPT = torch.tensor([[2, 5, 3]])
NEW_TOKENS = 4  # the prefill's token, then a block of 4 verifies 3 drafts (verify_len capped to the 3 tokens left)
SAMPLES = 3000
SETTINGS = {
    "top_k_top_p": dict(temperature=0.7, top_k=3, top_p=0.9),
    "min_p_repetition_penalty": dict(temperature=0.7, min_p=0.1, repetition_penalty=1.5),
}


@pytest.fixture(scope="module")
def target():
    return sampling_target()


@pytest.fixture(scope="module")
def drafter(target):
    torch.manual_seed(1)
    return DFlashDraftModel.from_target(target, block_size=4, mask_token_id=VOCAB - 1).eval()


@pytest.fixture
def greedy_oracle(monkeypatch):
    """Drafts = the target's greedy continuation of each row (batched: all rows share one unpadded prompt), so
    multi-token acceptance is frequent. The real drafter still runs, to keep its cache bookkeeping in the loop."""

    def propose(proposer, decoder, verify_len):
        _, confidence = _REAL_CHAIN(proposer, decoder, verify_len)
        lengths = decoder.lengths[decoder.rows]
        drafts = torch.empty(len(lengths), verify_len - 1, dtype=torch.long)
        for length in lengths.unique().tolist():
            group = (lengths == length).nonzero().squeeze(1)
            ids = decoder.sequences[decoder.rows[group], :length]
            for _ in range(verify_len - 1):
                ids = torch.cat([ids, decoder.target(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            drafts[group] = ids[:, length:]
        return drafts, confidence

    monkeypatch.setattr(DFlashProposer, "draft_chain", propose)
    # under sampling too: point-mass drafts, not drafts drawn from the drafter
    monkeypatch.setattr(DFlashProposer, "sample_chain", lambda *args: (*propose(*args), None))


def processors(temperature, top_k=None, top_p=None, min_p=None, repetition_penalty=None) -> LogitsProcessorList:
    """The processors `generate` builds for these settings, in its order (penalties first, then the warpers)."""
    out = LogitsProcessorList()
    if repetition_penalty is not None:
        out.append(RepetitionPenaltyLogitsProcessor(repetition_penalty))
    out.append(TemperatureLogitsWarper(temperature))
    if top_k is not None:
        out.append(TopKLogitsWarper(top_k))
    if top_p is not None:
        out.append(TopPLogitsWarper(top_p))
    if min_p is not None:
        out.append(MinPLogitsWarper(min_p))
    return out


@torch.no_grad()
def exact_distribution(target, settings: dict, depth: int = NEW_TOKENS) -> dict[tuple, float]:
    """{first `depth` generated tokens: probability}, enumerating every prefix with non-zero probability."""
    warp = processors(**settings)
    dist = {(): 1.0}
    for step in range(depth):
        prefixes = list(dist)
        generated = torch.tensor(prefixes, dtype=torch.long).view(len(prefixes), step)
        ids = torch.cat([PROMPT.expand(len(prefixes), -1), generated], dim=1)
        logits = target(ids).logits[:, -1].float()  # `generate` runs the processors in float32
        probs = F.softmax(warp(ids, logits), dim=-1).double()
        dist = {
            prefix + (token,): dist[prefix] * probs[i, token].item()
            for i, prefix in enumerate(prefixes)
            for token in range(VOCAB)
            if probs[i, token] > 0
        }
    return dist


def draw(target, drafter, settings: dict, seed: int = 0, samples: int = SAMPLES):
    """`samples` continuations from one batched call: (Counter of generated tuples, acceptance_lengths)."""
    torch.manual_seed(seed)
    out = target.generate(
        PROMPT.expand(samples, -1),
        do_sample=True,
        max_new_tokens=NEW_TOKENS,
        assistant_model=drafter,
        return_dict_in_generate=True,
        **settings,
    )
    assert out.sequences.shape == (samples, PROMPT.shape[1] + NEW_TOKENS)
    return Counter(map(tuple, out.sequences[:, PROMPT.shape[1] :].tolist())), out.acceptance_lengths


def g_test(counts: Counter, dist: dict[tuple, float]) -> tuple[float, float]:
    """(G statistic, rejection threshold). Cells expecting fewer than 5 samples are pooled into one; the threshold
    df + 5 * sqrt(2 df) is five standard deviations above the chi-square mean."""
    n = sum(counts.values())
    observed, expected = [], []
    pooled_observed, pooled_expected = 0, 0.0
    for cell, p in dist.items():
        if n * p >= 5:
            observed.append(counts[cell])
            expected.append(n * p)
        else:
            pooled_observed += counts[cell]
            pooled_expected += n * p
    if pooled_expected > 0:
        observed.append(pooled_observed)
        expected.append(pooled_expected)
    g = 2 * sum(o * math.log(o / e) for o, e in zip(observed, expected) if o > 0)
    df = len(observed) - 1
    return g, df + 5 * math.sqrt(2 * df)


def sampling_target():
    """The target of these tests: a larger init spread than the default makes the distributions peaked enough for
    top-p / min-p to cut."""
    return make_target("qwen3", vocab_size=VOCAB, initializer_range=0.3, seed=3, dtype=torch.float32)


def assert_samples_the_target_distribution(target, drafter, setting: str = "top_k_top_p", samples: int = SAMPLES,
                                           **kwargs) -> None:
    """A G-test of one batched DFlash draw of `samples` rows (`generate` arguments `kwargs`) against the enumerated
    distribution, where some drafts are accepted (other drafter formats: DFlash2, transformers' own; hybrid targets)."""
    settings = SETTINGS[setting]
    dist = exact_distribution(target, settings)
    counts, acceptance = draw(target, drafter, {**settings, **kwargs}, samples=samples)
    assert set(counts) <= set(dist)
    g, threshold = g_test(counts, dist)
    assert g < threshold
    assert any(n > 1 for row in acceptance for n in row), "some steps should commit accepted drafts"


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_oracle_drafter_samples_the_target_distribution(target, drafter, greedy_oracle, setting):
    settings = SETTINGS[setting]
    dist = exact_distribution(target, settings)
    counts, acceptance = draw(target, drafter, settings)
    assert set(counts) <= set(dist), "sampled a sequence the processors give probability 0"
    g, threshold = g_test(counts, dist)
    assert g < threshold
    # the test exercises multi-token acceptance: the 3-token verification is often fully accepted
    assert sum(row[0] == 3 for row in acceptance) > SAMPLES // 10
    # negative control: the same samples are far from the distribution at another temperature
    g_other, threshold_other = g_test(counts, exact_distribution(target, {**settings, "temperature": 1.0}))
    assert g_other > 2 * threshold_other, g_other


# the general loop, and the fixed-shape one (which draws and rejects drafts by exponential races)
@pytest.mark.parametrize("setting, path", [(name, {}) for name in sorted(SETTINGS)]
                         + [("top_k_top_p", {"cache_implementation": "static"})])
def test_random_drafter_samples_the_target_distribution(target, drafter, setting, path):
    settings = SETTINGS[setting]
    dist = exact_distribution(target, settings)
    counts, _ = draw(target, drafter, {**settings, **path}, seed=1)
    assert set(counts) <= set(dist)
    g, threshold = g_test(counts, dist)
    assert g < threshold


def test_biased_acceptance_is_detected(target, drafter, greedy_oracle, monkeypatch):
    """Negative control on the sampler itself: the classic bug of accepting a point-mass draft with probability
    p(draft) and otherwise sampling p again (instead of the residual) over-weights the drafts; the G-test sees it."""
    real_verify, real_process = Decoder.verify, Decoder.process

    def verify(self, logits, tree):
        self._block = tree.tokens  # a chain: the newest token, then the drafts
        return real_verify(self, logits, tree)

    def process(self, logits, drafts, live):
        self._position, self._live = drafts.shape[1], live
        return real_process(self, logits, drafts, live)

    def choose(self, scores):
        probs = F.softmax(scores, dim=-1)
        tokens = torch.multinomial(probs, 1).squeeze(-1)
        if self._position + 1 < self._block.shape[1]:  # a draft sits at this position
            drafts = self._block[self._live, self._position + 1]
            accept = torch.rand_like(tokens, dtype=probs.dtype) < probs.gather(-1, drafts[:, None])[:, 0]
            tokens = torch.where(accept, drafts, tokens)
        return tokens

    monkeypatch.setattr(Decoder, "verify", verify)
    monkeypatch.setattr(Decoder, "process", process)
    monkeypatch.setattr(Decoder, "choose", choose)
    settings = SETTINGS["top_k_top_p"]
    counts, _ = draw(target, drafter, settings)
    g, threshold = g_test(counts, exact_distribution(target, settings))
    assert g > threshold


def test_rejection_step_returns_the_target_distribution():
    """`rejection_sample` against exact arithmetic: for a fixed p and a proposal q over some candidates, the tokens
    it returns follow p, and a draft is kept with probability sum(min(p, q)); the classic bug (sampling p again
    instead of the residual) is caught by the same test."""
    torch.manual_seed(0)
    n, vocab = 200_000, 8
    p = F.softmax(torch.randn(vocab) * 1.5, dim=-1)
    ids = torch.tensor([3, 0, 6, 1])
    q = F.softmax(torch.randn(len(ids)) * 2, dim=-1)
    drafts = ids[torch.multinomial(q, n, replacement=True)]
    args = (p.log().expand(n, -1), drafts, ids.expand(n, -1), q.expand(n, -1))

    def distance(tokens):  # G statistic of the returned tokens against p, and its rejection threshold
        counts = Counter({(t,): c for t, c in Counter(tokens.tolist()).items()})
        return g_test(counts, {(t,): p[t].item() for t in range(vocab)})

    tokens = rejection_sample(*args)
    g, threshold = distance(tokens)
    assert g < threshold
    q_full = torch.zeros(vocab).index_add_(0, ids, q)
    kept = (tokens == drafts).float().mean().item()
    assert abs(kept - torch.minimum(p, q_full).sum().item()) < 0.01
    assert torch.equal(rejection_sample(q_full.log().expand(n, -1), *args[1:]), drafts)  # q == p: all kept
    # any leading shape: [rows, positions] (the fixed-shape path rejects a whole block at once)
    batched = rejection_sample(args[0].view(n // 4, 4, vocab), *(a.view(n // 4, 4, *a.shape[1:]) for a in args[1:]))
    assert distance(batched.view(-1))[0] < threshold

    def biased(scores, drafts, ids, q):  # keep with min(1, p / q), else a fresh sample of p
        probs = F.softmax(scores, dim=-1)
        keep = torch.rand(len(drafts)) * (q * (ids == drafts[:, None])).sum(-1) < probs.gather(1, drafts[:, None])[:, 0]
        return torch.where(keep, drafts, torch.multinomial(probs, 1)[:, 0])

    g, threshold = distance(biased(*args))
    assert g > threshold


@pytest.mark.parametrize("path", [{}, {"cache_implementation": "static"}])
def test_drafts_from_the_target_distribution_are_all_accepted(target, drafter, monkeypatch, path):
    """Under sampling a chain's drafts are drawn, and the rejection step reads their distribution: drafts drawn from
    the target's own (processed) distribution are kept every time, and the samples still follow it (on the general
    loop and on the fixed-shape one)."""
    settings = SETTINGS["top_k_top_p"]
    warp = processors(**settings)
    seen = []

    def sample_chain(proposer, decoder, verify_len):
        assert proposer.temperature == settings["temperature"]
        lengths = decoder.lengths[decoder.rows]
        drafts = torch.empty(len(lengths), verify_len - 1, dtype=torch.long)
        q = torch.empty(len(lengths), verify_len - 1, VOCAB)
        for length in lengths.unique().tolist():
            group = (lengths == length).nonzero().squeeze(1)
            ids = decoder.sequences[decoder.rows[group], :length]
            for d in range(verify_len - 1):
                probs = F.softmax(warp(ids, decoder.target(ids).logits[:, -1].float()), dim=-1)
                q[group, d] = probs
                drafts[group, d] = torch.multinomial(probs, 1)[:, 0]
                ids = torch.cat([ids, drafts[group, d, None]], dim=1)
        seen.append(drafts)
        return drafts, None, (torch.arange(VOCAB).expand(len(lengths), verify_len - 1, -1), q)

    monkeypatch.setattr(DFlashProposer, "sample_chain", sample_chain)
    counts, acceptance = draw(target, drafter, {**settings, **path})
    assert seen, "sampling draws the chain's drafts"
    assert all(row == [3] for row in acceptance)  # one step: its 2 drafts kept, and the target's token
    g, threshold = g_test(counts, exact_distribution(target, settings))
    assert g < threshold


def test_exponential_race_draws_the_distribution():
    torch.manual_seed(0)
    p = torch.tensor([0.5, 0.0, 0.3, 0.15, 0.05])
    tokens = exponential_race(p.expand(200_000, -1).clone())
    counts = Counter({(t,): c for t, c in Counter(tokens.tolist()).items()})
    g, threshold = g_test(counts, {(t,): p[t].item() for t in range(5) if p[t] > 0})
    assert 1 not in tokens.tolist() and g < threshold


def test_sampled_chain_draws_each_draft_under_its_parent():
    """`sample_conditional_chain`: position 0 from its own row, each later position from the row of the candidate
    drawn before it, sharpened by the temperature; the proposal returned is the distribution actually drawn from."""
    torch.manual_seed(0)
    n, temperature = 100_000, 0.5
    ids = torch.tensor([[10, 11], [20, 21]]).expand(n, -1, -1)  # [rows, D=2, k=2]
    probs = torch.tensor([[[0.6, 0.4], [0.6, 0.4]],  # position 0: the same under every parent
                          [[0.9, 0.1], [0.2, 0.8]]])  # position 1 under candidate 0 / 1 of position 0
    drafts, q = sample_conditional_chain(ids, probs.expand(n, -1, -1, -1), temperature)

    def sharpened(p):
        return F.softmax(torch.tensor(p).log() / temperature, dim=-1)

    first = drafts[:, 0] == 10
    torch.testing.assert_close(q[first, 1], sharpened([0.9, 0.1]).expand(int(first.sum()), -1))
    torch.testing.assert_close(q[~first, 1], sharpened([0.2, 0.8]).expand(int((~first).sum()), -1))
    for rows, expected in ((slice(None), sharpened([0.6, 0.4])[0]), (first, sharpened([0.9, 0.1])[0]),
                           (~first, sharpened([0.2, 0.8])[0])):
        column = 0 if isinstance(rows, slice) else 1
        frequency = (drafts[rows, column] == ids[0, column, 0]).float().mean().item()
        assert abs(frequency - expected.item()) < 0.01
