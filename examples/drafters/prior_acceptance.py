"""What the bigram prior does to acceptance beyond greedy decoding, and how much a better ranking could still gain.

    python examples/drafters/prior_acceptance.py DRAFTER [PROMPTS_PER_SET] [SEEDS]    # default 6 prompts, 2 seeds

float32 target, one thread, 96 new tokens, the first prompts of GSM8K, HumanEval and MT-Bench (acceptance only:
nothing is timed, so it can run beside other work). Prints JSON lines and a markdown table:
- sampling (temperature 0.7, top_k 0, top_p 1, as `hf-dflash bench --modes sampling`): acceptance length of the chain
  and of 8-node trees, with and without the drafter's prior, pooled over the prompts and SEEDS seeds. A draft is kept
  where it equals the target's sampled token (the loop's exact sampling), so a ranking that puts likelier tokens first
  should help here too.
- "top-8 ranking bound" (greedy, on the steps of the prior's chain): the acceptance a chain would reach if each block
  position's draft were chosen perfectly among the drafter's 8 most likely tokens there (positions taken in order while
  the target's own continuation is among them), against the drafter's argmax. The room any reranking of the drafter's
  candidates (the prior, a learned one) has, with one drafter forward.
"""

import copy
import json
import sys

import torch
from transformers import AutoModel

import hf_dflash  # noqa: F401  (registers the drafter with AutoModel)
from hf_dflash.bench import chat_inputs, load_prompt_set
from hf_dflash.generation import _Decoder
from hf_dflash.packaged import load_packaged

SETS = ("gsm8k", "humaneval", "mtbench")
torch.set_num_threads(1)
folder = sys.argv[1]
per_set = int(sys.argv[2]) if len(sys.argv) > 2 else 6
seeds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
target, tok = load_packaged(dtype=torch.float32)
with_prior = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
assert with_prior.bigram_prior is not None, f"{folder} holds no bigram prior (hf-dflash bigram-prior)"
without = copy.deepcopy(with_prior)
without.set_bigram_prior(None, None)
drafters = {"prior": with_prior, "drafter": without}


def tau(out) -> tuple[int, int]:
    return sum(out.acceptance_lengths[0]), len(out.acceptance_lengths[0])


candidates = []  # each greedy chain step's top-8 drafts [D, 8], recorded by the wrapped drafter_candidates
real_candidates = _Decoder.drafter_candidates


def recording(self, newest, verify_len, k):
    ids, probs = real_candidates(self, newest, verify_len, max(k, 8))
    candidates.append(ids[0, :, :8].tolist())
    return ids[..., :k], probs[..., :k]


rows = []
for name in SETS:
    prompts = load_prompt_set(name, per_set)
    row = {"set": name}
    for kind, drafter in drafters.items():
        for size in (0, 8):
            committed = steps = 0
            for seed in range(seeds):
                for prompt in prompts:
                    torch.manual_seed(seed)
                    out = target.generate(**chat_inputs(tok, prompt.messages), assistant_model=drafter, do_sample=True,
                                          temperature=0.7, top_k=0, top_p=1.0, max_new_tokens=96, draft_tree_size=size,
                                          assistant_confidence_threshold=0.0, return_dict_in_generate=True)
                    c, s = tau(out)
                    committed, steps = committed + c, steps + s
            row[f"sampling {kind} {'chain' if size == 0 else f'tree {size}'}"] = committed / steps
    # greedy, the prior's chain; on each of its steps, the drafter's own argmax against the best of its top 8
    argmax = bound = steps = prior_committed = 0
    _Decoder.drafter_candidates = recording
    try:
        for prompt in prompts:
            inputs = chat_inputs(tok, prompt.messages)
            candidates.clear()
            out = target.generate(**inputs, assistant_model=with_prior, do_sample=False, max_new_tokens=96,
                                  draft_tree_size=0, assistant_confidence_threshold=0.0, return_dict_in_generate=True)
            prior_committed += sum(out.acceptance_lengths[0])
            text = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()  # the target's own greedy continuation
            position = 1  # the first committed token is the prefill's
            for step, lengths in zip(candidates, out.acceptance_lengths[0]):
                truth = text[position : position + len(step)]
                first = next((j for j, t in enumerate(truth) if step[j][0] != t), len(truth))
                best = next((j for j, t in enumerate(truth) if t not in step[j]), len(truth))
                argmax, bound, steps = argmax + first + 1, bound + best + 1, steps + 1
                position += lengths
    finally:
        _Decoder.drafter_candidates = real_candidates
    row["greedy prior chain"] = prior_committed / steps
    row["greedy top-1, same steps"], row["greedy top-8 ranking bound, same steps"] = argmax / steps, bound / steps
    rows.append(row)
    print(json.dumps(row), flush=True)

columns = [k for k in rows[0] if k != "set"]
print("\n| set | " + " | ".join(columns) + " |\n|---|" + "---|" * len(columns))
for row in rows:
    print(f"| {row['set']} | " + " | ".join(f"{row[c]:.2f}" for c in columns) + " |")
