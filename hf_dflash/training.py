"""Training a DFlash drafter for any target (the recipe of DFLASH.md section 3), on accelerate.

One step, per sequence: sample random anchors a (loss_mask[a] = loss_mask[a + 1] = 1), build one block
[x_a, MASK x (B - 1)] per anchor at positions a..a+B-1, run the drafter once over all blocks with the target's
features of the whole sequence as context, and score slot k (k = 1..B-1) against x_{a+k} through the frozen target
lm_head with weight exp(-(k - 1) / gamma). A block sees context strictly before its anchor (t < a) and its own B
tokens (bidirectionally; causally in sliding-window layers), nothing of other blocks.

accelerate is the engine: the same code runs single-process on a CPU, or under `accelerate launch` with DDP, FSDP
or DeepSpeed, in fp32 or bf16, with gradient accumulation and `save_state` / `load_state` checkpoints. A
hand-written step (rather than `transformers.Trainer`) because each step needs the frozen target's features,
random anchors and a chunked lm_head loss, none of which fits Trainer's `compute_loss` without overriding most of it.
"""

import json
import math
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint
from tqdm.auto import tqdm

from .data import frequent_tokens, load_samples
from .modeling import DFlashDraftModel

# gamma of the slot weights exp(-(k - 1) / gamma), from the recipe: later slots are accepted less often.
_GAMMA = {8: 4.0, 10: 5.0, 16: 7.0}


def default_gamma(block_size: int) -> float:
    """The recipe's gamma for block sizes 8, 10, 16; interpolated (B / 2 up to 10, then +1 per 3) elsewhere."""
    if block_size in _GAMMA:
        return _GAMMA[block_size]
    return block_size / 2 if block_size <= 10 else 5.0 + (block_size - 10) / 3


def slot_weights(block_size: int, gamma: float | None = None) -> torch.Tensor:
    """[B]: weight of each block slot; slot 0 (the anchor token itself) is not predicted."""
    gamma = default_gamma(block_size) if gamma is None else gamma
    k = torch.arange(block_size, dtype=torch.float32)
    return torch.where(k >= 1, torch.exp(-(k - 1) / gamma), torch.zeros(()))


@dataclass
class TrainingConfig:
    """Arguments of `train` (and of `hf-dflash train`). Defaults follow the recipe unless a comment says why."""

    target: str  # Hub id or local folder, as for from_pretrained
    data: str  # JSONL written by `hf-dflash prepare-data`
    output: str  # folder of the final drafter (z-lab format) and of checkpoints/
    num_layers: int = 1
    block_size: int = 16
    mask_token_id: int | None = None  # default: an embedding row the tokenizer does not use
    target_layer_ids: list[int] | None = None  # default: the DFlash rule
    num_anchors: int = 512  # blocks per sequence per step; fewer on a CPU, where the lm_head loss dominates
    gamma: float | None = None  # default: by block size (default_gamma)
    max_length: int = 3072
    batch_size: int = 1  # sequences per device per micro-batch
    gradient_accumulation_steps: int = 1
    learning_rate: float = 6e-4
    weight_decay: float = 0.0
    warmup_ratio: float = 0.04
    max_grad_norm: float = 1.0
    epochs: float = 6.0
    max_steps: int | None = None  # overrides epochs
    bf16: bool = False  # bf16 autocast with fp32 master weights; off by default because CPUs gain little from it
    seed: int = 0
    save_steps: int = 200
    logging_steps: int = 10
    lm_head_chunk_size: int = 2048  # query rows per lm_head + cross-entropy chunk: bounds logits memory
    cache_features: bool = False  # compute the target features once and keep them in memory (small sets)
    resume: bool = False  # continue from the newest checkpoint in output/checkpoints
    report_to: str | None = None  # an accelerate tracker name ("tensorboard", "wandb", ...)
    eval_prompts: str | None = None  # prompts file for a real acceptance-length eval with generate
    eval_steps: int = 0  # run that eval every N steps (0: only at the end when eval_prompts is set)
    eval_max_new_tokens: int = 64
    dtype: str = "float32"  # target dtype
    target_device_map: str | None = None  # e.g. "auto": spread a target too large for one device over all of them
    init_from: str | None = None  # start from these drafter weights (drafter folder, Hub id, checkpoint, file)
    # hf-dflash extension: draft only the N most frequent response tokens of the data. Scoring ~8K of SmolLM2's 49K
    # lm_head rows makes each drafter step several times cheaper on a CPU; rarer tokens are simply never drafted.
    draft_vocab_size: int | None = None
    extra: dict = field(default_factory=dict)  # recorded in the model card


# --- blocks, masks, loss -------------------------------------------------------------------------------------
def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator) -> torch.Tensor:
    """Up to `num_anchors` distinct positions a with loss_mask[a] = loss_mask[a + 1] = 1, sorted."""
    ok = (loss_mask[:-1] > 0) & (loss_mask[1:] > 0)
    candidates = ok.nonzero().squeeze(1)
    if candidates.numel() > num_anchors:
        pick = torch.randperm(candidates.numel(), generator=generator)[:num_anchors]
        candidates = candidates[pick]
    return candidates.sort().values


def build_batch(samples, anchors, block_size: int, mask_token_id: int, pad_token_id: int = 0) -> dict:
    """Right-pad sequences and anchors of a micro-batch into tensors.

    Returns input_ids / valid / loss_mask [b, T], anchors / anchor_valid [b, N], block_ids / block_pos [b, N*B],
    labels / label_weight_mask [b, N, B] (slot k of block j predicts x_{a_j + k}).
    """
    b = len(samples)
    T = max(len(ids) for ids, _ in samples)
    N = max(max(len(a) for a in anchors), 1)
    B = block_size
    input_ids = torch.full((b, T), pad_token_id, dtype=torch.long)
    valid = torch.zeros(b, T, dtype=torch.bool)
    loss_mask = torch.zeros(b, T, dtype=torch.bool)
    anchor = torch.zeros(b, N, dtype=torch.long)
    anchor_valid = torch.zeros(b, N, dtype=torch.bool)
    for i, ((ids, mask), a) in enumerate(zip(samples, anchors)):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        valid[i, : len(ids)] = True
        loss_mask[i, : len(ids)] = torch.tensor(mask, dtype=torch.bool)
        anchor[i, : len(a)] = a
        anchor_valid[i, : len(a)] = True
    offsets = torch.arange(B)
    target_pos = anchor[:, :, None] + offsets  # [b, N, B]
    in_range = target_pos < T
    gathered = input_ids.gather(1, target_pos.clamp(max=T - 1).view(b, -1)).view(b, N, B)
    label_ok = in_range & loss_mask.gather(1, target_pos.clamp(max=T - 1).view(b, -1)).view(b, N, B)
    label_ok &= anchor_valid[:, :, None] & (offsets >= 1)
    block_ids = torch.full((b, N, B), mask_token_id, dtype=torch.long)
    block_ids[:, :, 0] = gathered[:, :, 0]
    return {
        "input_ids": input_ids,
        "valid": valid,
        "loss_mask": loss_mask,
        "anchors": anchor,
        "anchor_valid": anchor_valid,
        "block_ids": block_ids.view(b, N * B),
        "block_pos": target_pos.view(b, N * B),
        "labels": gathered,
        "label_mask": label_ok,
    }


def training_mask(anchors, anchor_valid, valid, block_size: int, window: int | None = None) -> torch.Tensor:
    """Boolean visibility [b, 1, N*B, T + N*B] of keys [context ; blocks] for the block queries.

    Block j sees context t < a_j (real tokens only) and its own block: bidirectionally, or causally and within
    `window` positions for a sliding-window layer. A padding block sees only itself, so no row is fully masked.
    """
    b, N = anchors.shape
    T = valid.shape[1]
    B = block_size
    q_block = torch.arange(N * B) // B  # [Q]
    q_slot = torch.arange(N * B) % B
    a = anchors[:, q_block]  # [b, Q]
    q_pos = a + q_slot
    t = torch.arange(T)
    context = (t[None, None, :] < a[:, :, None]) & valid[:, None, :] & anchor_valid[:, q_block, None]
    same_block = q_block[:, None] == q_block[None, :]  # [Q, Q]
    blocks = same_block[None].expand(b, -1, -1)
    if window is not None:
        context = context & (q_pos[:, :, None] - t[None, None, :] < window)
        blocks = blocks & (q_slot[None, :, None] >= q_slot[None, None, :])
    return torch.cat([context, blocks], dim=2)[:, None]


def flex_training_mask(anchors, anchor_valid, valid, block_size: int, window: int | None = None):
    """The same visibility as `training_mask`, as a flex_attention BlockMask (CUDA): never materialised densely."""
    from torch.nn.attention.flex_attention import create_block_mask

    b, N = anchors.shape
    T = valid.shape[1]
    B = block_size

    def mask_mod(batch, head, q, kv):
        j = q // B
        a = anchors[batch, j]
        is_context = kv < T
        kv_ctx = kv.clamp(max=T - 1)
        kv_blk = (kv - T).clamp(min=0)
        see_context = (kv_ctx < a) & valid[batch, kv_ctx] & anchor_valid[batch, j]
        see_block = kv_blk // B == j
        if window is not None:
            see_context = see_context & (a + q % B - kv_ctx < window)
            see_block = see_block & (kv_blk % B <= q % B)
        return torch.where(is_context, see_context, see_block)

    return create_block_mask(mask_mod, b, None, N * B, T + N * B, device=anchors.device)


def chunked_loss(hidden, head, labels, mask, weights, chunk_size: int):
    """Weighted cross-entropy of the drafter's hidden states through the frozen lm_head, `chunk_size` rows at a time
    (recomputed in backward when there are several chunks), so at most [chunk_size, vocab] logits exist at once.

    hidden [R, H], labels [R], mask [R] bool, weights [R]. Returns (weighted loss sum, correct [R] bool)."""
    rows = mask.nonzero().squeeze(1)
    loss = hidden.new_zeros((), dtype=torch.float32)
    correct = torch.zeros_like(mask)

    def chunk_loss(h, y, w):
        logits = head(h.to(head.weight.device)).float()
        y, w = y.to(logits.device), w.to(logits.device)
        return (F.cross_entropy(logits, y, reduction="none") * w).sum().to(h.device), (logits.argmax(-1) == y).to(h.device)

    for start in range(0, rows.numel(), chunk_size):
        idx = rows[start : start + chunk_size]
        args = (hidden[idx], labels[idx], weights[idx])
        if hidden.requires_grad and rows.numel() > chunk_size:  # one chunk: keeping its logits costs no more
            part, hits = checkpoint(chunk_loss, *args, use_reentrant=False)
        else:
            part, hits = chunk_loss(*args)
        loss = loss + part
        correct[idx] = hits
    return loss, correct


def drafter_loss(drafter, target, batch: dict, features: torch.Tensor, config: TrainingConfig, slot_weight, forward=None):
    """Weighted loss sum (divide by metrics["weight"] for the mean) and metrics of one micro-batch. features: [b, T, len(ids) * H] target features (no grad).
    `forward` is the module to call (the DDP / FSDP wrapper when distributed); `drafter` the unwrapped model."""
    B = config.block_size
    b, NB = batch["block_ids"].shape
    N = NB // B
    T = batch["input_ids"].shape[1]
    device = features.device
    with torch.no_grad():  # the embedding is the target's, frozen
        noise = drafter.embed(target, batch["block_ids"].to(device))
    positions = torch.cat([torch.arange(T, device=device).expand(b, -1), batch["block_pos"].to(device)], dim=1)
    masks = {}
    flex = drafter.config._attn_implementation == "flex_attention"
    build = flex_training_mask if flex else training_mask
    for layer_type in set(drafter.config.layer_types or ["full_attention"]):
        window = drafter.config.sliding_window if layer_type == "sliding_attention" else None
        args = [batch[k].to(device) for k in ("anchors", "anchor_valid", "valid")]
        masks[layer_type] = build(*args, B, window)
    hidden = (forward or drafter)(
        noise_embeds=noise, context_hidden_states=features, position_ids=positions, attention_mask=masks
    ).last_hidden_state  # [b, N*B, H]
    labels = batch["labels"].to(device)
    label_mask = batch["label_mask"].to(device)
    weights = slot_weight.to(device)[None, None, :].expand(b, N, B) * label_mask
    loss, correct = chunked_loss(
        hidden.reshape(-1, hidden.shape[-1]),
        target.get_output_embeddings(),
        labels.reshape(-1),
        label_mask.reshape(-1),
        weights.reshape(-1),
        config.lm_head_chunk_size,
    )
    correct = correct.view(b, N, B)[:, :, 1:]
    slot_mask = label_mask[:, :, 1:]
    # Greedy acceptance of a block = length of its correct prefix (a wrong or missing slot ends it).
    accepted = (correct & slot_mask).long().cumprod(-1).sum(-1)[batch["anchor_valid"].to(device)]
    metrics = {
        "weight": weights.sum(),
        "slot_correct": (correct & slot_mask).sum((0, 1)).float(),
        "slot_count": slot_mask.sum((0, 1)).float(),
        "accepted": accepted.float().sum(),
        "blocks": torch.tensor(float(accepted.numel()), device=device),
    }
    return loss, metrics


def target_features(target, input_ids, valid, layer_ids) -> torch.Tensor:
    with torch.no_grad():
        # logits_to_keep=1: only the hidden states are used; the lm_head over every position was a quarter of this
        # forward for SmolLM2-135M (300 tokens, one CPU thread: 1.20 s -> 0.91 s).
        out = target(input_ids=input_ids, attention_mask=valid.long(), output_hidden_states=True, logits_to_keep=1)
    return torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)


# --- the training loop ---------------------------------------------------------------------------------------
def train(config: TrainingConfig, target=None, tokenizer=None) -> DFlashDraftModel:
    """Train a drafter for `config.target` on `config.data`; returns it and saves it to `config.output`."""
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer, get_cosine_schedule_with_warmup

    from .hub import TRAINING_ARGS, write_model_card
    from .packaged import resolve_model_path

    accelerator = Accelerator(
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        mixed_precision="bf16" if config.bf16 else "no",
        log_with=config.report_to,
        project_dir=config.output,
    )
    output = Path(config.output)
    checkpoints = output / "checkpoints"
    if accelerator.is_main_process:
        checkpoints.mkdir(parents=True, exist_ok=True)
    if target is None:
        path = resolve_model_path(config.target)
        target = AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, config.dtype), device_map=config.target_device_map
        )
        try:
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError):
            if config.mask_token_id is None or config.eval_prompts:
                raise  # the tokenizer picks the mask token and templates eval prompts
            tokenizer = None
    target.requires_grad_(False).eval()
    if getattr(target, "hf_device_map", None) is None:  # a device_map already placed it
        target.to(accelerator.device)

    torch.manual_seed(config.seed)
    drafter = DFlashDraftModel.from_target(
        target, config.num_layers, config.block_size, config.mask_token_id, config.target_layer_ids, tokenizer
    ).float()
    drafter.config.dflash_config["target_model"] = config.target  # the id, not a resolved local path
    if config.init_from:
        load_drafter_weights(drafter, config.init_from)
    drafter.train()
    layer_ids = drafter.config.target_layer_ids

    samples, dropped = load_samples(config.data, min_supervised_tokens=2 * config.block_size, max_length=config.max_length)
    if not samples:
        raise ValueError(f"{config.data}: no sample has {2 * config.block_size} supervised tokens.")
    if config.draft_vocab_size:  # drafting-time only: the loss still spans the whole vocabulary
        drafter.set_draft_vocab(frequent_tokens(samples, config.draft_vocab_size))
    world = accelerator.num_processes
    global_batch = config.batch_size * config.gradient_accumulation_steps * world
    steps_per_epoch = max(len(samples) // global_batch, 1)
    max_steps = config.max_steps or math.ceil(config.epochs * steps_per_epoch)

    optimizer = torch.optim.AdamW(drafter.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    scheduler = get_cosine_schedule_with_warmup(optimizer, round(config.warmup_ratio * max_steps), max_steps)
    # The scheduler is stepped once per optimizer step by hand: a prepared one would step once per process.
    drafter, optimizer = accelerator.prepare(drafter, optimizer)
    accelerator.register_for_checkpointing(scheduler)
    raw_drafter = accelerator.unwrap_model(drafter)
    weights = slot_weights(config.block_size, config.gamma)

    feature_cache = _feature_cache(target, samples, layer_ids, accelerator) if config.cache_features else None
    step = _resume(accelerator, checkpoints) if config.resume else 0
    if config.report_to:
        accelerator.init_trackers("hf-dflash", config=_flat(config))
    log_path = output / "train_log.jsonl"
    bar = tqdm(total=max_steps, initial=step, desc="training", disable=not accelerator.is_main_process)
    window = _Window()
    start = began = time.perf_counter()
    while step < max_steps:
        micro_batches = [
            _make_micro_batch(samples, step, micro, accelerator.process_index, config, world, steps_per_epoch,
                              raw_drafter.config.mask_token_id)
            for micro in range(config.gradient_accumulation_steps)
        ]
        # The loss is the weighted mean over every slot of the global batch: normalise by the global weight, scaled
        # back up by what DDP (mean over processes) and accelerate (mean over micro-batches) divide by.
        local_weight = sum((weights[None, None] * b["label_mask"]).sum() for _, b in micro_batches)
        global_weight = accelerator.reduce(local_weight.to(accelerator.device), "sum").clamp(min=1e-6)
        scale = world * config.gradient_accumulation_steps / global_weight
        for indices, batch in micro_batches:
            device = accelerator.device
            if feature_cache is not None:
                features = _pad_features([feature_cache[i] for i in indices], batch["input_ids"].shape[1]).to(device)
            else:
                ids, valid = batch["input_ids"].to(target.device), batch["valid"].to(target.device)
                features = target_features(target, ids, valid, layer_ids).to(device)
            with accelerator.accumulate(drafter), accelerator.autocast():
                weighted_sum, metrics = drafter_loss(raw_drafter, target, batch, features, config, weights, forward=drafter)
                accelerator.backward(weighted_sum * scale)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(drafter.parameters(), config.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                scheduler.step()
            window.add(weighted_sum.detach(), metrics, int(batch["valid"].sum()))
        step += 1
        window.steps += 1
        bar.update(1)
        if step % config.logging_steps == 0 or step == max_steps:
            record = window.flush(accelerator, step, scheduler.get_last_lr()[0], time.perf_counter() - start)
            start = time.perf_counter()
            if accelerator.is_main_process:
                bar.set_postfix(loss=f"{record['loss']:.3f}", tau=f"{record['predicted_tau']:.2f}")
                with open(log_path, "a") as f:
                    f.write(json.dumps(record) + "\n")
            if config.report_to:
                accelerator.log({k: v for k, v in record.items() if isinstance(v, float)}, step=step)
        if config.eval_prompts and config.eval_steps and step % config.eval_steps == 0:
            _eval_and_log(raw_drafter, target, tokenizer, config, step, log_path, accelerator)
        if step % config.save_steps == 0 or step == max_steps:
            _save_checkpoint(accelerator, checkpoints, step)
    bar.close()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        raw_drafter.eval()
        raw_drafter.save_pretrained(output)
        summary = {"samples": len(samples), "dropped_short": dropped, "steps": max_steps, "global_batch": global_batch,
                   "processes": world, "train_seconds": round(time.perf_counter() - began, 1)}
        if config.eval_prompts:
            summary["eval"] = _eval_and_log(raw_drafter, target, tokenizer, config, max_steps, log_path, accelerator)
        (output / TRAINING_ARGS).write_text(json.dumps({**_flat(config), **summary}, indent=2))
        write_model_card(output)
    if config.report_to:
        accelerator.end_training()
    return raw_drafter


def _make_micro_batch(samples, step, micro, rank, config, world, steps_per_epoch, mask_token_id):
    indices = _micro_batch(len(samples), step, micro, rank, config, world, steps_per_epoch)
    # Anchors seeded by (step, sample): the same blocks whatever the number of processes, and on resume.
    anchors = [
        sample_anchors(torch.tensor(samples[i][1]), config.num_anchors, _generator(config.seed, step, i))
        for i in indices
    ]
    return indices, build_batch([samples[i] for i in indices], anchors, config.block_size, mask_token_id)


def _micro_batch(num_samples, step, micro, rank, config, world, steps_per_epoch) -> list[int]:
    """Sample indices of one micro-batch: a seeded permutation per epoch, so a resumed run sees the same order."""
    epoch, within = divmod(step, steps_per_epoch)
    order = torch.randperm(num_samples, generator=torch.Generator().manual_seed(config.seed + epoch)).tolist()
    per_step = config.batch_size * config.gradient_accumulation_steps * world
    base = within * per_step + (micro * world + rank) * config.batch_size
    return [order[(base + i) % num_samples] for i in range(config.batch_size)]


def _generator(*seeds: int) -> torch.Generator:
    return torch.Generator().manual_seed(hash(seeds) % (2**63))


class _Window:
    """Running sums between two log lines."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.steps, self.tokens, self.metrics = 0, 0, {}

    def add(self, weighted_loss, metrics, tokens):
        metrics = {**metrics, "weighted_loss": weighted_loss}
        self.tokens += tokens
        for k, v in metrics.items():
            self.metrics[k] = self.metrics.get(k, 0) + v.detach().float().cpu()

    def flush(self, accelerator, step, lr, seconds) -> dict:
        totals = {k: accelerator.reduce(v.to(accelerator.device), "sum").cpu() for k, v in self.metrics.items()}
        accuracy = (totals["slot_correct"] / totals["slot_count"].clamp(min=1)).tolist()
        record = {
            "step": step,
            "loss": float(totals["weighted_loss"] / totals["weight"].clamp(min=1e-6)),
            "lr": lr,
            "slot_accuracy": [round(a, 4) for a in accuracy],
            "predicted_tau": float(1 + totals["accepted"] / totals["blocks"].clamp(min=1)),
            "tokens_per_s": self.tokens * accelerator.num_processes / max(seconds, 1e-9),
            "s_per_step": seconds / max(self.steps, 1),
        }
        self.reset()
        return record


def _feature_cache(target, samples, layer_ids, accelerator) -> list[torch.Tensor]:
    """Target features of every sample, computed once (bf16 in memory: about len(ids) * H * 2 bytes per token)."""
    cache = []
    for ids, _ in tqdm(samples, desc="target features", disable=not accelerator.is_main_process):
        x = torch.tensor([ids], device=accelerator.device)
        cache.append(target_features(target, x, torch.ones_like(x, dtype=torch.bool), layer_ids)[0].to(torch.bfloat16).cpu())
    return cache


def _pad_features(features: list[torch.Tensor], length: int) -> torch.Tensor:
    out = torch.zeros(len(features), length, features[0].shape[-1])
    for i, f in enumerate(features):
        out[i, : f.shape[0]] = f.float()
    return out


def load_drafter_weights(drafter: DFlashDraftModel, source: str) -> None:
    """Copy the weights of another drafter of the same shape into `drafter`: `source` is a saved drafter folder, a
    training checkpoint folder (`checkpoints/checkpoint-N`), a `.safetensors` file or a Hub id. Its draft
    vocabulary is not copied (a run sets its own with `draft_vocab_size`)."""
    path = Path(source)
    if path.is_dir():
        path = path / "model.safetensors"
    elif not path.is_file():
        from huggingface_hub import hf_hub_download

        path = Path(hf_hub_download(source, "model.safetensors"))
    if not path.is_file():
        raise FileNotFoundError(f"init_from={source!r}: no model.safetensors there.")
    state = load_file(str(path))
    state.pop("draft_vocab", None)
    try:
        result = drafter.load_state_dict(state, strict=False)  # raises on a shape mismatch
        bad = result.missing_keys + result.unexpected_keys
    except RuntimeError as error:
        bad = [str(error).splitlines()[-1].strip()]
    if bad:
        raise ValueError(
            f"init_from={source!r} does not fit this drafter (differing tensors: {', '.join(bad[:6])}"
            f"{', ...' if len(bad) > 6 else ''}). Use the same num_layers and target_layer_ids as the run it came from."
        )


def _save_checkpoint(accelerator, checkpoints: Path, step: int) -> None:
    """accelerate state (model, optimizer, scheduler, RNG) + step, written to a temp folder then renamed: a crash
    never leaves a half-written checkpoint."""
    final = checkpoints / f"checkpoint-{step}"
    tmp = checkpoints / f".tmp-checkpoint-{step}"
    if accelerator.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    if accelerator.is_main_process:
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step}))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    accelerator.wait_for_everyone()


def _resume(accelerator, checkpoints: Path) -> int:
    found = sorted(
        (p for p in checkpoints.glob("checkpoint-*") if (p / "trainer_state.json").exists()),
        key=lambda p: int(p.name.split("-")[1]),
    )
    if not found:
        return 0
    accelerator.load_state(str(found[-1]))
    return json.loads((found[-1] / "trainer_state.json").read_text())["step"]


def _eval_and_log(drafter, target, tokenizer, config, step, log_path, accelerator) -> dict | None:
    """Real acceptance length with generate on held-out prompts (main process only)."""
    if not accelerator.is_main_process:
        return None
    from .bench import acceptance_on_prompts

    drafter.eval()
    result = acceptance_on_prompts(target, drafter, tokenizer, config.eval_prompts, config.eval_max_new_tokens)
    drafter.train()
    with open(log_path, "a") as f:
        f.write(json.dumps({"step": step, "eval": result}) + "\n")
    return result


def _flat(config: TrainingConfig) -> dict:
    return {k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v)) for k, v in asdict(config).items()}


__all__ = [
    "TrainingConfig",
    "build_batch",
    "chunked_loss",
    "default_gamma",
    "drafter_loss",
    "sample_anchors",
    "slot_weights",
    "train",
    "training_mask",
]
