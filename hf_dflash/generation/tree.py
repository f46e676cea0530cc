"""Draft trees (DDTree, arXiv 2604.12989): many candidate continuations verified in one target forward.

One drafter forward gives a distribution over the draft vocabulary at every block position. A node at depth d is a
token for block position d; its score, the product of the drafter's probabilities along its path, is the
probability that the target accepts the node if the drafter is calibrated. `build_tree` keeps the `budget` best
nodes, best first. The target verifies all of them in one forward where each node sees the cache and its own
ancestors only (`tree_attention_mask`, positions = the next position + depth), the loop walks down the tree
following the target's own choices (`Decoder.verify`), and the cache keeps the accepted path only
(`kv_cache.gather_path`, then `kv_cache.keep_verified` as for a chain).

A chain of drafts is the tree where every node has one child: `DraftTree.chain`.
"""

import heapq
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicSlidingWindowLayer

from ..cpu_ops import argmax


def takes_explicit_masks(target) -> bool:
    """Whether the target's attention reads an explicit 4-D mask (eager, sdpa): what a tree, holes left in the cache
    and the fixed-shape path's masks need."""
    return target.config.get_text_config()._attn_implementation in ("eager", "sdpa")


def additive_mask(visible: torch.BoolTensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask as the additive one attention takes: 0 where visible, the dtype's minimum elsewhere."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, torch.finfo(dtype).min)


@dataclass
class DraftTree:
    """The tokens one target forward verifies. Per row, slot 0 is the root (the newest committed token, not yet in
    the cache) and slots 1..N the draft nodes in best-first order: a parent comes before its children, so the first
    n slots are a tree too. Every row has the same number of nodes."""

    tokens: torch.LongTensor  # [rows, 1 + N] target token ids
    parents: torch.LongTensor  # [rows, 1 + N] the parent's slot; -1 for the root
    depths: torch.LongTensor  # [rows, 1 + N] 0 for the root; a node at depth d drafts block position d
    scores: torch.Tensor | None = None  # [rows, N] path probabilities (non-increasing per row); None for a chain
    is_chain: bool = False  # every node the only child of the one before: the target's causal mask does
    # A chain (only) whose drafts were sampled (`DFlashProposer.sample_chain`): candidate ids [rows, N, k] and the
    # distribution [rows, N, k] each draft was drawn from; the target's rejection step reads them. None: point masses.
    proposal: tuple | None = None

    @classmethod
    def chain(cls, block: torch.LongTensor, proposal: tuple | None = None) -> "DraftTree":
        """`block` [rows, V]: the newest token, then V - 1 drafts, each the child of the one before."""
        slots = torch.arange(block.shape[1], device=block.device).expand_as(block)
        return cls(block, slots - 1, slots, is_chain=True, proposal=proposal)

    @property
    def num_drafts(self) -> int:
        return self.tokens.shape[1] - 1

    def first(self, num_drafts: int) -> "DraftTree":
        """The tree of the `num_drafts` best nodes (a prefix of the slots, parents first), in tensors of their own
        with the strides of new ones: a compiled verification guards its inputs' strides, even where a dimension has
        one row (`contiguous` would keep a slice's there)."""
        end = num_drafts + 1
        own = lambda t: t.clone(memory_format=torch.contiguous_format)  # noqa: E731
        scores = None if self.scores is None else own(self.scores[:, :num_drafts])
        tokens, parents, depths = (own(t[:, :end]) for t in (self.tokens, self.parents, self.depths))
        return DraftTree(tokens, parents, depths, scores, self.is_chain)


def build_tree(root: torch.LongTensor, ids: torch.LongTensor, probs: torch.Tensor, budget: int) -> DraftTree:
    """The best-first tree of at most `budget` draft nodes under each row's `root` token.

    `ids`, `probs` [rows, D, k]: the drafter's k most likely tokens for block positions 1..D and their probabilities,
    most likely first. Every node at depth d then has the same k candidate children (the drafter's distribution at
    position d + 1 does not depend on the path), so from a node the next best candidates are its first child and its
    next sibling: a heap over those yields the nodes in non-increasing score order, and the tree holds the chain of
    argmaxes' first nodes. `probs` [rows, D, k, k] instead: the children's probabilities under their parent
    (`hf_dflash.bigram.conditional_probs`; [r, d, j] under candidate j of position d), each parent ranking its
    children by its own row.
    """
    rows, depth, k = ids.shape
    conditional = probs.dim() == 4
    # p[r][d][j]: position d's candidates, best first, under candidate j of position d - 1 (j = 0 unconditional)
    order = probs.sort(dim=-1, descending=True, stable=True).indices if conditional else None
    p = (probs.gather(-1, order) if conditional else probs[:, :, None]).double().tolist()  # the heap runs in Python
    order = order.tolist() if conditional else None
    size = min(budget, sum(k**d for d in range(1, depth + 1)))  # the same for every row
    nodes = []  # per row, in slot order: (depth - 1, candidate index, parent slot)
    scores = []  # per row, in slot order: the path probability
    for r in range(rows):
        row_nodes, row_scores = [], [1.0]  # row_scores[slot]; the root is slot 0
        heap = [(-p[r][0][0][0], 0, 0, 0, 0)]  # (-score, depth - 1, rank under the parent, parent slot, its index)
        while len(row_nodes) < size:
            negative, d, rank, parent, j = heapq.heappop(heap)
            index = order[r][d][j][rank] if conditional else rank
            row_nodes.append((d, index, parent))
            row_scores.append(-negative)
            if rank + 1 < k:  # its next sibling
                heapq.heappush(heap, (-row_scores[parent] * p[r][d][j][rank + 1], d, rank + 1, parent, j))
            if d + 1 < depth:  # its first child
                child_row = index if conditional else 0
                heapq.heappush(heap, (negative * p[r][d + 1][child_row][0], d + 1, 0, len(row_nodes), child_row))
        nodes.append(row_nodes)
        scores.append(row_scores[1:])
    device = ids.device
    # [rows, size, 3], also for size == 0
    index = torch.tensor(nodes, dtype=torch.long, device=device).view(rows, size, 3)
    position, rank, parent = index.unbind(-1)  # position: depth - 1; rank: the candidate's index into `ids`
    tokens = ids[torch.arange(rows, device=device)[:, None], position, rank]  # [rows, size]
    return DraftTree(
        tokens=torch.cat([root.to(device)[:, None], tokens], dim=1),
        parents=torch.cat([parent.new_full((rows, 1), -1), parent], dim=1),
        depths=torch.cat([position.new_zeros(rows, 1), position + 1], dim=1),
        scores=torch.tensor(scores, dtype=torch.float64, device=device).view(rows, size),
        is_chain=k == 1,  # one candidate per position: each node the only child of the one before
    )


def build_tree_on_device(root: torch.LongTensor, ids: torch.LongTensor, probs: torch.Tensor,
                         budget: int) -> DraftTree:
    """`build_tree`'s tree from tensor ops alone: no host read and the same shapes every step (the fixed-shape path,
    `hf_dflash.generation.fixed_shape`). Arguments as `build_tree`'s.

    A beam keeps the `size` best nodes of each depth, each expanded by the k candidates of the next position; the
    tree is the `size` best nodes of all beams. A node scores at most its parent, so every node of the best `size`
    has its parent among them and in its depth's beam; sorted by score, ties in depth order, parents come before
    their children. Ties aside, the nodes are `build_tree`'s."""
    rows, depth, k = ids.shape
    device = ids.device
    conditional = probs.dim() == 4
    size = min(budget, sum(k**d for d in range(1, depth + 1)))
    beam_score = (probs[:, 0, 0] if conditional else probs[:, 0]).double()  # [rows, k]: depth 1, under the root
    beam_parent = torch.zeros(rows, k, dtype=torch.long, device=device)  # the parent's index into the last beam
    beam_rank = torch.arange(k, device=device).expand(rows, -1)  # the candidate's index into `ids`
    scores, parents, ranks, depths = [], [], [], []
    for d in range(depth):
        if d:  # the last beam's n nodes' children, [rows, n * k]
            n = beam_score.shape[1]
            if conditional:  # under each node's own candidate
                under = probs[:, d].gather(1, beam_rank[:, :, None].expand(-1, -1, k))  # [rows, n, k]
            else:
                under = probs[:, d, None, :]  # [rows, 1, k]
            beam_score = (beam_score[:, :, None] * under).flatten(1)
            beam_parent = torch.arange(n, device=device).repeat_interleave(k).expand(rows, -1)
            beam_rank = torch.arange(k, device=device).repeat(n).expand(rows, -1)
        best = beam_score.topk(min(size, beam_score.shape[1]), dim=-1).indices
        beam_score, beam_parent, beam_rank = (t.gather(1, best) for t in (beam_score, beam_parent, beam_rank))
        offset = sum(p.shape[1] for p in parents[:-1])  # where the last beam starts among all beams' nodes
        parents.append(beam_parent + offset if d else torch.full_like(beam_parent, -1))
        scores.append(beam_score)
        ranks.append(beam_rank)
        depths.append(torch.full_like(beam_rank, d))
    scores, parents, ranks, depths = (torch.cat(t, dim=1) for t in (scores, parents, ranks, depths))
    chosen = scores.sort(dim=-1, descending=True, stable=True).indices[:, :size]  # [rows, size], best first
    slot_of = torch.zeros_like(scores, dtype=torch.long).scatter_(
        1, chosen, torch.arange(1, size + 1, device=device).expand(rows, -1))  # 0: the root, or not chosen
    parent = parents.gather(1, chosen)
    parent_slot = torch.where(parent >= 0, slot_of.gather(1, parent.clamp(min=0)), 0)
    position, rank = depths.gather(1, chosen), ranks.gather(1, chosen)
    tokens = ids.flatten(1).gather(1, position * k + rank)
    return DraftTree(
        tokens=torch.cat([root.to(device)[:, None], tokens], dim=1),
        parents=torch.cat([parent_slot.new_full((rows, 1), -1), parent_slot], dim=1),
        depths=torch.cat([position.new_zeros(rows, 1), position + 1], dim=1),
        scores=scores.gather(1, chosen),
        is_chain=k == 1,
    )


def ancestors(tree: DraftTree, max_depth: int | None = None) -> torch.BoolTensor:
    """[rows, T, T]: slot j is slot i itself or one of its ancestors. From "itself or its parent", each squaring of
    the reach matrix doubles the distance covered: log2(depth) small matmuls (exact: 0/1 sums of at most T terms)
    instead of a pass per slot. `max_depth`: a bound on the tree's depth known beforehand (no host read)."""
    rows, length = tree.parents.shape
    device = tree.parents.device
    reach = torch.eye(length, device=device).repeat(rows, 1, 1)
    reach[:, 1:].scatter_(-1, tree.parents[:, 1:, None], 1.0)
    span, depth = 1, int(tree.depths.max()) if max_depth is None else max_depth
    while span < depth:
        reach = (reach @ reach).clamp_(max=1)
        span *= 2
    return reach.bool()


def tree_attention_mask(tree: DraftTree, valid: torch.BoolTensor, cache, dtype: torch.dtype):
    """The target's attention mask for verifying `tree`: each node sees the valid cache slots and its ancestors.

    Additive 4-D masks `[rows, 1, T, keys]` (transformers uses a 4-D mask as given, and eager attention adds it).
    `valid` [rows, S] marks the real cache slots; with sliding-window layers they are left-padded, so slot j of a
    row sits at position `next_pos - S + j` and a node at depth d at `next_pos + d`. Sliding-window layers return
    only their window of the old slots plus the block, and see a key only within the window, counted in positions:
    they get their own mask, and a target with both kinds of layers gets `{"full_attention": ...,
    "sliding_attention": ...}`, the per-layer-type mapping transformers' hybrid models accept.
    """
    family = ancestors(tree)  # [rows, T, T]
    rows, length = tree.tokens.shape
    slots = valid.shape[1]
    masks = {}
    for layer in cache.layers:
        sliding = isinstance(layer, DynamicSlidingWindowLayer)
        kind = "sliding_attention" if sliding else "full_attention"
        if kind in masks:
            continue
        if not sliding:
            visible = torch.cat([valid[:, None, :].expand(rows, length, slots), family], dim=-1)
        else:
            window = layer.sliding_window
            stored = min(layer.keys.shape[-2], window - 1)  # what `update` returns of the old slots
            old = torch.arange(slots - stored, slots, device=valid.device)
            distance = (slots + tree.depths)[:, :, None] - old  # [rows, T, stored]
            seen_old = valid[:, None, slots - stored :] & (distance < window)
            seen_block = family & (tree.depths[:, :, None] - tree.depths[:, None, :] < window)
            visible = torch.cat([seen_old, seen_block], dim=-1)
        masks[kind] = additive_mask(visible, dtype)[:, None]
    return next(iter(masks.values())) if len(masks) == 1 else masks


def mask_one_token(device) -> bool:
    """Whether a one-token verification in tree mode takes a 4-D mask (`tree_attention_mask`) rather than none. On a
    CPU, SDPA's kernel for a single query without a mask is slower in bfloat16 than with one (docs/design.md), and
    "auto" times its curve the same way (`forward_costs.time_forwards`). Elsewhere one-token steps keep the maskless
    path, the one GPU kernels are tuned for."""
    return torch.device(device).type == "cpu"


def greedy_paths(scores: torch.Tensor, tree: DraftTree) -> tuple[list[list[int]], list[list[int]]]:
    """Each row's greedy walk down `tree`: from the root on to the child that drafted the best-scoring token after
    the current slot, while there is one. `scores` [rows, slots, vocab]. Returns per row the path's slots and the
    token chosen after each (the accepted drafts, then the target's own).

    A chain takes every slot's maximum in one op: its slots are all visited when its drafts are right. On a CPU a
    tree takes one op per depth over the slots the walks reached: most of its nodes are off the accepted path, whose
    maxima would be wasted work. An accelerator takes every node's at once (one host round trip instead of one per
    depth). `cpu_ops.argmax` rather than `torch.argmax`: the same first index of the maximum (the float32 upcast of
    `generate` is exact), faster on a CPU (docs/design.md)."""
    rows, slots, _ = scores.shape
    parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
    at_once = tree.is_chain or scores.device.type != "cpu"
    every = argmax(scores).tolist() if at_once else None
    paths, choices = [[0] for _ in range(rows)], [[] for _ in range(rows)]
    live = list(range(rows))
    while live:
        at = [paths[r][-1] for r in live]
        if every is None:
            best = argmax(scores[live, at]).tolist()
        else:
            best = [every[r][slot] for r, slot in zip(live, at)]
        still = []
        for r, slot, choice in zip(live, at, best):
            choices[r].append(choice)
            # parents come before their children, and siblings hold distinct tokens
            child = next((k for k in range(slot + 1, slots) if parents[r][k] == slot and tokens[r][k] == choice), None)
            if child is not None:
                paths[r].append(child)
                still.append(r)
        live = still
    return paths, choices
