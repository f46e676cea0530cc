"""Attention masks as users pass them, or as `generate` infers them from pad tokens in the prompt: every mask plain
`generate` accepts gives its output, with the positions transformers gives (a masked last slot does not advance
them), on the general loop (chains, trees) and on the fixed-shape path, at batch 1 and 3.

Drafts come from plain `generate`'s own output (right up to a random depth per row and step), so steps accept
several tokens and rows accept different numbers: the multi-token paths of every layout are exercised."""

import random

import pytest
import torch

from hf_dflash.generation import DFlashProposer

from conftest import ARCHITECTURES, MASK, PAD, left_padded, make_drafter, make_target

_REAL_CHAIN, _REAL_CANDIDATES = DFlashProposer.draft_chain, DFlashProposer.draft_candidates
NEW_TOKENS = 24

# batch 1: (prompt, explicit mask or None for the one `generate` infers from PAD)
SINGLE = {
    "pad last, inferred": ([9, 9, 8, 4, 6, 5, 4, 1, PAD], None),
    "pad in the middle, inferred": ([9, 9, 8, PAD, 6, 5, 4, 1, 7], None),
    "pad first, inferred": ([PAD, PAD, 8, 4, 6, 5, 4, 1, 7], None),
    "zeros at the end": ([9, 9, 8, 4, 6, 5, 4, 1, 7], [1, 1, 1, 1, 1, 1, 1, 0, 0]),
    "zeros anywhere": ([9, 9, 8, 4, 6, 5, 4, 1, 7], [0, 1, 0, 1, 1, 0, 1, 1, 0]),
}
# batch 3: every row its own mask, right-padded and holed rows beside a left-padded one
BATCH = (
    [[9, 9, 8, 4, 6, 5, 4, 1, PAD], [PAD, PAD, 8, 4, 6, 5, 4, 1, 7], [3, 9, 8, PAD, 6, PAD, 4, 1, 7]],
    [[1, 1, 1, 1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 1, 0, 1, 1, 1]],
)
PATHS = {
    "chain": {},
    "tree": {"draft_tree_size": 5},
    "fixed chain": {"cache_implementation": "static"},
    "fixed tree": {"cache_implementation": "static", "draft_tree_size": 5},
}


@pytest.fixture
def plain_oracle(monkeypatch):
    """install(plain): drafts (chains and trees' candidates) from plain `generate`'s output [batch, P + new], the
    right token up to a random depth per row and step, then wrong ones."""

    def install(plain: torch.LongTensor, seed: int = 0):
        rng = random.Random(seed)
        known = torch.cat([plain, torch.full((len(plain), 32), PAD)], dim=1)

        def right(decoder, depth: int) -> list[list[int]]:
            return [known[r, int(decoder.lengths[r]) : int(decoder.lengths[r]) + depth].tolist()
                    for r in decoder.rows.tolist()]

        def wrong(token: int, d: int) -> int:
            return 2 + (token + 1 + d) % (MASK - 3)  # never the right one, never PAD or MASK

        def chain(self, decoder, verify_len):
            _REAL_CHAIN(self, decoder, verify_len)  # the real drafter's cache bookkeeping still runs
            rows = []
            for tokens in right(decoder, verify_len - 1):
                cut = rng.randint(0, len(tokens))
                rows.append(tokens[:cut] + [wrong(t, d) for d, t in enumerate(tokens[cut:])])
            return torch.tensor(rows), None

        def candidates(self, decoder, verify_len, k):
            _REAL_CANDIDATES(self, decoder, verify_len, k)
            ids, probs = [], []
            for tokens in right(decoder, verify_len - 1):
                rank = rng.choice([0, 0, 1, None])  # where the right token sits among a position's candidates
                row = []
                for d, token in enumerate(tokens):
                    options = [wrong(token, d + i) for i in range(k)]
                    options = list(dict.fromkeys(options))[:k] + [wrong(token, d + k + i) for i in range(k)]
                    if rank is not None and rank < k:
                        options.insert(rank, token)
                    row.append(list(dict.fromkeys(options))[:k])
                ids.append(row)
                probs.append([[0.5 / (i + 1) for i in range(k)]] * len(tokens))
            return torch.tensor(ids), torch.tensor(probs)

        monkeypatch.setattr(DFlashProposer, "draft_chain", chain)
        monkeypatch.setattr(DFlashProposer, "draft_candidates", candidates)

    return install


def check(target, ids, mask, path, plain_oracle, **kwargs):
    drafter = make_drafter(target, block_size=4)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS, **kwargs)
    plain_oracle(plain)
    out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS,
                          assistant_model=drafter, return_dict_in_generate=True, **PATHS[path], **kwargs)
    assert torch.equal(out.sequences, plain)
    assert max(n for row in out.acceptance_lengths for n in row) > 1  # several tokens per step somewhere


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("case", sorted(SINGLE))
def test_batch_of_one_with_any_mask(case, path, plain_oracle):
    prompt, mask = SINGLE[case]
    target = make_target("qwen3")
    check(target, torch.tensor([prompt]), None if mask is None else torch.tensor([mask]), path, plain_oracle)


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))  # full attention; sliding windows shorter than the output
def test_batch_of_three_with_a_mask_per_row(arch, path, plain_oracle):
    target = make_target(arch)
    check(target, torch.tensor(BATCH[0]), torch.tensor(BATCH[1]), path, plain_oracle)


@pytest.mark.parametrize("path", ["chain", "fixed tree"])
def test_position_ids_given_by_the_user(path, plain_oracle):
    """`generate(position_ids=...)`: the prompt at those positions, each new token one past the last."""
    target = make_target("qwen3")
    ids = torch.tensor([[9, 9, 8, 4, 6, 5, 4, 1, 7]])
    check(target, ids, None, path, plain_oracle, position_ids=torch.arange(5, 14)[None])


@pytest.mark.parametrize("path", ["chain", "fixed chain"])
def test_a_right_padded_batch(path, plain_oracle):
    """Right padding is rarely what a user means (transformers warns), but plain `generate` runs it: so does DFlash,
    with the same output (it used to refuse it)."""
    ids, mask = left_padded(3)
    check(make_target("qwen3"), ids.flip(1), mask.flip(1), path, plain_oracle)
