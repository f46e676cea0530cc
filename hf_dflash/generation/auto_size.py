"""`draft_tree_size="auto"`: how many draft nodes a step verifies.

How many drafts pay depends on the hardware and dtype: on a GPU a forward over 16 tokens costs about what a one-token
forward costs, on a CPU in float32 several times more. Each step, `AutoTreeSize` picks the number of best-first tree
nodes n that maximises expected committed tokens per second,

    (rows + E[accepted drafts | the n best nodes]) / (t(n + 1) + the rest of a step),

where E[accepted] is the sum of the nodes' path probabilities (the probability that a node is on the accepted path,
if the drafter is calibrated; `NodeCalibration` corrects them per depth by what the call has seen so far), t and the
rest of a step as the call's own steps measure them (`hf_dflash.generation.forward_costs.LoopCosts`), and n = 0 is a
one-token step.
"""

import torch

from .tree import DraftTree


def choose_tree_size(scores: torch.Tensor, costs, overhead: float = 0.0) -> int:
    """The number of draft nodes n (0 = none) maximising expected committed tokens per second for a batch whose
    rows verify the first n nodes of their best-first trees; `scores` [rows, N]: the nodes' path probabilities,
    best first (`DraftTree.scores`). Every row commits its accepted drafts plus the target's own token. `costs`: t(k)
    (`ForwardCosts`, `LoopCosts`); `overhead`: the seconds a step spends besides its verification."""
    rows, size = scores.shape
    expected = scores.double().sum(0).cumsum(0).tolist()  # accepted drafts over the rows with n = 1..N nodes
    best, best_rate = 0, rows / (costs(1) + overhead)
    for n in range(1, size + 1):
        rate = (rows + expected[n - 1]) / (costs(n + 1) + overhead)
        if rate > best_rate:
            best, best_rate = n, rate
    return best


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
        self.predicted = torch.zeros(max_depth, dtype=torch.float64)  # summed scores of the nodes at depths 1..
        self.observed = torch.zeros(max_depth, dtype=torch.float64)  # how many of them were on the accepted path
        self.nodes = torch.zeros(max_depth, dtype=torch.float64)  # how many were verified
        self.prior_steps = prior_steps

    def update(self, tree: DraftTree, path: torch.LongTensor, accepted: torch.LongTensor) -> None:
        """`tree`: a verified tree with scores [rows, N]; `path` [rows, L]: its accepted slots (root first) and
        `accepted` [rows] how many drafts each row accepted."""
        rows, size = tree.scores.shape
        on_path = torch.zeros(rows, size + 1, dtype=torch.float64)
        depth = torch.arange(path.shape[1])
        on_path.scatter_(1, path.cpu(), (depth <= accepted.cpu()[:, None]).double())
        index = tree.depths[:, 1:].cpu().reshape(-1) - 1
        self.predicted.index_add_(0, index, tree.scores.cpu().double().reshape(-1))
        self.observed.index_add_(0, index, on_path[:, 1:].reshape(-1))
        self.nodes.index_add_(0, index, torch.ones_like(index, dtype=torch.float64))

    def __call__(self, tree: DraftTree) -> torch.Tensor:
        """The scores [rows, N] of `tree`'s nodes, each scaled by its depth's observed / predicted (shrunk), at
        most 1."""
        prior = self.prior_steps * self.predicted / self.nodes.clamp(min=1)  # prior_steps x the depth's mean score
        factor = torch.where(self.nodes > 0, (self.observed + prior) / (self.predicted + prior).clamp(min=1e-12), 1.0)
        scores = tree.scores
        return (scores * factor[tree.depths[:, 1:].cpu() - 1].to(scores.device, scores.dtype)).clamp(max=1.0)


class AutoTreeSize:
    """The "auto" policy of one `generate` call: `choose` the drafts a step's best-first tree verifies from the
    call's `LoopCosts` (timed by the decoder) and the nodes' calibrated scores; `update` the calibration after each
    verification."""

    def __init__(self, costs, max_depth: int):
        self.costs = costs
        self.calibration = NodeCalibration(max_depth)

    @property
    def max_nodes(self) -> int:
        """The largest tree worth building: the largest verification the cost curve covers, less its root."""
        return self.costs.curve.max_tokens - 1

    def choose(self, tree: DraftTree) -> int:
        return choose_tree_size(self.calibration(tree), self.costs, self.costs.overhead)

    def update(self, tree: DraftTree, path: torch.LongTensor, accepted: torch.LongTensor) -> None:
        self.calibration.update(tree, path, accepted)
