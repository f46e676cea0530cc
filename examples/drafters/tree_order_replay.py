"""Would a calibrated best-first order accept more at the same node budget? (RESULTS.md, "Issue 13 on the EPYC").

A node's score is the product of the drafter's per-position probabilities along its path, and the drafter's
distribution at a position does not depend on the path: below a runner-up its best guess was made for the argmax
above. This reads a record of `auto_replay.py --record` (a big tree verified every step, each step's accepted path
kept) and prints, per depth, sibling rank and whether the parent lies on the all-argmax path, how often a node was
accepted when its parent was, against the drafter's conditional probability. Then it rebuilds each step's tree of n
nodes best first by scores with each factor corrected by those observed / predicted ratios (fitted on the same steps:
an upper bound on what the correction could gain) and counts the tokens each step commits, against the drafter's own
order. Trees are subsets of the recorded tree, so every accepted length is exact.

    python examples/drafters/auto_replay.py --record /tmp/steps32.json --record-size 32 --sets gsm8k humaneval mtbench
    python examples/drafters/tree_order_replay.py /tmp/steps32.json
"""

import heapq
import json
import sys
from collections import defaultdict


def annotate(step: dict) -> dict:
    """Per slot (0 = root): path score, parent, depth, rank among siblings, whether it lies on the argmax path."""
    score = [1.0] + step["scores"]
    parent, depth = step["parents"], step["depths"]
    children = defaultdict(list)
    for slot in range(1, len(score)):
        children[parent[slot]].append(slot)
    rank = [0] * len(score)
    for siblings in children.values():
        for r, slot in enumerate(sorted(siblings, key=lambda s: -score[s])):
            rank[slot] = r
    argmax_path = [True] * len(score)
    for slot in range(1, len(score)):  # a parent's slot comes before its children's
        argmax_path[slot] = argmax_path[parent[slot]] and rank[slot] == 0
    return dict(score=score, parent=parent, depth=depth, rank=rank, argmax_path=argmax_path, children=children,
                path=step["path"])


def conditional(tree: dict, slot: int) -> float:
    return tree["score"][slot] / tree["score"][tree["parent"][slot]]


def key(tree: dict, slot: int, ranks: int = 2) -> tuple:
    return tree["depth"][slot], min(tree["rank"][slot], ranks - 1), tree["argmax_path"][tree["parent"][slot]]


def observed_vs_predicted(trees: list, ranks: int) -> dict:
    """{(depth, rank, parent on the argmax path): [nodes whose parent was accepted, accepted, summed predicted]}"""
    table = defaultdict(lambda: [0, 0, 0.0])
    for tree in trees:
        accepted = set(tree["path"])
        for slot in range(1, len(tree["score"])):
            if tree["parent"][slot] in accepted:
                row = table[key(tree, slot, ranks)]
                row[0] += 1
                row[1] += slot in accepted
                row[2] += conditional(tree, slot)
    return table


def committed(tree: dict, budget: int, factor: dict) -> int:
    """Tokens the step commits with the best-first tree of `budget` nodes under corrected scores."""

    def corrected(slot):
        value = 1.0
        while slot:
            value *= conditional(tree, slot) * factor.get(key(tree, slot), 1.0)
            slot = tree["parent"][slot]
        return value

    chosen = {0}
    heap = [(-corrected(s), s) for s in tree["children"][0]]
    heapq.heapify(heap)
    while heap and len(chosen) <= budget:
        _, slot = heapq.heappop(heap)
        chosen.add(slot)
        for child in tree["children"][slot]:
            heapq.heappush(heap, (-corrected(child), child))
    drafts = 0
    for slot in tree["path"][1:]:
        if slot not in chosen:
            break
        drafts += 1
    return drafts + 1


def main(path: str) -> None:
    for name, steps in json.load(open(path))["sets"].items():
        trees = [annotate(step) for step in steps if step is not None]
        print(f"== {name}: {len(trees)} steps")
        for (depth, rank, on_argmax), (n, hits, predicted) in sorted(observed_vs_predicted(trees, 3).items()):
            if n >= 20:
                print(f"depth {depth} rank {rank}{'+' if rank == 2 else ' '} parent on the argmax path "
                      f"{'yes' if on_argmax else 'no '}: {n:5d} nodes, accepted {hits / n:.3f}, "
                      f"predicted {predicted / n:.3f}")
        fit = observed_vs_predicted(trees, 2)
        factor = {k: (hits + 1) / (predicted + 1) for k, (n, hits, predicted) in fit.items()}  # one pseudo-hit
        for budget in (4, 6, 8, 12, 16):
            own = sum(committed(t, budget, {}) for t in trees) / len(trees)
            corrected = sum(committed(t, budget, factor) for t in trees) / len(trees)
            print(f"{budget:2d} nodes: the drafter's order {own:.3f} tokens a step, corrected {corrected:.3f} "
                  f"({corrected / own - 1:+.1%})")


if __name__ == "__main__":
    main(sys.argv[1])
