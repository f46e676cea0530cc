"""Blocks and masks of a training step: anchors, the `[x_a, MASK x (B - 1)]` blocks and their labels, and which keys
each block query sees (context strictly before its anchor, its own block)."""

import torch


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator) -> torch.Tensor:
    """Up to `num_anchors` distinct positions a with loss_mask[a] = loss_mask[a + 1] = 1, sorted."""
    ok = (loss_mask[:-1] > 0) & (loss_mask[1:] > 0)
    candidates = ok.nonzero().squeeze(1)
    if candidates.numel() > num_anchors:
        pick = torch.randperm(candidates.numel(), generator=generator)[:num_anchors]
        candidates = candidates[pick]
    return candidates.sort().values


def build_batch(samples, anchors, block_size: int, mask_token_id: int, pad_token_id: int = 0) -> dict:
    """Right-pad sequences and anchors of a micro-batch into tensors.

    Returns input_ids / valid / loss_mask [b, T], anchors / anchor_valid [b, N], block_ids / block_pos [b, N*B],
    labels / label_weight_mask [b, N, B] (slot k of block j predicts x_{a_j + k}).
    """
    b = len(samples)
    T = max(len(ids) for ids, _ in samples)
    N = max(max(len(a) for a in anchors), 1)
    B = block_size
    input_ids = torch.full((b, T), pad_token_id, dtype=torch.long)
    valid = torch.zeros(b, T, dtype=torch.bool)
    loss_mask = torch.zeros(b, T, dtype=torch.bool)
    anchor = torch.zeros(b, N, dtype=torch.long)
    anchor_valid = torch.zeros(b, N, dtype=torch.bool)
    for i, ((ids, mask), a) in enumerate(zip(samples, anchors)):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        valid[i, : len(ids)] = True
        loss_mask[i, : len(ids)] = torch.tensor(mask, dtype=torch.bool)
        anchor[i, : len(a)] = a
        anchor_valid[i, : len(a)] = True
    offsets = torch.arange(B)
    target_pos = anchor[:, :, None] + offsets  # [b, N, B]
    in_range = target_pos < T
    gathered = input_ids.gather(1, target_pos.clamp(max=T - 1).view(b, -1)).view(b, N, B)
    label_ok = in_range & loss_mask.gather(1, target_pos.clamp(max=T - 1).view(b, -1)).view(b, N, B)
    label_ok &= anchor_valid[:, :, None] & (offsets >= 1)
    block_ids = torch.full((b, N, B), mask_token_id, dtype=torch.long)
    block_ids[:, :, 0] = gathered[:, :, 0]
    return {
        "input_ids": input_ids,
        "valid": valid,
        "loss_mask": loss_mask,
        "anchors": anchor,
        "anchor_valid": anchor_valid,
        "block_ids": block_ids.view(b, N * B),
        "block_pos": target_pos.view(b, N * B),
        "labels": gathered,
        "label_mask": label_ok,
    }


def training_mask(anchors, anchor_valid, valid, block_size: int, window: int | None = None) -> torch.Tensor:
    """Boolean visibility [b, 1, N*B, T + N*B] of keys [context ; blocks] for the block queries.

    Block j sees context t < a_j (real tokens only) and its own block: bidirectionally, or causally and within
    `window` positions for a sliding-window layer. A padding block sees only itself, so no row is fully masked.
    """
    b, N = anchors.shape
    T = valid.shape[1]
    B = block_size
    q_block = torch.arange(N * B) // B  # [Q]
    q_slot = torch.arange(N * B) % B
    a = anchors[:, q_block]  # [b, Q]
    q_pos = a + q_slot
    t = torch.arange(T)
    context = (t[None, None, :] < a[:, :, None]) & valid[:, None, :] & anchor_valid[:, q_block, None]
    same_block = q_block[:, None] == q_block[None, :]  # [Q, Q]
    blocks = same_block[None].expand(b, -1, -1)
    if window is not None:
        context = context & (q_pos[:, :, None] - t[None, None, :] < window)
        blocks = blocks & (q_slot[None, :, None] >= q_slot[None, None, :])
    return torch.cat([context, blocks], dim=2)[:, None]


def flex_training_mask(anchors, anchor_valid, valid, block_size: int, window: int | None = None):
    """The same visibility as `training_mask`, as a flex_attention BlockMask (CUDA): never materialised densely."""
    from torch.nn.attention.flex_attention import create_block_mask

    b, N = anchors.shape
    T = valid.shape[1]
    B = block_size

    def mask_mod(batch, head, q, kv):
        j = q // B
        a = anchors[batch, j]
        is_context = kv < T
        kv_ctx = kv.clamp(max=T - 1)
        kv_blk = (kv - T).clamp(min=0)
        see_context = (kv_ctx < a) & valid[batch, kv_ctx] & anchor_valid[batch, j]
        see_block = kv_blk // B == j
        if window is not None:
            see_context = see_context & (a + q % B - kv_ctx < window)
            see_block = see_block & (kv_blk % B <= q % B)
        return torch.where(is_context, see_context, see_block)

    return create_block_mask(mask_mod, b, None, N * B, T + N * B, device=anchors.device)
