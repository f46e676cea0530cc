"""The `hf_dflash.cpu_ops` A/B of RESULTS.md: the loop with torch's `max` for the verification's argmax and plain
`F.linear` drafter layers (A) against the chunked argmax and prepacked drafter linears (B), interleaved per prompt,
one thread, the shipped drafter in bfloat16, plain `generate` timed alongside.

    OMP_NUM_THREADS=1 python examples/drafters/cpu_ops_ab.py bfloat16 4 128 auto   # DTYPE PROMPTS_PER_SET NEW_TOKENS TREE
"""
import sys, time, torch
from torch import nn
import hf_dflash, hf_dflash.generation as gen, hf_dflash.tree as tree
from hf_dflash.bench import load_prompt_set, chat_inputs
from hf_dflash.cpu_ops import argmax, pack_linears
from hf_dflash.packaged import load_packaged
from transformers import AutoModel
torch.set_num_threads(1)
dtype = getattr(torch, sys.argv[1]); n = int(sys.argv[2]); new = int(sys.argv[3])
tree_size = sys.argv[4] if sys.argv[4] == "auto" else int(sys.argv[4])
target, tok = load_packaged(dtype=dtype)
drafter = AutoModel.from_pretrained("examples/drafters/smollm2-135m-instruct-dflash", dtype=torch.bfloat16).eval()
linears = [m for m in drafter.modules() if isinstance(m, nn.Linear)]


def variant(name):
    packed = name == "B"
    for m in linears:  # A: plain nn.Linear; the loop's own pack_linears call is switched off below
        m.__class__ = hf_dflash.cpu_ops.PackedLinear if packed else nn.Linear
    gen.pack_linears = pack_linears if packed else (lambda module: module)
    gen.argmax = tree.argmax = argmax if packed else (lambda scores: scores.max(-1).indices)


totals = {"A": 0.0, "B": 0.0, "plain": 0.0}; same = 0; count = 0
target.generate(**chat_inputs(tok, [{"role": "user", "content": "Hi"}]), assistant_model=drafter, max_new_tokens=8)
for s in ["gsm8k", "mbpp", "alpaca", "humaneval", "mtbench"]:
    st = {"A": 0.0, "B": 0.0, "plain": 0.0}
    for i, p in enumerate(load_prompt_set(s, n)):
        inputs = chat_inputs(tok, p.messages)
        outs = {}
        for name in (("A", "B", "plain") if i % 2 == 0 else ("B", "A", "plain")):
            t0 = time.perf_counter()
            if name == "plain":
                out = target.generate(**inputs, max_new_tokens=new, do_sample=False)
            else:
                variant(name)
                out = target.generate(**inputs, assistant_model=drafter, max_new_tokens=new, do_sample=False,
                                      draft_tree_size=tree_size)
            st[name] += time.perf_counter() - t0; outs[name] = out
        same += torch.equal(outs["A"], outs["B"]); count += 1
    print(s, "plain %.2fs A %.2fs B %.2fs | speedup over plain A %.3f B %.3f | B over A %.3f" % (
        st["plain"], st["A"], st["B"], st["plain"] / st["A"], st["plain"] / st["B"], st["A"] / st["B"]), flush=True)
    for k in st: totals[k] += st[k]
print("total plain %.1fs A %.1fs B %.1fs | speedup over plain A %.3f B %.3f | B over A %.3f; identical A/B outputs %d/%d" % (
    totals["plain"], totals["A"], totals["B"], totals["plain"] / totals["A"], totals["plain"] / totals["B"],
    totals["A"] / totals["B"], same, count))
