"""The `hf_dflash.cpu_ops` A/B runs of RESULTS.md, interleaved per prompt, one thread, the shipped drafter in
bfloat16, plain `generate` timed alongside. Variants: A = torch's `max` for the verification's argmax and plain
`F.linear` drafter layers; B = the chunked argmax and prepacked drafter layers; C = B with the draft head prepacked
too (the package as it is). A and B score the draft head as `W @ h^T`, as the package did until 2026-12-04's
evening. The two variants named are compared (default: A B).

    # DTYPE PROMPTS_PER_SET NEW_TOKENS TREE [VARIANT VARIANT]
    OMP_NUM_THREADS=1 python examples/drafters/cpu_ops_ab.py bfloat16 4 128 auto B C
"""
import sys, time, torch
from torch import nn
import hf_dflash, hf_dflash.generation as gen, hf_dflash.tree as tree
from hf_dflash.bench import load_prompt_set, chat_inputs
from hf_dflash.cpu_ops import PackedLinear, argmax, pack_linears
from hf_dflash.packaged import load_packaged
from transformers import AutoModel
torch.set_num_threads(1)
dtype = getattr(torch, sys.argv[1]); n = int(sys.argv[2]); new = int(sys.argv[3])
tree_size = sys.argv[4] if sys.argv[4] == "auto" else int(sys.argv[4])
first, second = sys.argv[5:7] if len(sys.argv) > 6 else ("A", "B")
target, tok = load_packaged(dtype=dtype)
drafter = AutoModel.from_pretrained("examples/drafters/smollm2-135m-instruct-dflash", dtype=torch.bfloat16).eval()
linears = [m for m in drafter.modules() if isinstance(m, nn.Linear)]


class TransposedHead(nn.Linear):
    def forward(self, x):  # the draft head before it was packed: `W @ h^T`, for a few rows faster than `h @ W^T`
        flat = x.reshape(-1, x.shape[-1])
        return (self.weight @ flat.T).T.reshape(*x.shape[:-1], self.weight.shape[0])


def pack_all_but_the_head(module):
    return module if type(module) is TransposedHead else pack_linears(module)


def variant(name):
    packed = name != "A"
    for m in linears:  # A: plain nn.Linear; the loop's own pack_linears call is switched off below
        m.__class__ = PackedLinear if packed else nn.Linear
    head = drafter.draft_head(target.get_output_embeddings())[0]  # the drafter's kept copy
    head.__class__ = PackedLinear if name == "C" else TransposedHead
    gen.pack_linears = {"A": lambda module: module, "B": pack_all_but_the_head, "C": pack_linears}[name]
    gen.argmax = tree.argmax = argmax if packed else (lambda scores: scores.max(-1).indices)


def summary(label, st):
    return "%s plain %.1fs %s %.1fs %s %.1fs | speedup over plain %s %.3f %s %.3f | %s over %s %.3f" % (
        label, st["plain"], first, st[first], second, st[second], first, st["plain"] / st[first], second,
        st["plain"] / st[second], second, first, st[first] / st[second])


totals = {first: 0.0, second: 0.0, "plain": 0.0}; same = 0; count = 0
target.generate(**chat_inputs(tok, [{"role": "user", "content": "Hi"}]), assistant_model=drafter, max_new_tokens=8)
for s in ["gsm8k", "mbpp", "alpaca", "humaneval", "mtbench"]:
    st = {first: 0.0, second: 0.0, "plain": 0.0}
    for i, p in enumerate(load_prompt_set(s, n)):
        inputs = chat_inputs(tok, p.messages)
        outs = {}
        for name in ((first, second, "plain") if i % 2 == 0 else (second, first, "plain")):
            t0 = time.perf_counter()
            if name == "plain":
                out = target.generate(**inputs, max_new_tokens=new, do_sample=False)
            else:
                variant(name)
                out = target.generate(**inputs, assistant_model=drafter, max_new_tokens=new, do_sample=False,
                                      draft_tree_size=tree_size)
            st[name] += time.perf_counter() - t0; outs[name] = out
        same += torch.equal(outs[first], outs[second]); count += 1
    print(summary(s, st), flush=True)
    for k in st: totals[k] += st[k]
print(summary("total", totals) + "; identical outputs %d/%d" % (same, count))
