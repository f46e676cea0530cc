"""Path-conditioned drafting, scored without timing: does a second drafter pass that is given the start of a path
draft a runner-up's continuation better than the first pass's guesses? Session 23's experiment: tried, not kept
(RESULTS.md, "Path-conditioned second pass").

A DFlash drafter's distribution at a block position does not depend on what is drafted before it, so in a tree the
children of a runner-up are the guesses made for the argmax. A drafter trained with revealed prefixes (a share of
training blocks whose first 1..B-2 drafted slots hold the real tokens: `reveal_prob.patch` here, applied with `git
apply`, adds `hf-dflash train --reveal-prob`) can be asked again with a path filled in. Two ways are scored:

- two-pass tree (default): pass 2 gives each of R candidates at the chain's likeliest first failure m the block with
  the chain's drafts before m and the candidate at m filled in; the tree is the chain up to m - 1 and R conditioned
  chains below it, against the first pass's best-first tree of as many nodes. The "tail" columns: where the truth
  reached m through candidate r, the drafts accepted after m by the first pass's chain / by pass 2.
- `--hybrid`: the first pass's best-first tree of each budget as `generate` builds it, against the same tree whose
  R best runner-up nodes (not the first child of their parent) have their subtrees drafted by pass 2.

Scored on every position of the target's own greedy answers (float32, teacher-forced: the block anchored at each
answer token, its truth the answer's next tokens; more steps than the loop visits, so values run higher than
`generate`'s acceptance):

    git apply examples/drafters/reveal/reveal_prob.patch     # then train as continue_h.sh does, with --reveal-prob 0.5
    python examples/drafters/reveal/reveal_replay.py DRAFTER [DRAFTER ...] --sets gsm8k humaneval mtbench \
        --num-prompts 8 [--branches 4 --hybrid --budgets 8 16 32]
"""

import argparse
import heapq

import torch
from tqdm import tqdm
from transformers import AutoModel

import hf_dflash  # noqa: F401  (registers the drafter with AutoModel)
from hf_dflash.bench import chat_inputs, load_prompt_set
from hf_dflash.packaged import load_packaged
from hf_dflash.training import training_mask
from hf_dflash.tree import build_tree


@torch.no_grad()
def topk(drafter, target, features, anchors, blocks, k):
    """The drafter's k best tokens and probabilities [N, B - 1, k] for blocks [N, B] anchored at `anchors` [N]."""
    (n, B), T = blocks.shape, features.shape[1]
    positions = torch.cat([torch.arange(T), (anchors[:, None] + torch.arange(B)).view(-1)])[None]
    mask = training_mask(anchors[None], torch.ones(1, n, dtype=torch.bool), torch.ones(1, T, dtype=torch.bool), B)
    hidden = drafter(noise_embeds=drafter.embed(target, blocks.view(1, -1)), context_hidden_states=features,
                     position_ids=positions, attention_mask={"full_attention": mask}).last_hidden_state
    head = target.get_output_embeddings()
    ids, probs = drafter.draft_tokens(hidden.view(n, B, -1)[:, 1:], head, drafter.draft_head(head),
                                      return_confidence=True, top_k=k)
    return ids, probs.float()


def walk(children, truth) -> int:
    """Drafts a tree {node: {token: child}} (root 0) holds along `truth`."""
    node, count = 0, 0
    for token in truth:
        if token not in children.get(node, {}):
            break
        node, count = children[node][token], count + 1
    return count


def tree_dict(tree) -> dict:
    children = {}
    for slot, (parent, token) in enumerate(zip(tree.parents[0].tolist(), tree.tokens[0].tolist())):
        if slot:
            children.setdefault(parent, {})[token] = slot
    return children


def conditioned_tree(sources, branches, budget) -> dict:
    """Best-first tree {node: {token: child}} of `budget` nodes: the children of a node at depth d are the top-k of
    position d + 1 of its source (pass 1, `sources[0]`, unless an ancestor's path is in `branches`, {path: source}:
    the second pass given that path). sources[s] = (ids [D, k], probs [D, k]) as lists."""
    depth_max, k = len(sources[0][0]), len(sources[0][0][0])
    children, count = {}, 0
    heap = [(-sources[0][1][0][0], 0, 0, 0, 0, 1.0, (), 0)]  # (-score, tie, d, rank, parent, parent score, path, src)
    while heap and count < budget:
        negative, _, d, rank, parent, parent_score, path, src = heapq.heappop(heap)
        ids, probs = sources[src]
        token = ids[d][rank]
        count += 1
        children.setdefault(parent, {})[token] = count
        if rank + 1 < k:
            heapq.heappush(heap, (-parent_score * probs[d][rank + 1], count, d, rank + 1, parent, parent_score, path, src))
        node_path = path + (token,)
        child_src = branches.get(node_path, src)
        if d + 1 < depth_max:
            p = sources[child_src][1][d + 1][0]
            heapq.heappush(heap, (negative * p, count, d + 1, 0, count, -negative, node_path, child_src))
    return children


def score_hybrid(drafter, target, sequence, start, features, B, R, k, budgets):
    """Per anchor and budget: accepted drafts of the best-first tree of pass 1 and of the same tree with the
    subtrees of its R best runner-up nodes (not the first candidate under their parent) drafted by pass 2."""
    anchors = torch.arange(start - 1, len(sequence) - B)
    n = len(anchors)
    blocks = torch.full((n, B), drafter.mask_token_id)
    blocks[:, 0] = sequence[anchors]
    ids, probs = topk(drafter, target, features, anchors, blocks, k)
    root = sequence[anchors]
    rows, row_anchor, chosen = [], [], []
    for i in range(n):
        tree = build_tree(root[i][None], ids[i : i + 1], probs[i : i + 1], max(budgets))
        tokens, parents, depths = (t[0].tolist() for t in (tree.tokens, tree.parents, tree.depths))
        first_child = {}
        for slot in range(1, len(tokens)):
            first_child.setdefault(parents[slot], slot)
        picked = [s for s in range(1, len(tokens)) if first_child[parents[s]] != s and depths[s] < B - 1][:R]
        paths = []
        for s in picked:
            path, node = [], s
            while node > 0:
                path.append(tokens[node])
                node = parents[node]
            paths.append(tuple(reversed(path)))
            row = blocks[i].clone()
            row[1 : len(path) + 1] = torch.tensor(paths[-1])
            rows.append(row)
            row_anchor.append(int(anchors[i]))
        chosen.append(paths)
    ids2, probs2 = topk(drafter, target, features, torch.tensor(row_anchor), torch.stack(rows), k) if rows else (None, None)
    out, row = [], 0
    for i in range(n):
        truth = sequence[anchors[i] + 1 : anchors[i] + B].tolist()
        sources = [(ids[i].tolist(), probs[i].tolist())]
        branches = {}
        for path in chosen[i]:
            sources.append((ids2[row].tolist(), probs2[row].tolist()))
            branches[path] = len(sources) - 1
            row += 1
        out.append([(walk(conditioned_tree(sources[:1], {}, b), truth), walk(conditioned_tree(sources, branches, b),
                                                                              truth)) for b in budgets])
    return out


def score(drafter, target, sequence, start, features, B, R, k):
    """Per anchor: (chain, two-pass tree, its nodes, best-first tree of as many nodes) accepted drafts."""
    anchors = torch.arange(start - 1, len(sequence) - B)  # every answer token with B - 1 tokens of truth after it
    n = len(anchors)
    blocks = torch.full((n, B), drafter.mask_token_id)
    blocks[:, 0] = sequence[anchors]
    ids, probs = topk(drafter, target, features, anchors, blocks, k)  # [n, B-1, k]
    top = probs[:, :, 0]
    reach = torch.cat([torch.ones(n, 1), top.cumprod(-1)[:, :-1]], 1)  # P(slots before m all right)
    m = (reach * (1 - top))[:, :-1].argmax(-1)  # the likeliest first failure (slot index, 0-based), not the last
    # pass 2: R rows per anchor, the chain's drafts before m, candidate r at m, the rest masked
    rows = blocks.repeat_interleave(R, 0)
    chain = ids[:, :, 0]
    for i in range(n):
        mi = int(m[i])
        rows[i * R : (i + 1) * R, 1 : mi + 1] = chain[i, :mi]
        rows[i * R : (i + 1) * R, mi + 1] = ids[i, mi, :R]
    ids2, _ = topk(drafter, target, features, anchors.repeat_interleave(R), rows, 1)
    out = []
    for i in range(n):
        truth, mi = sequence[anchors[i] + 1 : anchors[i] + B].tolist(), int(m[i])
        chain_count = walk({d: {int(chain[i, d]): d + 1} for d in range(B - 1)}, truth)
        children, node = {}, 0
        for d in range(mi):  # the shared chain
            children[node] = {int(chain[i, d]): node + 1}
            node += 1
        branch_root, next_slot = node, node + 1
        for r in range(R):
            path = [int(ids[i, mi, r])] + ids2[i * R + r, mi + 1 :, 0].tolist()
            parent = branch_root
            for token in path:
                child = children.setdefault(parent, {}).get(token)
                if child is None:
                    child = children[parent][token] = next_slot
                    next_slot += 1
                parent = child
        nodes = next_slot - 1
        best_first = build_tree(sequence[anchors[i]][None], ids[i : i + 1], probs[i : i + 1], nodes)
        # where the path reached m and the truth at m is candidate r: the first pass's tail against the second's
        tails = [None] * R
        if truth[:mi] == chain[i, :mi].tolist() and truth[mi] in ids[i, mi, :R].tolist():
            r = ids[i, mi, :R].tolist().index(truth[mi])
            first = walk({d: {t: d + 1} for d, t in enumerate(chain[i, mi + 1 :].tolist())}, truth[mi + 1 :])
            second = walk({d: {t: d + 1} for d, t in enumerate(ids2[i * R + r, mi + 1 :, 0].tolist())}, truth[mi + 1 :])
            tails[r] = (first, second)
        out.append((chain_count, walk(children, truth), nodes, walk(tree_dict(best_first), truth), tails))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("drafters", nargs="+")
    parser.add_argument("--sets", nargs="+", default=["gsm8k", "humaneval", "mtbench"])
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--branches", type=int, default=2, help="R: candidates at the branch position")
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--hybrid", action="store_true", help="best-first trees, runner-ups' subtrees from pass 2")
    parser.add_argument("--budgets", type=int, nargs="+", default=[8, 16])
    args = parser.parse_args()
    torch.set_num_threads(1)
    target, tok = load_packaged(dtype=torch.float32)
    drafters = {path: AutoModel.from_pretrained(path, dtype=torch.float32).eval() for path in args.drafters}
    layer_ids = next(iter(drafters.values())).config.target_layer_ids
    if args.hybrid:
        print("| drafter | set | anchors | " + " | ".join(f"tree {b}: pass 1 / with pass 2" for b in args.budgets) + " |")
        print("|---" * (3 + len(args.budgets)) + "|")
    else:
        tails = [f"tail after candidate {r + 1}: pass 1 / pass 2 (anchors)" for r in range(args.branches)]
        print("| drafter | set | anchors | chain | two-pass tree | its nodes | best-first tree, same nodes | "
              + " | ".join(tails) + " |")
        print("|---" * (7 + args.branches) + "|")
    for name in args.sets:
        answers = []
        for prompt in tqdm(load_prompt_set(name, args.num_prompts), desc=f"{name}: target answers"):
            inputs = chat_inputs(tok, prompt.messages)
            sequence = target.generate(**inputs, do_sample=False, max_new_tokens=args.max_new_tokens)[0]
            hidden = target(sequence[None], output_hidden_states=True).hidden_states
            features = torch.cat([hidden[i + 1] for i in layer_ids], -1)
            answers.append((sequence, inputs["input_ids"].shape[1], features))
        for path, drafter in drafters.items():
            B = drafter.block_size
            if args.hybrid:
                rows = [r for seq, start, feats in answers for r in score_hybrid(
                    drafter, target, seq, start, feats, B, args.branches, args.top_k, args.budgets)]
                cells = [f"{1 + sum(r[j][0] for r in rows) / len(rows):.3f} / {1 + sum(r[j][1] for r in rows) / len(rows):.3f}"
                         for j in range(len(args.budgets))]
                print(f"| {path} | {name} | {len(rows)} | " + " | ".join(cells) + " |", flush=True)
                continue
            rows = [r for seq, start, feats in answers for r in score(drafter, target, seq, start, feats, B,
                                                                       args.branches, args.top_k)]
            mean = [sum(r[j] for r in rows) / len(rows) for j in range(4)]
            tails = []
            for r in range(args.branches):  # tail accepted after candidate r at m: first pass / second pass (count)
                hits = [row[4][r] for row in rows if row[4][r] is not None]
                tails.append(f"{sum(h[0] for h in hits) / max(len(hits), 1):.2f} / "
                             f"{sum(h[1] for h in hits) / max(len(hits), 1):.2f} ({len(hits)})")
            print(f"| {path} | {name} | {len(rows)} | {1 + mean[0]:.3f} | {1 + mean[1]:.3f} | {mean[2]:.1f} | "
                  f"{1 + mean[3]:.3f} | " + " | ".join(tails) + " |", flush=True)


if __name__ == "__main__":
    main()
