"""Training a drafter's Markov head (`hf_dflash.markov`): the drafter frozen, the head alone, teacher-forced.

Each anchor block of a training sample gives, at block positions 2, 3, ..., the drafter's hidden state there, the true
token before it (the parent) and the true token (the label); the head learns the label's draft-vocabulary logit from
both. Position 1 is left out: its parent is the block's first token, which the drafter reads, and the decode loop
keeps the drafter's own probabilities there. Features come from a feature store, as `hf-dflash train --features`
reads them, or from a target forward per step.
"""

import math
import random
from dataclasses import dataclass

import torch
from torch.nn import functional as F
from tqdm.auto import tqdm

from .batches import build_batch, sample_anchors
from .losses import LossHead, block_hidden


@dataclass
class MarkovHeadConfig:
    rank: int = 256  # SmolLM2's 576 -> 256 -> 576: 0.44 M parameters, about 0.3 ms a step on one CPU thread
    steps: int = 4000
    batch_size: int = 4  # samples per step, `num_anchors` blocks each
    num_anchors: int = 32
    learning_rate: float = 1e-3  # the head starts at zero (no change) and is small: a rate above the drafter's
    warmup_steps: int = 100
    seed: int = 0
    logging_steps: int = 100


def train_markov_head(drafter, target, samples, features_of, config: MarkovHeadConfig) -> list[dict]:
    """Train `drafter.markov_head` (added with `config.rank` if it has none) on `samples` (`load_samples`), the rest
    of the drafter frozen. `features_of(indices, batch)`: the target's features of a micro-batch (`StoreFeatures`,
    `OnlineFeatures`). Returns the log: the mean loss and accuracy of each `logging_steps` window."""
    if drafter.markov_head is None:
        drafter.set_markov_head(config.rank)
    drafter.requires_grad_(False).eval()
    head = drafter.markov_head.float().requires_grad_(True).train()
    loss_head = LossHead(target.get_output_embeddings(), drafter.draft_vocab)
    B, H = drafter.block_size, drafter.config.hidden_size
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.learning_rate, weight_decay=0.0)

    def rate(step: int) -> float:  # linear warm-up, then a cosine to zero
        warm = min(1.0, (step + 1) / max(config.warmup_steps, 1))
        return warm * 0.5 * (1 + math.cos(math.pi * step / max(config.steps, 1)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    order = random.Random(config.seed)
    log, window = [], {"loss": 0.0, "correct": 0, "count": 0}
    bar = tqdm(range(config.steps), desc="markov head")
    for step in bar:
        indices = order.sample(range(len(samples)), min(config.batch_size, len(samples)))
        generator = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
        anchors = [sample_anchors(torch.tensor(samples[i][1]), config.num_anchors, generator) for i in indices]
        batch = build_batch([samples[i] for i in indices], anchors, B, drafter.config.mask_token_id)
        features, _ = features_of(indices, batch)
        with torch.no_grad():
            hidden = block_hidden(drafter, target, batch, features.to(drafter.device), B)
            hidden = hidden.view(len(indices), -1, B, H)[:, :, 2:]  # [b, N, B - 2, H]
        labels = batch["labels"].to(drafter.device)
        where = batch["label_mask"][:, :, 2:].to(drafter.device).bool() & batch["anchor_valid"][:, :, None].to(drafter.device)
        rows = loss_head.index[labels[:, :, 2:][where]]  # draft-vocabulary rows, -1 outside it
        keep = rows >= 0
        if not bool(keep.any()):
            continue
        parents = drafter.embed(target, labels[:, :, 1:-1][where][keep])
        reread = head(hidden[where][keep].float(), parents.float())
        logits = drafter._scale_logits(loss_head.logits(reread))
        loss = F.cross_entropy(logits, rows[keep])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        window["loss"] += loss.item() * int(keep.sum())
        window["correct"] += int((logits.argmax(-1) == rows[keep]).sum())
        window["count"] += int(keep.sum())
        if (step + 1) % config.logging_steps == 0 or step + 1 == config.steps:
            count = max(window["count"], 1)
            log.append({"step": step + 1, "loss": window["loss"] / count, "accuracy": window["correct"] / count})
            bar.set_postfix(loss=f"{log[-1]['loss']:.3f}", accuracy=f"{log[-1]['accuracy']:.3f}")
            window = {"loss": 0.0, "correct": 0, "count": 0}
    head.requires_grad_(False).eval()
    return log
