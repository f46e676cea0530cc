"""The training loop of a DFlash drafter (the recipe of DFLASH.md section 3), on accelerate.

One step, per sequence: sample random anchors a (loss_mask[a] = loss_mask[a + 1] = 1), build one block
[x_a, MASK x (B - 1)] per anchor at positions a..a+B-1 (`batches`), run the drafter once over all blocks with the
target's features of the whole sequence as context (`features`: a store, a cache or a target forward), and score
slot k (k = 1..B-1) against x_{a+k} through the frozen target head (`losses`).

accelerate is the engine: the same code runs single-process on a CPU, or under `accelerate launch` with DDP, FSDP
or DeepSpeed, in fp32 or bf16, with gradient accumulation and `save_state` / `load_state` checkpoints. A
hand-written step (rather than `transformers.Trainer`) because each step needs the frozen target's features,
random anchors and a chunked lm_head loss, none of which fits Trainer's `compute_loss` without overriding most of it.
"""

import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from tqdm.auto import tqdm

from ..bigram import DEFAULTS as BIGRAM_DEFAULTS
from ..bigram import count_bigram_prior
from ..devices import native_bf16
from ..modeling import DFlash2DraftModel, DFlashDraftModel
from .batches import build_batch, sample_anchors
from .config import TrainingConfig
from .data import frequent_tokens, load_samples
from .evaluate import acceptance_on_prompts
from .features import CachedFeatures, OnlineFeatures, StoreFeatures
from .losses import LossHead, drafter_loss, slot_weights


# --- the training loop ---------------------------------------------------------------------------------------
def train(config: TrainingConfig, target=None, tokenizer=None) -> DFlashDraftModel:
    """Train a drafter for `config.target` on `config.data`; returns it and saves it to `config.output`."""
    from accelerate import Accelerator
    from transformers import get_cosine_schedule_with_warmup

    if config.threads:
        torch.set_num_threads(config.threads)
    bf16 = native_bf16() if config.bf16 is None else config.bf16
    joined = torch.distributed.is_available() and torch.distributed.is_initialized()  # a caller's own process group
    accelerator = Accelerator(
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        mixed_precision="bf16" if bf16 else "no",
        log_with=config.report_to,
        project_dir=config.output,
    )
    output = Path(config.output)
    if accelerator.is_main_process:
        (output / "checkpoints").mkdir(parents=True, exist_ok=True)
    target, tokenizer = _load_target(config, target, tokenizer, accelerator.device)
    drafter = _new_drafter(config, target, tokenizer)
    sample_ids = []
    samples, dropped = load_samples(
        config.data, min_supervised_tokens=2 * config.block_size, max_length=config.max_length, checks=sample_ids
    )
    if not samples:
        raise ValueError(f"{config.data}: no sample has {2 * config.block_size} supervised tokens.")
    if config.draft_vocab_size:
        drafter.set_draft_vocab(frequent_tokens(samples, config.draft_vocab_size))
    world = accelerator.num_processes
    global_batch = config.batch_size * config.gradient_accumulation_steps * world
    steps_per_epoch = max(len(samples) // global_batch, 1)
    max_steps = config.max_steps or math.ceil(config.epochs * steps_per_epoch)

    optimizer = torch.optim.AdamW(drafter.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    scheduler = get_cosine_schedule_with_warmup(optimizer, round(config.warmup_ratio * max_steps), max_steps)
    # The scheduler is stepped once per optimizer step by hand: a prepared one would step once per process.
    wrapped, optimizer = accelerator.prepare(drafter, optimizer)
    accelerator.register_for_checkpointing(scheduler)
    run = _Run(config, accelerator, target, wrapped, accelerator.unwrap_model(wrapped), optimizer, scheduler,
               head=LossHead(target.get_output_embeddings(), drafter.draft_vocab),  # the rows it can propose
               weights=slot_weights(config.block_size, config.gamma),
               features_of=_features_source(config, target, samples, sample_ids, drafter, accelerator))
    began = time.perf_counter()
    _optimize(run, samples, steps_per_epoch, max_steps, tokenizer, output)
    if accelerator.is_main_process:
        summary = {"samples": len(samples), "dropped_short": dropped, "steps": max_steps, "global_batch": global_batch,
                   "processes": world, "train_seconds": round(time.perf_counter() - began, 1)}
        _save_drafter(run, samples, tokenizer, output, summary)
    accelerator.wait_for_everyone()  # no process leaves while the main one saves
    for tracker in accelerator.trackers:
        tracker.finish()
    if not joined and torch.distributed.is_available() and torch.distributed.is_initialized():
        # the group accelerate started here: left alive, its gloo threads can abort a process at exit
        torch.distributed.destroy_process_group()
    return run.drafter


def _load_target(config: TrainingConfig, target, tokenizer, device) -> tuple:
    """The frozen target (loaded from `config.target` unless given) and its tokenizer (None if it has none and
    nothing needs one)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..packaged import resolve_model_path

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
        target.to(device)
    return target, tokenizer


def _new_drafter(config: TrainingConfig, target, tokenizer) -> DFlashDraftModel:
    """The drafter to train, in float32: from the target's shape (and a feature store's layers unless the config
    names them), or from `init_from`'s weights."""
    store_layers = None
    if config.features:  # the store decides which target layers the drafter reads, unless told otherwise
        from .store import FeatureStore

        store_layers = FeatureStore(config.features).target_layer_ids
    torch.manual_seed(config.seed)
    dflash2 = config.architecture == "dflash2"
    drafter = (DFlash2DraftModel if dflash2 else DFlashDraftModel).from_target(
        target, config.num_layers, config.block_size, config.mask_token_id, config.target_layer_ids or store_layers,
        tokenizer, **({"dflash_config": {"selector_rank": config.selector_rank}} if dflash2 else {}),
    ).float()
    drafter.config.dflash_config["target_model"] = config.target  # the id, not a resolved local path
    if config.init_from:
        load_drafter_weights(drafter, config.init_from)
    return drafter.train()


def _features_source(config: TrainingConfig, target, samples, sample_ids, drafter, accelerator):
    """Where a batch's target features come from: a feature store, a cache filled once, or a target forward."""
    layer_ids = drafter.config.target_layer_ids
    if config.features:
        features_of = StoreFeatures(config.features, sample_ids, layer_ids, drafter.config.hidden_size)
    elif config.cache_features:
        features_of = CachedFeatures(target, samples, layer_ids, accelerator.device, accelerator.is_main_process)
    else:
        features_of = OnlineFeatures(target, layer_ids)
    if config.loss == "lk" and not features_of.topk:
        raise ValueError(
            "loss='lk' needs the target's distribution: write a feature store with "
            "`hf-dflash prepare-data ... --save-features DIR --target-topk 16` and train with --features DIR."
        )
    return features_of


@dataclass
class _Run:
    """What every optimizer step uses: `wrapped` is the drafter as accelerate prepared it, `drafter` the model."""

    config: TrainingConfig
    accelerator: object
    target: object
    wrapped: object
    drafter: DFlashDraftModel
    optimizer: object
    scheduler: object
    head: LossHead
    weights: torch.Tensor
    features_of: object


def _optimize(run: _Run, samples, steps_per_epoch: int, max_steps: int, tokenizer, output: Path) -> None:
    """Optimizer steps from the last checkpoint (`config.resume`) or 0 to `max_steps`, logging, evaluating and
    checkpointing on the config's schedule."""
    config, accelerator = run.config, run.accelerator
    checkpoints = output / "checkpoints"
    step = _resume(accelerator, checkpoints) if config.resume else 0
    if config.report_to:
        accelerator.init_trackers("hf-dflash", config=_flat(config))
    log_path = output / "train_log.jsonl"
    bar = tqdm(total=max_steps, initial=step, desc="training", disable=not accelerator.is_main_process)
    window = _Window()
    start = time.perf_counter()
    while step < max_steps:
        micro_batches = [
            _make_micro_batch(samples, step, micro, accelerator.process_index, config, accelerator.num_processes,
                              steps_per_epoch, run.drafter.config.mask_token_id)
            for micro in range(config.gradient_accumulation_steps)
        ]
        _optimizer_step(run, micro_batches, window)
        step += 1
        window.steps += 1
        bar.update(1)
        if step % config.logging_steps == 0 or step == max_steps:
            record = window.flush(accelerator, step, run.scheduler.get_last_lr()[0], time.perf_counter() - start)
            start = time.perf_counter()
            if accelerator.is_main_process:
                bar.set_postfix(loss=f"{record['loss']:.3f}", tau=f"{record['predicted_tau']:.2f}")
                with open(log_path, "a") as f:
                    f.write(json.dumps(record) + "\n")
            if config.report_to:
                accelerator.log({k: v for k, v in record.items() if isinstance(v, float)}, step=step)
        if config.eval_prompts and config.eval_steps and step % config.eval_steps == 0:
            _eval_and_log(run.drafter, run.target, tokenizer, config, step, log_path, accelerator)
        if step % config.save_steps == 0 or step == max_steps:
            _save_checkpoint(accelerator, checkpoints, step)
    bar.close()
    accelerator.wait_for_everyone()


def _optimizer_step(run: _Run, micro_batches: list, window) -> None:
    """One optimizer step over `micro_batches` (gradient accumulation), the loss a weighted mean over every slot of
    the global batch."""
    config, accelerator = run.config, run.accelerator
    # Normalised by the global weight, scaled back up by what DDP (mean over processes) and accelerate (mean over
    # micro-batches) divide by.
    local_weight = sum((run.weights[None, None] * b["label_mask"]).sum() for _, b in micro_batches)
    global_weight = accelerator.reduce(local_weight.to(accelerator.device), "sum").clamp(min=1e-6)
    scale = accelerator.num_processes * config.gradient_accumulation_steps / global_weight
    for indices, batch in micro_batches:
        features, topk = run.features_of(indices, batch)
        with accelerator.accumulate(run.wrapped), accelerator.autocast():
            weighted_sum, metrics = drafter_loss(
                run.drafter, run.target, batch, features.to(accelerator.device), config, run.weights,
                forward=run.wrapped, head=run.head, target_topk=topk,
            )
            accelerator.backward(weighted_sum * scale)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(run.wrapped.parameters(), config.max_grad_norm)
            run.optimizer.step()
            run.optimizer.zero_grad()
        if accelerator.sync_gradients:
            run.scheduler.step()
        window.add(weighted_sum.detach(), metrics, int(batch["valid"].sum()))


def _save_drafter(run: _Run, samples, tokenizer, output: Path, summary: dict) -> None:
    """The trained drafter into `output` (main process): its bigram prior, weights, training record and card."""
    from ..hub import TRAINING_ARGS, write_model_card

    config, drafter = run.config, run.drafter
    drafter.eval()
    # DFlash2's selector does the prior's work. Counted at the end: no checkpoint holds it, so a resumed run never
    # needs it
    if config.bigram_prior and config.architecture != "dflash2":
        prior = count_bigram_prior(samples, drafter.config.vocab_size, drafter.draft_vocab)
        drafter.set_bigram_prior(*prior, **BIGRAM_DEFAULTS)
    drafter.save_pretrained(output)
    if config.eval_prompts:
        summary["eval"] = _eval_and_log(drafter, run.target, tokenizer, config, summary["steps"],
                                        output / "train_log.jsonl", run.accelerator)
    (output / TRAINING_ARGS).write_text(json.dumps({**_flat(config), **summary}, indent=2))
    write_model_card(output)


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
            **({"selector_accuracy": round(float(totals["selector_correct"]
                                                 / totals["selector_count"].clamp(min=1)), 4)}
               if "selector_count" in totals else {}),
            "predicted_tau": float(1 + totals["accepted"] / totals["blocks"].clamp(min=1)),
            "tokens_per_s": self.tokens * accelerator.num_processes / max(seconds, 1e-9),
            "s_per_step": seconds / max(self.steps, 1),
        }
        self.reset()
        return record


def load_drafter_weights(drafter: DFlashDraftModel, source: str) -> None:
    """Copy the weights of another drafter of the same shape into `drafter`: `source` is a saved drafter folder, a
    training checkpoint folder (`checkpoints/checkpoint-N`), a `.safetensors` file or a Hub id. Its draft
    vocabulary and bigram prior are not copied (a run sets its own: `draft_vocab_size`, `bigram_prior`). A DFlash2
    drafter may start from a DFlash one: its convolutions (the identity) and selector keep their initialisation."""
    path = Path(source)
    if path.is_dir():
        path = path / "model.safetensors"
    elif not path.is_file():
        from huggingface_hub import hf_hub_download

        path = Path(hf_hub_download(source, "model.safetensors"))
    if not path.is_file():
        raise FileNotFoundError(f"init_from={source!r}: no model.safetensors there.")
    state = load_file(str(path))
    for name in ("draft_vocab", "bigram_keys", "bigram_boosts"):  # the run sets its own
        state.pop(name, None)
    state = {f"{k}.weight" if k.endswith("_codebook") else k: v for k, v in state.items()}  # z-lab DFlash2 names
    from_dflash = isinstance(drafter, DFlash2DraftModel) and not any("_conv." in k for k in state)
    try:
        result = drafter.load_state_dict(state, strict=False)  # raises on a shape mismatch
        missing = [k for k in result.missing_keys if not (from_dflash and ("_conv." in k or "candidate_selector" in k))]
        bad = missing + result.unexpected_keys
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
    accelerator.wait_for_everyone()  # every process writes its RNG state into tmp: rename only after the last one
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
    drafter.eval()
    result = acceptance_on_prompts(target, drafter, tokenizer, config.eval_prompts, config.eval_max_new_tokens)
    drafter.train()
    with open(log_path, "a") as f:
        f.write(json.dumps({"step": step, "eval": result}) + "\n")
    return result


def _flat(config: TrainingConfig) -> dict:
    plain = (int, float, str, bool)
    return {k: (v if isinstance(v, plain) or v is None else str(v)) for k, v in asdict(config).items()}
