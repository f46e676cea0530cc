"""Sampling without a host read: the draws of speculative sampling as tensor ops alone, so that the fixed-shape path
(`hf_dflash.generation.fixed_shape`) queues a whole step on the device; the general loop draws the same way.

- `exponential_race`: an index drawn from each row of probabilities, as `torch.multinomial` draws it.
- `rejection_sample`: speculative sampling's step for drafts drawn from a proposal q (Leviathan et al., 2023).
"""

import torch
from torch.nn import functional as F

from .cpu_ops import argmax


def exponential_race(probs: torch.Tensor) -> torch.LongTensor:
    """An index drawn from each row of `probs` [..., n] (unnormalised is fine): the argmax of p_i / E_i with E_i ~
    Exp(1) is i with probability p_i / sum(p). `torch.multinomial`'s distribution, without its host read."""
    waits = torch.empty_like(probs).exponential_().clamp_min_(torch.finfo(probs.dtype).tiny)  # 0 / 0 would win
    return argmax(probs / waits)


def rejection_sample(scores: torch.Tensor, drafts: torch.LongTensor, ids: torch.LongTensor, q: torch.Tensor):
    """Speculative sampling's step at positions [...] (any leading shape): `drafts` [...] were drawn from `q` [..., k]
    over the candidates `ids` [..., k]; each is kept with probability min(1, p / q) under the target's distribution
    p = softmax(`scores` [..., vocab]), else replaced by a token of the residual max(p - q, 0), normalised. The token
    returned is distributed as p whatever q is; a rejected draft has residual 0, so it is never returned."""
    p = F.softmax(scores, dim=-1)
    p_draft = p.gather(-1, drafts[..., None])[..., 0]
    q_draft = (q * (ids == drafts[..., None])).sum(-1).to(p.dtype)
    keep = torch.rand_like(q_draft) * q_draft < p_draft
    residual = p.scatter_add(-1, ids, -q.to(p.dtype)).clamp_min_(0)
    total = residual.sum(-1, keepdim=True)
    residual = torch.where(total > 0, residual / total.clamp_min(torch.finfo(p.dtype).tiny), p)  # 0: p == q
    return torch.where(keep, drafts, exponential_race(residual))
