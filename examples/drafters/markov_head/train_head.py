"""A Markov head on top of the frozen shipped drafter I: the one-off prototype of session 22 (RESULTS.md, "A learned
Markov head: tried, not kept"). hidden + W_o gelu(W_h hidden + W_e embed(previous token)), trained teacher-forced on
the drafter's block positions from J's feature store (the samples it held: data_stored.jsonl, the lines of
data_all.jsonl whose ids are in the store's index.jsonl); reports held-out (300 samples) teacher-forced chain
acceptance every 1,000 steps. Paths are this machine's.

    python examples/drafters/markov_head/train_head.py STEPS RANK OUT.pt [THREADS] [EVAL_SAMPLES]
    python examples/drafters/markov_head/train_head.py 4000 256 /work/runs/markov/head_r256.pt 1 200   # the run
"""
import json, sys, time, math, random
import torch, torch.nn as nn, torch.nn.functional as F
from transformers import AutoModel
import hf_dflash  # noqa
from hf_dflash.data import load_samples
from hf_dflash.packaged import load_packaged
from hf_dflash.training.batches import build_batch, sample_anchors
from hf_dflash.training.features import StoreFeatures
from hf_dflash.training.losses import training_mask

torch.set_num_threads(int(sys.argv[4]) if len(sys.argv) > 4 else 1)
STORE, DATA = "/work/runs/smollm2/store", "/work/runs/markov/data_stored.jsonl"
steps, rank = int(sys.argv[1]), int(sys.argv[2])
out = sys.argv[3]
B, NA, BS = 8, 32, 4
target, tok = load_packaged(dtype=torch.float32)
drafter = AutoModel.from_pretrained("/work/main/examples/drafters/smollm2-135m-instruct-dflash", dtype=torch.float32).eval()
ids_checks = []
samples, _ = load_samples(DATA, min_supervised_tokens=2 * B, max_length=512, checks=ids_checks)
feats = StoreFeatures(STORE, ids_checks, drafter.config.target_layer_ids, drafter.config.hidden_size)
n_eval = int(sys.argv[5]) if len(sys.argv) > 5 else 300
order = list(range(len(samples))); random.Random(0).shuffle(order)
eval_idx, train_idx = order[:n_eval], order[n_eval:]
print("samples", len(samples), flush=True)
emb = target.get_input_embeddings().weight.detach()
vocab_ids = drafter.draft_vocab
W = target.get_output_embeddings().weight.detach()[vocab_ids]  # [Dv, H]
index = torch.full((W.shape[0] * 0 + emb.shape[0],), -1, dtype=torch.long); index[vocab_ids] = torch.arange(len(vocab_ids))
H = drafter.config.hidden_size

class Markov(nn.Module):
    def __init__(self, H, r):
        super().__init__()
        self.h, self.e, self.o = nn.Linear(H, r), nn.Linear(H, r, bias=False), nn.Linear(r, H, bias=False)
        nn.init.zeros_(self.o.weight)
    def forward(self, h, prev_emb):
        return h + self.o(F.gelu(self.h(h) + self.e(prev_emb)))

head = Markov(H, rank)
opt = torch.optim.AdamW(head.parameters(), lr=1e-3, weight_decay=0.0)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1, (s + 1) / 100) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))

@torch.no_grad()
def hidden_of(idx, gen):
    anchors = [sample_anchors(torch.tensor(samples[i][1]), NA, gen) for i in idx]
    batch = build_batch([samples[i] for i in idx], anchors, B, drafter.config.mask_token_id)
    features, _ = feats(idx, batch)
    b, NB = batch["block_ids"].shape; T = batch["input_ids"].shape[1]
    noise = drafter.embed(target, batch["block_ids"])
    positions = torch.cat([torch.arange(T).expand(b, -1), batch["block_pos"]], 1)
    masks = {"full_attention": training_mask(batch["anchors"], batch["anchor_valid"], batch["valid"], B, None)}
    hidden = drafter(noise_embeds=noise, context_hidden_states=features.float(), position_ids=positions, attention_mask=masks).last_hidden_state
    hidden = hidden.view(b, -1, B, H)
    labels, lmask = batch["labels"], batch["label_mask"].bool()
    sel = lmask[:, :, 1:] & batch["anchor_valid"][:, :, None]
    h = hidden[:, :, 1:][sel]                     # [R, H]
    prev = labels[:, :, :-1][sel]                 # the true token before each slot (slot 1: the anchor)
    y = index[labels[:, :, 1:][sel]]              # draft-vocab row, -1 outside
    slot = torch.arange(1, B).expand_as(sel)[sel]
    blocks = sel.nonzero()[:, :2]
    return h, prev, y, slot, sel

def correct_matrix(logits_fn, h, prev, y, sel):
    pred = logits_fn(h, prev).argmax(-1)
    ok = (pred == y) & (y >= 0)
    full = torch.zeros(sel.shape, dtype=torch.bool); full[sel] = ok
    return full

@torch.no_grad()
def evaluate():
    tot = {"base": [0, 0], "markov": [0, 0]}
    slot_acc = {"base": torch.zeros(B - 1), "markov": torch.zeros(B - 1)}; count = torch.zeros(B - 1)
    for k in range(0, n_eval, BS):
        idx = eval_idx[k:k + BS]
        h, prev, y, slot, sel = hidden_of(idx, torch.Generator().manual_seed(1000 + k))
        for name, fn in (("base", lambda h, p: h @ W.T), ("markov", lambda h, p: head(h, emb[p]) @ W.T)):
            c = correct_matrix(fn, h, prev, y, sel)
            acc = c.long().cumprod(-1).sum(-1)  # accepted drafts per block
            blocks = sel[:, :, 0]
            tot[name][0] += float(acc[blocks].sum()); tot[name][1] += int(blocks.sum())
            slot_acc[name] += (c & sel).sum((0, 1)).float()
        count += sel.sum((0, 1)).float()
    return {n: 1 + tot[n][0] / tot[n][1] for n in tot}, {n: (slot_acc[n] / count).tolist() for n in slot_acc}

print("eval before", evaluate(), flush=True)
t0 = time.time(); rng = random.Random(1)
for step in range(steps):
    idx = rng.sample(train_idx, BS)
    h, prev, y, slot, sel = hidden_of(idx, torch.Generator().manual_seed(step))
    keep = y >= 0
    logits = head(h[keep], emb[prev[keep]]) @ W.T
    loss = F.cross_entropy(logits, y[keep])
    opt.zero_grad(); loss.backward(); opt.step(); sched.step()
    if (step + 1) % 100 == 0:
        print(json.dumps({"step": step + 1, "loss": round(loss.item(), 4), "s": round(time.time() - t0, 1)}), flush=True)
    if (step + 1) % 1000 == 0 or step + 1 == steps:
        print("eval", step + 1, evaluate(), flush=True)
        torch.save(head.state_dict(), out)
