"""A bigram prior: draft children conditioned on their parent's token, without training.

A DFlash drafter gives each block position one distribution, the same whatever is drafted before it. So the chain's
drafts need not fit together, and in a tree the children of a runner-up are guesses made for the argmax above them
(accepted far less often than their probability says: docs/design.md). The prior reweights each
candidate x under its parent token a by how much a made x likelier in the drafter's training responses:

    q(x | a) ~ p_d(x) * boost(a, x),    boost(a, x) = (1 + mix / (1 - mix) * P(x | a) / P(x)) ** beta

renormalized over the position's candidates to the mass the drafter gave them. This is p_d times the interpolated
bigram over the unigram, (mix * P(x | a) + (1 - mix) * P(x)) / P(x), to the power beta, divided by the constant
(1 - mix) ** beta that the renormalization removes anyway; pairs seen fewer than `min_count` times get boost 1.
The first draft keeps the drafter's own probabilities: its parent, the newest committed token, is the block's first
token, which the drafter reads. The chain then drafts each later position's best candidate under the draft before it;
a tree's children are ranked under their own parent (`generation.tree.build_tree` with conditional probabilities);
under sampling the chain is drawn from them instead (`sample_conditional_chain`), as is a DFlash2 selector's.
Verification is unchanged, so the output is too. The defaults (beta 0.5, mix 0.9, min_count 2) were chosen on GSM8K,
HumanEval and MT-Bench and checked on MBPP and AlpacaEval (docs/design.md).

The prior lives in the drafter (`DFlashDraftModel.set_bigram_prior`: two tensors, saved with the weights), made by
`hf-dflash train` from its training data, or later by `hf-dflash bigram-prior`.
"""

from collections.abc import Iterable

import torch

from .sampling import exponential_race

DEFAULTS = {"beta": 0.5, "mix": 0.9, "min_count": 2}


def count_bigram_prior(
    samples: Iterable[tuple[list[int], list[int]]],
    vocab_size: int,
    draft_vocab: torch.LongTensor | None = None,
    beta: float = DEFAULTS["beta"],
    mix: float = DEFAULTS["mix"],
    min_count: int = DEFAULTS["min_count"],
) -> tuple[torch.LongTensor, torch.Tensor]:
    """The prior of `(input_ids, loss_mask)` samples (as `hf_dflash.training.data.load_samples` gives): every supervised
    (response) token x and the token a before it, prompt or response. Returns `keys` [E], sorted (a * vocab_size
    + x), and `boosts` [E] float32, for the pairs seen at least `min_count` times whose x the drafter can propose
    (`draft_vocab`, or any token)."""
    if not 0 < mix < 1 or beta < 0 or min_count < 1:
        raise ValueError(
            f"bigram prior: need 0 < mix < 1, beta >= 0, min_count >= 1; got {mix=}, {beta=}, {min_count=}."
        )
    parents, children = [], []
    for ids, mask in samples:
        ids, mask = torch.as_tensor(ids, dtype=torch.long), torch.as_tensor(mask, dtype=torch.bool)
        kept = mask[1:]
        parents.append(ids[:-1][kept])
        children.append(ids[1:][kept])
    none = [torch.zeros(0, dtype=torch.long)]  # no samples at all
    parents, children = torch.cat(parents or none), torch.cat(children or none)
    if children.numel() == 0:
        raise ValueError("bigram prior: the samples hold no supervised tokens to count.")
    child_counts = torch.bincount(children, minlength=vocab_size).double()
    parent_counts = torch.bincount(parents, minlength=vocab_size).double()
    keys, counts = torch.unique(parents * vocab_size + children, return_counts=True)  # sorted
    keep = counts >= min_count
    if draft_vocab is not None:
        keep &= torch.isin(keys % vocab_size, draft_vocab.cpu())
    keys, counts = keys[keep], counts[keep].double()
    unigram = (child_counts + 1) / (child_counts.sum() + vocab_size)  # add-one: never 0
    conditional = counts / parent_counts[keys // vocab_size]
    boosts = (1 + mix / (1 - mix) * conditional / unigram[keys % vocab_size]) ** beta
    return keys, boosts.float()


def lookup(prior: tuple, parents: torch.LongTensor, children: torch.LongTensor) -> torch.Tensor:
    """boost(parent, child) for broadcastable token id tensors (1 for pairs not in the prior), float32. `prior`:
    `(keys, boosts, vocab_size)`, as `DFlashDraftModel.bigram_prior` gives."""
    keys, boosts, vocab_size = prior
    query = parents * vocab_size + children
    if keys.numel() == 0:
        return torch.ones(query.shape, device=query.device)
    index = torch.searchsorted(keys, query.reshape(-1)).clamp_(max=keys.numel() - 1)
    found = keys[index] == query.reshape(-1)
    return torch.where(found, boosts[index].float(), 1.0).view(query.shape)


def conditional_probs(ids: torch.LongTensor, probs: torch.Tensor, prior: tuple) -> torch.Tensor:
    """The drafter's candidates reweighted under each possible parent: [rows, D, k, k] from `ids`, `probs` [rows, D,
    k] (most likely first; `DFlashDraftModel.draft_tokens(top_k=k)`). Entry [r, d, j] holds position d's candidates
    under candidate j of position d - 1, summing to what the drafter gave them. The first position's parent is the
    newest committed token, which the drafter reads itself (its block's first token): it keeps the drafter's own
    probabilities, for every j (counting that token again made its first drafts surer, not righter: docs/design.md)."""
    rows, depth, k = ids.shape
    boost = lookup(prior, ids[:, :-1, :, None], ids[:, 1:, None, :])  # [rows, D - 1, k, k]
    boost = torch.cat([boost.new_ones(rows, 1, k, k), boost], dim=1)  # [rows, D, k, k]
    weighted = probs.float()[:, :, None, :] * boost
    return weighted * (probs.float().sum(-1)[:, :, None, None] / weighted.sum(-1, keepdim=True))


def conditional_chain(ids: torch.LongTensor, probs: torch.Tensor) -> tuple[torch.LongTensor, torch.Tensor]:
    """The chain under `conditional_probs`: at each position the best candidate under the draft before it. Returns
    drafts [rows, D] and the first draft's probability [rows]."""
    walk, _ = conditional_walk(ids, probs)
    return walk[..., 0], probs[:, 0, 0].amax(-1)


def conditional_walk(ids: torch.LongTensor, probs: torch.Tensor) -> tuple[torch.LongTensor, torch.Tensor]:
    """`conditional_chain`'s drafts as candidates of their own, one per position: ids [rows, D, 1] and each draft's
    probability under the draft before it [rows, D, 1, 1] (`conditional_probs`' layout), so that a best-first tree
    of them is that chain."""
    rows, depth, _ = ids.shape
    arange = torch.arange(rows, device=ids.device)
    choice = torch.zeros(rows, dtype=torch.long, device=ids.device)  # position 0: every row is the drafter's own
    drafts, chances = [], []
    for d in range(depth):
        under_parent = probs[arange, d, choice]  # [rows, k]
        choice = under_parent.argmax(-1)
        drafts.append(ids[arange, d, choice])
        chances.append(under_parent[arange, choice])
    return torch.stack(drafts, dim=1)[..., None], torch.stack(chances, dim=1)[..., None, None]


def sample_conditional_chain(ids: torch.LongTensor, probs: torch.Tensor, temperature: float) -> tuple:
    """A chain drawn under `conditional_probs` ([rows, D, k, k]) at `temperature`: each position's candidate sampled
    from its probabilities under the draft before it, sharpened as the target's temperature sharpens logits
    (softmax(log p / T)). Returns drafts [rows, D] and the distribution each was drawn from [rows, D, k] over `ids`;
    each draw an exponential race (no host read)."""
    rows, depth, _ = ids.shape
    arange = torch.arange(rows, device=ids.device)
    choice = torch.zeros(rows, dtype=torch.long, device=ids.device)  # position 0: every row is the drafter's own
    drafts, proposal = [], []
    for d in range(depth):
        under_parent = probs[arange, d, choice].float()  # [rows, k]
        q = torch.softmax(under_parent.clamp_min(torch.finfo(torch.float32).tiny).log() / temperature, dim=-1)
        choice = exponential_race(q)
        drafts.append(ids[arange, d, choice])
        proposal.append(q)
    return torch.stack(drafts, dim=1), torch.stack(proposal, dim=1)
