"""Acceptance of the chain and of draft trees with and without the drafter's bigram prior, on the same steps.

The prior (`hf_dflash.bigram`) reweights each draft candidate by how much its parent token made it likelier in the
drafter's training responses, so a chain's drafts fit together and a runner-up's children are ranked for it. Here it
is scored without timing: recording runs a float32 target (its greedy text is plain `generate`'s, so each step's
truth is the final text) and keeps every step's top-K candidates per position; the replay builds, from the same
candidates, the chain and best-first trees of several sizes as `generate` does, with the drafter's own probabilities
and with its prior, and counts what the truth walks through (acceptance length = accepted drafts + 1).

    python examples/drafters/bigram_tree_replay.py --record /tmp/steps.pt --sets gsm8k humaneval mtbench
    hf-dflash bigram-prior examples/drafters/smollm2-135m-instruct-dflash --data DATA --output /tmp/with-prior
    python examples/drafters/bigram_tree_replay.py --replay /tmp/steps.pt --drafter /tmp/with-prior
"""

import argparse
from collections import Counter

import torch
from transformers import AutoModel
from tqdm import tqdm

from hf_dflash import generation
from hf_dflash.bigram import conditional_chain, conditional_probs
from hf_dflash.bench import chat_inputs, load_prompt_set
from hf_dflash.packaged import load_packaged
from hf_dflash.tree import DraftTree, build_tree

DRAFTER = "examples/drafters/smollm2-135m-instruct-dflash"


def record(args) -> None:
    target, tok = load_packaged(dtype=torch.float32)
    drafter = AutoModel.from_pretrained(DRAFTER, dtype=torch.bfloat16).eval()
    candidates, init = generation._Decoder.drafter_candidates, generation._Decoder.__init__
    steps = []

    def wide(self, *a, **k):  # verify an 8-node tree (cheap in float32), but keep the top-K of every position
        init(self, *a, **k)
        self.top_k = args.top_k

    def keep(self, newest, verify_len, k):
        ids, probs = candidates(self, newest, verify_len, k)
        steps[-1]["steps"].append((int(self.lengths[self.rows][0]), ids[0].clone(), probs[0].float().clone()))
        return ids, probs

    generation._Decoder.drafter_candidates, generation._Decoder.__init__ = keep, wide
    out = {}
    for name in args.sets:
        out[name] = steps = []
        for prompt in tqdm(load_prompt_set(name, args.num_prompts), desc=name):
            inputs = chat_inputs(tok, prompt.messages)
            steps.append({"steps": []})
            sequence = target.generate(**inputs, assistant_model=drafter, do_sample=False, draft_tree_size=8,
                                       max_new_tokens=args.max_new_tokens, assistant_confidence_threshold=0)
            steps[-1]["sequence"] = sequence[0].clone()
    torch.save(out, args.record)


def accepted(tree: DraftTree, truth: list) -> int:
    """Drafts of `tree` (one row) that the target's own continuation `truth` walks through."""
    parents, tokens = tree.parents[0].tolist(), tree.tokens[0].tolist()
    node, count = 0, 0
    for token in truth:
        child = next((s for s in range(1, len(tokens)) if parents[s] == node and tokens[s] == token), None)
        if child is None:
            break
        node, count = child, count + 1
    return count


def replay(args) -> None:
    """Accepted drafts per step (+1: the acceptance length) of the chain and of trees, the drafter's own against
    its bigram prior's, as `generate` builds them (`hf_dflash.bigram`, `hf_dflash.tree.build_tree`)."""
    drafter = AutoModel.from_pretrained(args.drafter)
    if drafter.bigram_prior is None:
        raise SystemExit(f"{args.drafter} holds no bigram prior: run hf-dflash bigram-prior on it first.")
    prior = drafter.bigram_prior
    recorded = torch.load(args.replay)
    table = {}
    for name, prompts in recorded.items():
        totals, n_steps = Counter(), 0
        for prompt in prompts:
            sequence = prompt["sequence"].tolist()
            for length, ids, probs in prompt["steps"]:
                ids, probs = ids[None], probs[None]  # [1, D, K]
                truth, root = sequence[length : length + ids.shape[1]], torch.tensor([sequence[length - 1]])
                n_steps += 1
                totals["chain", "drafter"] += accepted(DraftTree.chain(torch.cat([root, ids[0, :, 0]])[None]), truth)
                k = min(8, ids.shape[-1])  # as `_Decoder.prior_chain`
                i, p = ids[..., :k], probs[..., :k]
                drafts, _ = conditional_chain(i, conditional_probs(i, p, prior))
                totals["chain", "prior"] += accepted(DraftTree.chain(torch.cat([root, drafts[0]])[None]), truth)
                for size in args.sizes:
                    k = min(size, ids.shape[-1])  # as `generate`: k candidates per position for k nodes
                    i, p = ids[..., :k], probs[..., :k]
                    totals[size, "drafter"] += accepted(build_tree(root, i, p, size), truth)
                    conditional = conditional_probs(i, p, prior)
                    totals[size, "prior"] += accepted(build_tree(root, i, conditional, size), truth)
        table[name] = {key: 1 + value / n_steps for key, value in totals.items()}
    keys = list(next(iter(table.values())))
    print("| set | " + " | ".join(f"{'chain' if n == 'chain' else f'tree {n}'}: {kind}" for n, kind in keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for name, row in table.items():
        print(f"| {name} | " + " | ".join(f"{row[key]:.3f}" for key in keys) + " |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record")
    parser.add_argument("--replay")
    parser.add_argument("--drafter", default=DRAFTER, help="for --replay: a drafter with a bigram prior")
    parser.add_argument("--sets", nargs="+", default=["gsm8k", "humaneval", "mtbench"])
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--top-k", type=int, default=32)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 12, 16])
    args = parser.parse_args()
    torch.set_num_threads(1)
    record(args) if args.record else replay(args)
