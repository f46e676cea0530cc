"""`draft_tree_size="auto"`: how many draft nodes a step verifies.

How many drafts pay depends on the hardware and dtype: on a GPU a forward over 16 tokens costs about what a one-token
forward costs, on a CPU in float32 several times more. Each step, `AutoTreeSize` picks the number of best-first tree
nodes n that maximises expected committed tokens per second,

    (rows + E[accepted drafts | the n best nodes]) / (t(n + 1) + the rest of a step),

where E[accepted] is the sum of the nodes' path probabilities (the probability that a node is on the accepted path,
if the drafter is calibrated; `NodeCalibration` corrects them per depth by what the call has seen so far), t and the
rest of a step as the call's own steps measure them (`hf_dflash.generation.forward_costs.LoopCosts`), and n = 0 is a
one-token step. On the fixed-shape path (`hf_dflash.generation.fixed_shape`) n is one of a few sizes, each a
compiled shape (`tree_size_menu`), and t is a whole step's time at that width (`forward_costs.StepCosts`).
"""

import torch

from .forward_costs import StepCosts, load_forward_costs
from .tree import DraftTree


def choose_tree_size(scores: torch.Tensor, costs, overhead: float = 0.0, sizes=None,
                     live: torch.BoolTensor | None = None) -> int:
    """The number of draft nodes n (0 = none) maximising expected committed tokens per second for a batch whose
    rows verify the first n nodes of their best-first trees; `scores` [rows, N]: the nodes' path probabilities,
    best first (`DraftTree.scores`). Every row commits its accepted drafts plus the target's own token. `costs`: t(k)
    (`ForwardCosts`, `LoopCosts`, `StepCosts`); `overhead`: the seconds a step spends besides its verification;
    `sizes`: the n to choose from (default: 0..N); `live` [rows]: the rows that commit (default: all). The device is
    read once."""
    weights = (torch.ones(len(scores)) if live is None else live).to(scores.device, scores.dtype)
    summed = (scores * weights[:, None]).sum(0).cumsum(0)  # accepted drafts over the rows with n = 1..N nodes
    rows, *expected = torch.cat([weights.sum()[None], summed]).tolist()
    best, best_rate = None, 0.0
    for n in range(len(expected) + 1) if sizes is None else (n for n in sizes if n <= len(expected)):
        rate = (rows + (expected[n - 1] if n else 0.0)) / (costs(n + 1) + overhead)
        if best is None or rate > best_rate:
            best, best_rate = n, rate
    return best


NARROW_SAVES = 0.1  # a tree of 1 or 2 drafts joins the menu where its forward costs this share less than 3 drafts'


def tree_size_menu(max_nodes: int, costs=None) -> tuple[int, ...]:
    """The sizes "auto" chooses from on the fixed-shape path, whose every verification width is a compiled shape:
    trees whose width (root and nodes) is a power of two, up to `max_nodes`, and 0 (a one-token step); and, where the
    target's forward `costs` (t(k), `ForwardCosts`) price a forward over 2 or 3 tokens at least `NARROW_SAVES` below
    one over 4, trees of 1 or 2 drafts. On a GPU t(k) is about flat up to 32 tokens, and in bfloat16 on the AMX Xeon
    t(16) was 1.05 t(8): the powers of two. In float32 on a CPU t(3) was 0.74 t(4) (oneDNN picks kernels by shape),
    and texts the drafter guesses poorly are served best by 1-2 drafts there (docs/design.md)."""
    sizes = (0, *(2**i - 1 for i in range(2, max_nodes.bit_length() + 2) if 2**i - 1 <= max_nodes))
    if costs is None or max_nodes < 3:
        return sizes
    narrow = tuple(n for n in (1, 2) if costs(n + 1) <= (1 - NARROW_SAVES) * costs(4))
    return (0, *narrow, *sizes[1:])


class NodeCalibration:
    """How often the drafter's path probabilities come true, per tree depth, over one `generate` call.

    A node's score is the chance the target accepts it only if the drafter is calibrated, and a drafter trained on
    little data is overconfident, the more so for deep nodes (docs/design.md). So after each verification the scores
    of the nodes at each depth and how many of them the accepted path went through are added up, and `__call__`
    scales each node's score by its depth's observed / predicted, shrunk toward 1 (the drafter's own word) as if
    `prior_steps` steps had matched it. Kept per depth rather than per best-first slot: a step's tree has one node per
    slot but several per depth, and a slot deep in the order sees rare hits whose noise "auto" would chase (one hit in
    40 steps of a slot scored 0.01 would scale it by 2.4)."""

    def __init__(self, max_depth: int, prior_steps: float = 4.0):
        self.max_depth = max_depth
        self.predicted = self.observed = self.nodes = None  # per depth 1..: summed scores, hits, verified nodes
        self.prior_steps = prior_steps

    def update(self, tree: DraftTree, path: torch.LongTensor, accepted: torch.LongTensor,
               live: torch.BoolTensor | None = None) -> None:
        """`tree`: a verified tree with scores [rows, N]; `path` [rows, L]: its accepted slots (root first) and
        `accepted` [rows] how many drafts each row accepted; `live` [rows]: the rows that count (default: all). On the
        scores' device, without a host read."""
        scores = tree.scores
        device = scores.device
        dtype = torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64
        if self.predicted is None:
            self.predicted, self.observed, self.nodes = (
                torch.zeros(self.max_depth, dtype=dtype, device=device) for _ in range(3))
        rows, size = scores.shape
        weight = torch.ones(rows, dtype=dtype, device=device) if live is None else live.to(device, dtype)
        on_path = torch.zeros(rows, size + 1, dtype=dtype, device=device)
        depth = torch.arange(path.shape[1], device=device)
        on_path.scatter_(1, path.to(device), (depth <= accepted.to(device)[:, None]).to(dtype))
        index = tree.depths[:, 1:].to(device).reshape(-1) - 1
        self.predicted.index_add_(0, index, (scores.to(dtype) * weight[:, None]).reshape(-1))
        self.observed.index_add_(0, index, (on_path[:, 1:] * weight[:, None]).reshape(-1))
        self.nodes.index_add_(0, index, weight[:, None].expand(-1, size).reshape(-1))

    def __call__(self, tree: DraftTree) -> torch.Tensor:
        """The scores [rows, N] of `tree`'s nodes, each scaled by its depth's observed / predicted (shrunk), at
        most 1."""
        scores = tree.scores
        if self.predicted is None:
            return scores
        prior = self.prior_steps * self.predicted / self.nodes.clamp(min=1)  # prior_steps x the depth's mean score
        factor = torch.where(self.nodes > 0, (self.observed + prior) / (self.predicted + prior).clamp(min=1e-12), 1.0)
        depth = tree.depths[:, 1:].to(factor.device) - 1
        return (scores * factor[depth].to(scores.device, scores.dtype)).clamp(max=1.0)


class AutoTreeSize:
    """The "auto" policy of one `generate` call: `choose` the drafts a step's best-first tree verifies from the
    call's costs (`LoopCosts`, timed by the decoder, or on the fixed-shape path `StepCosts`) and the nodes'
    calibrated scores, among `sizes` (default: any); `update` the calibration after each verification."""

    def __init__(self, costs, max_depth: int, sizes: tuple[int, ...] | None = None):
        self.costs = costs
        self.calibration = NodeCalibration(max_depth)
        self.sizes = sizes

    @property
    def max_nodes(self) -> int:
        """The largest tree worth building: the largest verification the cost curve covers, less its root (or the
        largest of `sizes`)."""
        return max(self.sizes) if self.sizes else self.costs.curve.max_tokens - 1

    def choose(self, tree: DraftTree, live: torch.BoolTensor | None = None) -> int:
        return choose_tree_size(self.calibration(tree), self.costs, self.costs.overhead, self.sizes, live)

    def update(self, tree: DraftTree, path: torch.LongTensor, accepted: torch.LongTensor,
               live: torch.BoolTensor | None = None) -> None:
        self.calibration.update(tree, path, accepted, live)


def fixed_shape_auto(target, batch_size: int, block_size: int, chains_only: bool = False) -> AutoTreeSize:
    """The "auto" policy of a fixed-shape call: each step's size chosen among `tree_size_menu`'s, by the steps' own
    costs (`StepCosts`, from the target's timed forward curve until the call has measured them); with `chains_only`,
    chain lengths."""
    curve = load_forward_costs(target, batch_size=batch_size)
    # Every step builds the widest tree, whichever size it then verifies, and the choice does not see that cost: the
    # widest is held to two candidates a depth (docs/design.md: wider trees were slower on a CPU)
    widest = min(curve.max_tokens, block_size if chains_only else 2 * block_size) - 1
    return AutoTreeSize(StepCosts(curve), max_depth=block_size - 1, sizes=tree_size_menu(widest, curve))
