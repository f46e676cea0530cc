"""A Markov head: draft children conditioned on their parent's token, learned.

One drafter forward gives each block position one distribution, whatever is drafted before it, so the chain's drafts
need not fit together and a tree's runner-ups get children guessed for the argmax (`hf_dflash.bigram` says more). The
bigram prior reweights candidates by counts of which token followed which; a Markov head (`DFlashMarkovHead`, in
the drafter) learns it from the drafter's own hidden state at the position and the parent token's embedding:

    q(x | a) = m * softmax over the position's k candidates of  w_x . head(h, e(a))

where h is the position's hidden state, w_x the output head's row of candidate x and m the mass the drafter gave
the k candidates (so the first k of a position keep their total, as with the prior). The first draft keeps the
drafter's own probabilities (its parent is the block's first token, which the drafter reads). Verification is
unchanged, so the output is too. `train_markov_head` (`hf-dflash markov-head`) trains the head on a frozen drafter,
teacher-forced: the parent is the true token before each block position, which is the case that matters (a draft
is only checked after its parent was accepted).
"""

import torch


def markov_probs(drafter, hidden: torch.Tensor, ids: torch.LongTensor, probs: torch.Tensor,
                 parent_embeds: torch.Tensor, candidate_rows: torch.Tensor, candidate_bias=None) -> torch.Tensor:
    """Each position's candidates under each candidate of the position before: [rows, D, k, k], entry [r, d, a]
    summing to what the drafter gave position d's candidates (`hf_dflash.bigram.conditional_probs`'s layout).

    hidden [rows, D, H]: the drafter's hidden states of the draft positions; ids, probs [rows, D, k]: its candidates,
    most likely first; parent_embeds [rows, D - 1, k, H]: the embeddings of ids[:, :-1]; candidate_rows [rows, D - 1,
    k, H] (and candidate_bias [rows, D - 1, k], if the head has one): the output head's rows of ids[:, 1:]."""
    k = ids.shape[-1]
    head = drafter.markov_head
    weight = head.out_proj.weight
    later = hidden[:, 1:, None, :].to(weight.device, weight.dtype)  # [rows, D - 1, 1, H]: one state, k parents
    reread = head(later, parent_embeds.to(weight.device, weight.dtype)).float()  # [rows, D - 1, k, H]
    logits = torch.einsum("rdah,rdxh->rdax", reread, candidate_rows.to(weight.device, torch.float32))
    if candidate_bias is not None:
        logits = logits + candidate_bias.to(weight.device, torch.float32)[:, :, None, :]
    logits = drafter._scale_logits(logits)  # [rows, D - 1, k (parents), k (children)]
    probs = probs.to(weight.device, torch.float32)
    first = probs[:, :1, None, :].expand(-1, -1, k, -1)  # the drafter's own, under every parent
    return torch.cat([first, logits.softmax(-1) * probs[:, 1:].sum(-1)[:, :, None, None]], dim=1)
