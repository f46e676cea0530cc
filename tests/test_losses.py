"""The losses: the draft-vocabulary head equals the full head on the rows it keeps, and each loss pulls the drafter the
right way on a toy case (gradient signs), D-PACE weights follow their definition."""

import pytest
import torch
from torch.nn import functional as F

from hf_dflash.training import LossHead, chunked_slot_losses, dpace_weights
from hf_dflash.training.losses import slot_losses

from conftest import make_target


def test_draft_vocabulary_loss_equals_the_full_loss_on_its_rows():
    head = make_target("qwen3").get_output_embeddings()
    vocab = head.weight.shape[0]
    g = torch.Generator().manual_seed(0)
    keep = torch.randperm(vocab, generator=g)[:40]
    hidden = torch.randn(30, head.weight.shape[1], generator=g, dtype=torch.float64)
    labels = torch.randint(0, vocab, (30,), generator=g)
    labels[:10] = keep[:10]  # some labels surely inside
    mask = torch.ones(30, dtype=torch.bool)
    losses, correct = chunked_slot_losses(hidden, LossHead(head, keep), labels, mask, chunk_size=7)
    inside = torch.isin(labels, keep)
    logits = head(hidden)[:, keep].float()  # the full head's logits restricted to the kept rows
    index = {int(t): i for i, t in enumerate(keep)}
    mapped = torch.tensor([index.get(int(t), 0) for t in labels])
    expected = F.cross_entropy(logits, mapped, reduction="none")
    torch.testing.assert_close(losses[inside], expected[inside], check_dtype=False)
    assert (losses[~inside] == 0).all() and not correct[~inside].any()  # masked, and a miss
    # the whole vocabulary as a "draft vocabulary" in another order is the full loss
    full, _ = chunked_slot_losses(hidden, LossHead(head, torch.randperm(vocab, generator=g)), labels, mask, 64)
    torch.testing.assert_close(full, F.cross_entropy(head(hidden).float(), labels, reduction="none"),
                               check_dtype=False)


@pytest.mark.parametrize("kind", ["ce", "lk"])
def test_each_loss_pulls_the_drafter_towards_the_target(kind):
    # toy: 6 tokens, the label (and the target's favourite) is token 2
    logits = torch.zeros(1, 6, requires_grad=True)
    labels = torch.tensor([2])
    target_ids = torch.tensor([[2, 4, -1]])  # the target: 0.7 on token 2, 0.3 on token 4; -1: not captured
    target_probs = torch.tensor([[0.7, 0.3, 0.0]])
    loss = slot_losses(logits, labels, kind, target_ids, target_probs).sum()
    loss.backward()
    grad = logits.grad[0]
    assert grad[2] < 0  # raising the right token's logit lowers the loss
    assert grad[0] > 0 and grad[5] > 0  # tokens the target never says are pushed down
    if kind == "lk":
        assert grad[4] < 0  # the target's runner-up (0.3 > 1/6) is pulled up too: a soft label, unlike ce
        # at q = p the loss is at its minimum: zero KL and zero total variation
        exact = torch.log(torch.tensor([[1e-9, 1e-9, 0.7, 1e-9, 0.3, 1e-9]]))
        assert slot_losses(exact, labels, "lk", target_ids, target_probs).item() < 1e-6


def test_dpace_weights_follow_the_definition_and_favour_reachable_slots():
    ce = torch.tensor([[0.1, 2.0, 0.1, 0.1]])  # slot 2 is hard: the slots after it are rarely reached
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)  # the last slot has no label
    w = dpace_weights(ce, mask, alpha=0.5)
    q = 0.5 * torch.exp(-ce) + 0.5
    reach = torch.cumprod(q * mask, -1)
    expected = torch.stack([reach[0, j:3].sum() for j in range(3)] + [torch.tensor(0.0)])[None]
    torch.testing.assert_close(w, expected)
    assert w[0, 0] > w[0, 1] > w[0, 2] > w[0, 3] == 0
    ce.requires_grad_(True)
    assert not dpace_weights(ce, mask).requires_grad  # detached: weights steer, they are not optimised
    # a confident drafter keeps later slots' weights high; an unsure one concentrates on the first slots
    sure, unsure = dpace_weights(torch.full((1, 4), 0.01), torch.ones(1, 4, dtype=torch.bool)), \
        dpace_weights(torch.full((1, 4), 3.0), torch.ones(1, 4, dtype=torch.bool))
    assert sure[0, 3] / sure[0, 0] > unsure[0, 3] / unsure[0, 0]
