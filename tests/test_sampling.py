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

from conftest import _REAL_CHAIN, make_target
from hf_dflash import DFlashDraftModel
from hf_dflash.generation import Decoder, DFlashProposer

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


def draw(target, drafter, settings: dict, seed: int = 0):
    """SAMPLES continuations from one batched call: (Counter of generated tuples, acceptance_lengths)."""
    torch.manual_seed(seed)
    out = target.generate(
        PROMPT.expand(SAMPLES, -1),
        do_sample=True,
        max_new_tokens=NEW_TOKENS,
        assistant_model=drafter,
        return_dict_in_generate=True,
        **settings,
    )
    assert out.sequences.shape == (SAMPLES, PROMPT.shape[1] + NEW_TOKENS)
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


def assert_samples_the_target_distribution(target, drafter, setting: str = "top_k_top_p") -> None:
    """A G-test of one batched DFlash draw against the enumerated distribution, where some drafts are accepted (for
    other drafter formats: DFlash2, transformers' own)."""
    settings = SETTINGS[setting]
    dist = exact_distribution(target, settings)
    counts, acceptance = draw(target, drafter, settings)
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


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_random_drafter_samples_the_target_distribution(target, drafter, setting):
    settings = SETTINGS[setting]
    dist = exact_distribution(target, settings)
    counts, _ = draw(target, drafter, settings, seed=1)
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
