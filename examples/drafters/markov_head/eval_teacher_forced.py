"""Teacher-forced chain acceptance of train_head.py's head on held-out stored samples, against the drafter's argmax
and its bigram prior (which counted these samples: optimistic for the prior). Session 22's one-off.

    python examples/drafters/markov_head/eval_teacher_forced.py HEAD.pt 256 200
"""
import sys, random, json
import torch, torch.nn as nn, torch.nn.functional as F
from transformers import AutoModel
import hf_dflash  # noqa
from hf_dflash.bigram import lookup
from hf_dflash.data import load_samples
from hf_dflash.packaged import load_packaged
from hf_dflash.training.batches import build_batch, sample_anchors
from hf_dflash.training.features import StoreFeatures
from hf_dflash.training.losses import training_mask
torch.set_num_threads(1)
B, NA, BS, K = 8, 32, 4, 8
head_path, rank, n_eval = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
target, tok = load_packaged(dtype=torch.float32)
drafter = AutoModel.from_pretrained("/work/main/examples/drafters/smollm2-135m-instruct-dflash", dtype=torch.float32).eval()
prior = drafter.bigram_prior
checks = []
samples, _ = load_samples("/work/runs/markov/data_stored.jsonl", min_supervised_tokens=2 * B, max_length=512, checks=checks)
feats = StoreFeatures("/work/runs/smollm2/store", checks, drafter.config.target_layer_ids, drafter.config.hidden_size)
order = list(range(len(samples))); random.Random(0).shuffle(order)
eval_idx = order[:n_eval]
emb = target.get_input_embeddings().weight.detach()
vocab_ids = drafter.draft_vocab
W = target.get_output_embeddings().weight.detach()[vocab_ids]
H = drafter.config.hidden_size
class Markov(nn.Module):
    def __init__(self, H, r):
        super().__init__()
        self.h, self.e, self.o = nn.Linear(H, r), nn.Linear(H, r, bias=False), nn.Linear(r, H, bias=False)
    def forward(self, h, prev_emb):
        return h + self.o(F.gelu(self.h(h) + self.e(prev_emb)))
head = Markov(H, rank); head.load_state_dict(torch.load(head_path)); head.eval()
res = {}
with torch.no_grad():
    for k0 in range(0, n_eval, BS):
        idx = eval_idx[k0:k0 + BS]
        anchors = [sample_anchors(torch.tensor(samples[i][1]), NA, torch.Generator().manual_seed(1000 + k0)) for i in idx]
        batch = build_batch([samples[i] for i in idx], anchors, B, drafter.config.mask_token_id)
        features, _ = feats(idx, batch)
        b = len(idx); T = batch["input_ids"].shape[1]
        positions = torch.cat([torch.arange(T).expand(b, -1), batch["block_pos"]], 1)
        masks = {"full_attention": training_mask(batch["anchors"], batch["anchor_valid"], batch["valid"], B, None)}
        hidden = drafter(noise_embeds=drafter.embed(target, batch["block_ids"]), context_hidden_states=features.float(),
                         position_ids=positions, attention_mask=masks).last_hidden_state.view(b, -1, B, H)
        labels, lmask = batch["labels"], batch["label_mask"].bool()
        sel = lmask[:, :, 1:] & batch["anchor_valid"][:, :, None]   # [b, N, 7]
        h = hidden[:, :, 1:]                                        # [b, N, 7, H]
        prev, truth = labels[:, :, :-1], labels[:, :, 1:]
        base = h @ W.T                                              # [b, N, 7, Dv]
        p, cand = base.softmax(-1).topk(K, -1)                      # [b, N, 7, K]
        cand_ids = vocab_ids[cand]
        z = head(h, emb[prev])                                      # [b, N, 7, H]
        mlog = torch.einsum("bnjh,bnjkh->bnjk", z, W[cand])          # head logits of the candidates
        boost = lookup(prior, prev[..., None], cand_ids).float()
        first = torch.zeros(7, dtype=torch.bool); first[0] = True
        scores = {
            "base": p.log(),
            "prior": torch.where(first[:, None], p.log(), p.log() + boost.log()),
            "markov": mlog,
            "markov_from_2": torch.where(first[:, None], p.log(), mlog),
            "markov+prior_from_2": torch.where(first[:, None], p.log(), mlog + boost.log()),
        }
        for name, s in scores.items():
            pick = cand_ids.gather(-1, s.argmax(-1, keepdim=True)).squeeze(-1)
            ok = (pick == truth) & sel
            acc = ok.long().cumprod(-1).sum(-1)[sel[..., 0]]
            r = res.setdefault(name, [0, 0, torch.zeros(7), torch.zeros(7)])
            r[0] += float(acc.sum()); r[1] += acc.numel(); r[2] += ok.sum((0, 1)).float(); r[3] += sel.sum((0, 1)).float()
for name, r in res.items():
    print(json.dumps({"scores": name, "tau": round(1 + r[0] / r[1], 4), "slot_acc": [round(x, 3) for x in (r[2] / r[3]).tolist()]}))
