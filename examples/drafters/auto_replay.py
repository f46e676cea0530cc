"""Replay "auto"'s per-step choices against fixed tree sizes, on the same steps (RESULTS.md, "auto" with the loop's
own costs).

Records a run that verifies a big tree every step (`--record-size` nodes), keeping each step's node scores, depths,
parents and accepted path: what the first n nodes would have accepted is then the accepted path's prefix of slots
<= n, for every n, on the same steps. The replay scores each policy (fixed n, "auto" as `choose_tree_size` with a
`NodeCalibration` per prompt) in committed tokens per second under a cost model: t(k) timed after a `--context`-token
cache (`hf_dflash.cost_model.time_forwards`), or given in ms (`--truth-ms`, e.g. medians timed in the loop), plus
`--overhead-ms` a step. "auto" chooses from the curve timed after a 128-token cache, as `generate` did before
`LoopCosts`, and from the truth itself.

    python examples/drafters/auto_replay.py --record /tmp/steps.json --sets gsm8k humaneval   # ~1 min per set
    python examples/drafters/auto_replay.py --replay /tmp/steps.json --context 320
"""

import argparse
import json

import torch
from transformers import AutoModel

from hf_dflash import cost_model, generation
from hf_dflash.bench import chat_inputs, load_prompt_set
from hf_dflash.cost_model import ForwardCosts, NodeCalibration, choose_tree_size, time_forwards
from hf_dflash.packaged import load_packaged
from hf_dflash.tree import DraftTree

DRAFTER = "examples/drafters/smollm2-135m-instruct-dflash"


def record(args, target, tokenizer) -> dict:
    drafter = AutoModel.from_pretrained(DRAFTER, dtype=target.dtype)
    drafter.config.block_size = args.block_size
    steps = []

    def keep(self, tree, path, accepted):  # NodeCalibration.update's arguments: the verified tree and its path
        kept = int(accepted[0])
        steps.append(dict(scores=tree.scores[0].tolist(), depths=tree.depths[0].tolist(),
                          parents=tree.parents[0].tolist(), path=path[0].tolist()[: kept + 1]))

    init = generation._Decoder.__init__

    def calibrated(self, *a, **k):  # a fixed tree keeps no calibration: give it one, to see its updates
        init(self, *a, **k)
        self.calibration = NodeCalibration(self.block_size - 1)

    generation._Decoder.__init__ = calibrated
    cost_model.NodeCalibration.update = keep
    out = {}
    for name in args.sets:
        steps = []
        for prompt in load_prompt_set(name, args.num_prompts):
            target.generate(**chat_inputs(tokenizer, prompt.messages), assistant_model=drafter, do_sample=False,
                            max_new_tokens=args.max_new_tokens, draft_tree_size=args.record_size,
                            assistant_confidence_threshold=0)
            steps.append(None)  # a prompt ends: "auto"'s calibration starts afresh, as per `generate` call
        out[name] = steps
        print(name, len(steps) - args.num_prompts, "steps", flush=True)
    return {"block_size": args.block_size, "sets": out}


def accepted(step: dict, n: int) -> int:
    """Drafts the first n nodes would have accepted: the accepted path's slots up to the first one beyond n."""
    count = 0
    for slot in step["path"][1:]:
        if slot > n:
            break
        count += 1
    return count


def replay(steps: list, policy, truth, overhead: float, max_depth: int) -> float:
    """Committed tokens per second of `policy(tree, calibration) -> n` over the recorded steps."""
    tokens = seconds = 0.0
    calibration = None
    for step in steps:
        if step is None:
            calibration = None
            continue
        calibration = calibration or NodeCalibration(max_depth)
        size = len(step["scores"])
        tree = DraftTree(torch.zeros(1, size + 1, dtype=torch.long), torch.tensor([step["parents"]]),
                         torch.tensor([step["depths"]]), torch.tensor([step["scores"]], dtype=torch.float64))
        n = min(policy(tree, calibration), size)
        kept = accepted(step, n)
        tokens += kept + 1
        seconds += truth(n + 1) + overhead
        if n:
            path = torch.tensor([[slot if i <= kept else 0 for i, slot in enumerate(step["path"])]])
            calibration.update(tree.first(n), path, torch.tensor([kept]))
    return tokens / seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", help="run the target and write the steps here")
    parser.add_argument("--replay", help="replay the steps written by --record")
    parser.add_argument("--sets", nargs="+", default=["gsm8k", "mbpp", "alpaca", "humaneval", "mtbench"])
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--record-size", type=int, default=24)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--context", type=int, default=320, help="the truth: t(k) timed after this many tokens")
    parser.add_argument("--truth-ms", help="the truth instead: t(1), t(2), ... in ms, comma-separated")
    parser.add_argument("--overhead-ms", type=float, default=5.0, help="the rest of a step")
    args = parser.parse_args()
    torch.set_num_threads(1)
    target, tokenizer = load_packaged(dtype=getattr(torch, args.dtype))
    if args.record:
        with open(args.record, "w") as f:
            json.dump(record(args, target, tokenizer), f)
        return
    data = json.load(open(args.replay))
    sizes = (1, 2, 4, 8, 16, 32)
    curve = time_forwards(target, sizes, 128, tree=True)
    believed = ForwardCosts(sizes, tuple(curve[k] for k in sizes))
    if args.truth_ms:
        ms = [float(x) / 1000 for x in args.truth_ms.split(",")]
        truth = ForwardCosts(tuple(range(1, len(ms) + 1)), tuple(ms))
    else:
        timed = time_forwards(target, range(1, args.record_size + 2), args.context, tree=True)
        truth = ForwardCosts(tuple(timed), tuple(timed.values()))
    overhead = args.overhead_ms / 1000
    depth = data["block_size"] - 1
    for name, steps in data["sets"].items():
        fixed = {n: replay(steps, lambda tree, c, n=n: n, truth, overhead, depth) for n in (2, 3, 4, 5, 6, 8, 10, 12, 16)}
        best = max(fixed.values())
        old = replay(steps, lambda tree, c: choose_tree_size(c(tree), believed, overhead), truth, overhead, depth)
        knowing = replay(steps, lambda tree, c: choose_tree_size(c(tree), truth, overhead), truth, overhead, depth)
        print(f"{name}: fixed / best " + " ".join(f"{n}:{r / best:.3f}" for n, r in fixed.items())
              + f" | auto (128-token curve) {old / best:.3f} | auto (knowing the truth) {knowing / best:.3f}")


if __name__ == "__main__":
    main()
