"""The cost-curve A/B of RESULTS.md: draft_tree_size="auto" priced with the powers-of-two curve (A) against the
curve with the significant sizes up to 16 (B), interleaved per prompt, one thread, the shipped drafter.

    OMP_NUM_THREADS=1 python examples/drafters/cost_curve_ab.py float32 6 128   # DTYPE PROMPTS_PER_SET NEW_TOKENS
"""
import sys, time, torch
import hf_dflash, hf_dflash.generation as gen
from hf_dflash.cost_model import measure_forward_costs
from hf_dflash.bench import load_prompt_set, chat_inputs
from hf_dflash.packaged import load_packaged
from transformers import AutoModel
torch.set_num_threads(1)
dtype = getattr(torch, sys.argv[1]); n = int(sys.argv[2]); new = int(sys.argv[3])
target, tok = load_packaged(dtype=dtype)
drafter = AutoModel.from_pretrained("examples/drafters/smollm2-135m-instruct-dflash", dtype=torch.bfloat16)
A = measure_forward_costs(target, sizes=(1, 2, 4, 8, 16, 32))
B = measure_forward_costs(target)
print("A", [(k, round(t * 1e3, 1)) for k, t in zip(A.tokens, A.seconds)])
print("B", [(k, round(t * 1e3, 1)) for k, t in zip(B.tokens, B.seconds)], flush=True)
totals = {"A": 0.0, "B": 0.0}; same = 0; count = 0
for s in ["gsm8k", "mbpp", "alpaca", "humaneval", "mtbench"]:
    st = {"A": 0.0, "B": 0.0}
    for i, p in enumerate(load_prompt_set(s, n)):
        inputs = chat_inputs(tok, p.messages)
        outs = {}
        for name in (("A", "B") if i % 2 == 0 else ("B", "A")):
            costs = A if name == "A" else B
            gen.load_forward_costs = lambda target, batch_size=1, costs=costs: costs
            t0 = time.perf_counter()
            out = target.generate(**inputs, assistant_model=drafter, max_new_tokens=new, do_sample=False, draft_tree_size="auto")
            dt = time.perf_counter() - t0
            st[name] += dt; outs[name] = out
        same += torch.equal(outs["A"], outs["B"]); count += 1
    print(s, "A %.2fs B %.2fs  A/B time ratio (B speedup) %.3f" % (st["A"], st["B"], st["A"] / st["B"]), flush=True)
    for k in st: totals[k] += st[k]
print("total A %.1fs B %.1fs B speedup %.3f; identical outputs %d/%d" % (totals["A"], totals["B"], totals["A"] / totals["B"], same, count))
