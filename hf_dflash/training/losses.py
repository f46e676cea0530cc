"""The drafter's loss: slot k of a block predicts x_{a+k} through the frozen target head.

Three losses (`TrainingConfig.loss`), all per slot, then weighted and averaged over every slot of the global batch:
- `ce`: cross-entropy with the recipe's fixed weights exp(-(k - 1) / gamma) (the paper, SpecForge).
- `dpace`: the same cross-entropy, weighted by the drafter's own detached confidences (D-PACE, arXiv 2605.18810):
  q_k = exp(-CE_k), smoothed q~_k = (1 - alpha) q_k + alpha, weight of slot j = sum_{m >= j} prod_{k <= m} q~_k, the
  expected number of accepted tokens that need slot j right. Early slots weigh more while later ones are unlearnt.
- `lk`: against the target's distribution p (its top-K probabilities from the feature store), LK family
  (arXiv 2602.23881): lambda KL(p || q) + (1 - lambda) TV(p, q), lambda = exp(-3 alpha) detached, where
  alpha = sum_v min(p_v, q_v) = 1 - TV is the acceptance probability of the slot. KL dominates while the drafter is
  far off, TV (what acceptance depends on) once it is close. Times the recipe's slot weights.

With a draft vocabulary only its rows of the head are scored: the logits are [rows, V'] instead of [rows, V], the
cost that dominates a CPU step. A label outside the draft vocabulary is masked from the loss (the drafter can never
propose it) and counted as a miss in the accuracy.
"""

import torch
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from .batches import flex_training_mask, training_mask

# gamma of the slot weights exp(-(k - 1) / gamma), from the recipe: later slots are accepted less often.
_GAMMA = {8: 4.0, 10: 5.0, 16: 7.0}


def default_gamma(block_size: int) -> float:
    """The recipe's gamma for block sizes 8, 10, 16; interpolated (B / 2 up to 10, then +1 per 3) elsewhere."""
    if block_size in _GAMMA:
        return _GAMMA[block_size]
    return block_size / 2 if block_size <= 10 else 5.0 + (block_size - 10) / 3


def slot_weights(block_size: int, gamma: float | None = None) -> torch.Tensor:
    """[B]: weight of each block slot; slot 0 (the anchor token itself) is not predicted."""
    gamma = default_gamma(block_size) if gamma is None else gamma
    k = torch.arange(block_size, dtype=torch.float32)
    return torch.where(k >= 1, torch.exp(-(k - 1) / gamma), torch.zeros(()))


def dpace_weights(ce: torch.Tensor, mask: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """D-PACE weights [..., S] from per-slot cross-entropies [..., S] (slots 1..B-1 of each block, `mask` where a
    label exists). Detached: the weights steer the gradient, they are not optimised."""
    q = torch.exp(-ce.detach().float()) * mask
    smoothed = (1 - alpha) * q + alpha * mask  # a missing slot ends the block: its factor is 0
    reach = torch.cumprod(smoothed, dim=-1)  # [..., S]: prod_{k <= m} q~_k
    return reach.flip(-1).cumsum(-1).flip(-1) * mask  # sum over m >= j


class LossHead:
    """The frozen target head as the loss sees it: all rows, or the draft vocabulary's rows (`token_ids`), plus the
    map from target token ids to row indices (-1 outside the draft vocabulary)."""

    def __init__(self, output_head: torch.nn.Module, token_ids: torch.Tensor | None = None):
        weight, bias = output_head.weight, getattr(output_head, "bias", None)
        vocab = weight.shape[0]
        if token_ids is None:
            self.weight, self.bias = weight, bias
            self.index = torch.arange(vocab, device=weight.device)
        else:
            token_ids = token_ids.to(weight.device)
            self.weight = weight[token_ids].detach()
            self.bias = None if bias is None else bias[token_ids].detach()
            self.index = torch.full((vocab,), -1, dtype=torch.long, device=weight.device)
            self.index[token_ids] = torch.arange(token_ids.numel(), device=weight.device)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden.to(self.weight.device), self.weight, self.bias).float()


def slot_losses(logits, labels, kind: str = "ce", target_ids=None, target_probs=None) -> torch.Tensor:
    """Per-row loss [R] from draft logits [R, V'] (float32) and labels [R] (row indices of the head, >= 0).
    For `lk`, the target's top-K distribution: target_ids [R, K] (row indices, -1 outside the head), probs [R, K]."""
    logp = logits.log_softmax(-1)
    if kind != "lk":
        return -logp.gather(1, labels[:, None]).squeeze(1)
    inside = target_ids >= 0
    p = target_probs.float() * inside
    p = p / p.sum(-1, keepdim=True).clamp(min=1e-9)  # the target's mass on the rows the drafter can propose
    logq = logp.gather(1, target_ids.clamp(min=0))
    alpha = torch.minimum(p, logq.exp()).sum(-1)
    kl = (p * (p.clamp(min=1e-9).log() - logq)).sum(-1)
    lam = torch.exp(-3 * alpha).detach()
    return lam * kl + (1 - lam) * (1 - alpha)


def chunked_slot_losses(hidden, head: LossHead, labels, mask, chunk_size: int, kind="ce", target_ids=None,
                        target_probs=None, top_k: int = 0):
    """`slot_losses` of the rows `mask` [R] of hidden [R, H] with target-vocabulary labels [R], `chunk_size` rows at
    a time (recomputed in backward when there are several chunks), so at most [chunk_size, V'] logits exist at once.

    Returns (losses [R], 0 elsewhere and where the label is outside the head; correct [R] bool), and with `top_k`
    also each scored row's k largest logits (with their gradient) and their head rows, [R, k] (0 elsewhere)."""
    rows_label = head.index[labels.to(head.index.device)].to(labels.device)
    scored = mask & (rows_label >= 0)
    rows = scored.nonzero().squeeze(1)
    losses = hidden.new_zeros(mask.shape, dtype=torch.float32)
    correct = torch.zeros_like(mask)

    def chunk(h, y, *target):
        logits = head.logits(h)
        y = y.to(logits.device)
        target = [t.to(logits.device) for t in target]
        if target:
            target[0] = head.index[target[0].clamp(min=0)].masked_fill(target[0] < 0, -1)
        out = slot_losses(logits, y, kind, *target).to(h.device), (logits.argmax(-1) == y).to(h.device)
        return (*out, *logits.topk(top_k, dim=-1)) if top_k else out

    parts = []
    for start in range(0, rows.numel(), chunk_size):
        idx = rows[start : start + chunk_size]
        args = [hidden[idx], rows_label[idx]]
        if kind == "lk":
            args += [target_ids[idx], target_probs[idx]]
        if hidden.requires_grad and rows.numel() > chunk_size:  # one chunk: keeping its logits costs no more
            parts.append(checkpoint(chunk, *args, use_reentrant=False))
        else:
            parts.append(chunk(*args))
    if parts:
        losses = losses.index_put((rows,), torch.cat([p[0] for p in parts]))
        correct[rows] = torch.cat([p[1] for p in parts])
    if not top_k:
        return losses, correct
    values = hidden.new_zeros(*mask.shape, top_k, dtype=torch.float32)
    ids = torch.zeros(*mask.shape, top_k, dtype=torch.long, device=hidden.device)
    if parts:
        values = values.index_put((rows,), torch.cat([p[2] for p in parts]).to(hidden.device))
        ids[rows] = torch.cat([p[3] for p in parts]).to(hidden.device)
    return losses, correct, values, ids


def chunked_loss(hidden, head, labels, mask, weights, chunk_size: int):
    """Weighted cross-entropy sum of the rows `mask` through `head` (an nn.Linear or a `LossHead`), chunked like
    `chunked_slot_losses`. hidden [R, H], labels [R], mask [R] bool, weights [R]. Returns (sum, correct [R])."""
    head = head if isinstance(head, LossHead) else LossHead(head)
    losses, correct = chunked_slot_losses(hidden, head, labels, mask, chunk_size)
    return (losses * weights.to(losses.dtype)).sum(), correct


def drafter_loss(drafter, target, batch: dict, features: torch.Tensor, config, slot_weight, forward=None,
                 head: LossHead | None = None, target_topk: tuple | None = None):
    """Weighted loss sum (divide by metrics["weight"] for the mean) and metrics of one micro-batch.

    features [b, T, len(ids) * H]: the target's features (no grad). `forward` is the module to call (the DDP / FSDP
    wrapper when distributed), `drafter` the unwrapped model. `head`: the loss head (default: the target's whole
    head). `target_topk`: (ids [b, T, K], probs [b, T, K]) of the target's next-token distribution at each
    position, for the `lk` loss."""
    B = config.block_size
    b, NB = batch["block_ids"].shape
    N = NB // B
    T = batch["input_ids"].shape[1]
    device = features.device
    with torch.no_grad():  # the embedding is the target's, frozen
        noise = drafter.embed(target, batch["block_ids"].to(device))
    positions = torch.cat([torch.arange(T, device=device).expand(b, -1), batch["block_pos"].to(device)], dim=1)
    masks = {}
    build = flex_training_mask if drafter.config._attn_implementation == "flex_attention" else training_mask
    for layer_type in set(drafter.config.layer_types or ["full_attention"]):
        window = drafter.config.sliding_window if layer_type == "sliding_attention" else None
        args = [batch[k].to(device) for k in ("anchors", "anchor_valid", "valid")]
        masks[layer_type] = build(*args, B, window)
    selector = getattr(drafter, "candidate_selector", None)  # a DFlash2 drafter
    hidden = (forward or drafter)(
        noise_embeds=noise, context_hidden_states=features, position_ids=positions, attention_mask=masks,
        **({"block_len": B} if selector is not None else {}),  # its convolutions stay inside each block
    ).last_hidden_state  # [b, N*B, H]
    labels = batch["labels"].to(device)  # [b, N, B]
    label_mask = batch["label_mask"].to(device)
    kind = getattr(config, "loss", "ce")
    extra = {}
    if kind == "lk":
        if target_topk is None:
            raise ValueError(
                "loss='lk' needs the target's distribution: train with a feature store written by "
                "`prepare-data --save-features DIR --target-topk 16` (--features DIR)."
            )
        # the distribution of x_{a+k} is the target's prediction at position a + k - 1
        where = (batch["block_pos"].to(device) - 1).clamp(0, T - 1)  # [b, N*B]; past the end: masked labels
        ids, probs = (t.to(device).gather(1, where[..., None].expand(-1, -1, t.shape[-1])) for t in target_topk)
        extra = {"target_ids": ids.reshape(-1, ids.shape[-1]), "target_probs": probs.reshape(-1, probs.shape[-1])}
    head = head or LossHead(target.get_output_embeddings())
    outputs = chunked_slot_losses(
        hidden.reshape(-1, hidden.shape[-1]), head, labels.reshape(-1), label_mask.reshape(-1),
        config.lm_head_chunk_size, kind, **extra, top_k=selector.top_k if selector is not None else 0,
    )
    losses, correct = outputs[0].view(b, N, B), outputs[1]
    if kind == "dpace":
        slot = torch.zeros_like(losses)
        slot[:, :, 1:] = dpace_weights(losses[:, :, 1:], label_mask[:, :, 1:], getattr(config, "dpace_alpha", 0.5))
        # rescaled to the total of the recipe's weights on the same slots, so the loss scale (and the normalisation
        # by the global weight in the loop) matches the other losses
        fixed = (slot_weight.to(device)[None, None, :] * label_mask).sum()
        slot = slot * (fixed / (slot * label_mask).sum().clamp(min=1e-9))
    else:
        slot = slot_weight.to(device)[None, None, :].expand(b, N, B)
    weights = slot * label_mask
    correct = correct.view(b, N, B)[:, :, 1:]
    slot_mask = label_mask[:, :, 1:]
    # Greedy acceptance of a block = length of its correct prefix (a wrong or missing slot ends it).
    accepted = (correct & slot_mask).long().cumprod(-1).sum(-1)[batch["anchor_valid"].to(device)]
    metrics = {
        "weight": weights.sum(),
        "slot_correct": (correct & slot_mask).sum((0, 1)).float(),
        "slot_count": slot_mask.sum((0, 1)).float(),
        "accepted": accepted.float().sum(),
        "blocks": torch.tensor(float(accepted.numel()), device=device),
    }
    total = (losses * weights).sum()
    if selector is not None:
        anchors = batch["block_ids"].to(device).view(b, N, B)[:, :, :1]
        parents = torch.cat([anchors, labels[:, :, :-1]], dim=-1)  # the true token before each slot (teacher forcing)
        selector_sum, selector_weight, metrics["selector_correct"], metrics["selector_count"] = selector_loss(
            selector, hidden.view(b, N, B, -1), outputs[2].view(b, N, B, -1), outputs[3].view(b, N, B, -1), head,
            labels, parents, weights,
        )
        # a weighted mean over the slots whose label is a candidate, scaled to the unary loss's normalisation
        scale = (metrics["weight"] / selector_weight.clamp(min=1e-9)).detach()
        total = total + getattr(config, "selector_loss_alpha", 0.1) * selector_sum * scale
    return total, metrics


def selector_loss(selector, hidden, unary, rows, head: LossHead, labels, parents, weights) -> tuple:
    """The DFlash2 selector's loss (the published recipe's strict top-k objective): at each slot, the cross-entropy
    of the label among the drafter's top-k candidates, scored under the true token before it; slots whose label is
    not a candidate teach the selector nothing. hidden [b, N, B, H], unary logits and head rows [b, N, B, k], labels
    and parents [b, N, B] (target ids), weights [b, N, B] (the unary loss's). Returns (weighted sum, its weight, slots
    the selector ranks right, slots it is trained on)."""
    candidates = head_token_ids(head, rows)  # [b, N, B, k] target ids
    hit = (candidates == labels[..., None]).reshape(-1, rows.shape[-1])  # [b*N*B, k]
    inside = hit.any(-1) & (weights > 0).reshape(-1)
    flat = lambda t: t.reshape(1, -1, *t.shape[3:])  # noqa: E731 [1, b*N*B, ...]: the selector's [rows, D, ...]
    scores = selector.scores(flat(hidden), flat(candidates), flat(unary), flat(parents[..., None]))[0, :, 0]
    target = hit.long().argmax(-1)
    ce = F.cross_entropy(scores, target, reduction="none")
    w = weights.reshape(-1) * inside
    correct = ((scores.argmax(-1) == target) & inside).sum().float()
    return (ce * w).sum(), w.sum(), correct, inside.sum().float()


def head_token_ids(head: LossHead, rows: torch.Tensor) -> torch.Tensor:
    """Target token ids of head rows (the draft vocabulary's, or all)."""
    if head.weight.shape[0] == head.index.shape[0]:
        return rows
    token_ids = torch.empty(head.weight.shape[0], dtype=torch.long, device=head.index.device)
    token_ids[head.index[head.index >= 0]] = (head.index >= 0).nonzero().squeeze(1)
    return token_ids[rows.to(token_ids.device)].to(rows.device)
