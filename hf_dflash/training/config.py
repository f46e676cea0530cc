"""`TrainingConfig`: the arguments of `train` and of `hf-dflash train` (one flag per field, help from `FIELD_HELP`)."""

from dataclasses import dataclass, field

LOSSES = ("ce", "dpace", "lk")
ARCHITECTURES = ("dflash", "dflash2")


@dataclass
class TrainingConfig:
    """Arguments of `train`. Defaults follow the recipe of DFLASH.md section 3 unless a comment says why."""

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
    # bf16 autocast with fp32 master weights. None: on where the device computes bf16 natively (CUDA, or a CPU with
    # AVX512-BF16 / AMX, where a drafter step runs several times faster); off elsewhere, where it is slower.
    bf16: bool | None = None
    seed: int = 0
    save_steps: int = 200
    logging_steps: int = 10
    lm_head_chunk_size: int = 2048  # query rows per lm_head + loss chunk: bounds logits memory
    features: str | None = None  # a feature store (prepare-data --save-features): no target forward for features
    cache_features: bool = False  # without a store: compute the target features once and keep them in memory
    resume: bool = False  # continue from the newest checkpoint in output/checkpoints
    report_to: str | None = None  # an accelerate tracker name ("tensorboard", "wandb", ...)
    eval_prompts: str | None = None  # prompts file for a real acceptance-length eval with generate
    eval_steps: int = 0  # run that eval every N steps (0: only at the end when eval_prompts is set)
    eval_max_new_tokens: int = 64
    dtype: str = "float32"  # target dtype
    target_device_map: str | None = None  # e.g. "auto": spread a target too large for one device over all of them
    init_from: str | None = None  # start from these drafter weights (drafter folder, Hub id, checkpoint, file)
    # hf-dflash extension: draft only the N most frequent response tokens of the data, and score only those rows in
    # the loss (a label outside them is masked: the drafter can never propose it). Sized in docs/design.md.
    draft_vocab_size: int | None = None
    # hf-dflash extension: the bigram prior of the training responses, counted into the saved drafter
    # (`hf_dflash.bigram`): drafts conditioned on their parent token, higher acceptance at no training cost.
    bigram_prior: bool = True
    # dpace: cross-entropy weighted by the drafter's own per-slot confidence (D-PACE): measured best at a small budget
    # (docs/design.md).
    # ce: the paper's weighted cross-entropy; lk: the target's distribution (needs a store with --target-topk).
    loss: str = "dpace"
    dpace_alpha: float = 0.5  # D-PACE smoothing q~ = (1 - alpha) q + alpha: keeps late slots from vanishing
    # dflash2: convolutions around each sublayer and a candidate selector trained beside the drafter (docs/design.md)
    architecture: str = "dflash"
    # the selector's rank: z-lab's drafters use 256 for 150K-256K vocabularies and hidden sizes of 4K-6K; its two
    # codebooks cost vocab x rank each, so a small target gets a smaller rank
    selector_rank: int = 64
    # weight of the selector's loss beside the drafter's: the published recipes default to 1.0; 0.1 measured better
    # on Qwen3-4B (their notes)
    selector_loss_alpha: float = 0.1
    threads: int | None = None  # torch threads of this process (None: torch's default)
    extra: dict = field(default_factory=dict)  # recorded in the model card

    def __post_init__(self):
        if self.loss not in LOSSES:
            raise ValueError(f"loss={self.loss!r}: choose one of {', '.join(LOSSES)}.")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture={self.architecture!r}: choose one of {', '.join(ARCHITECTURES)}.")


FIELD_HELP = {
    "target": "target model: Hub id or local folder",
    "data": "prepared JSONL (hf-dflash prepare-data)",
    "output": "output folder for the drafter and checkpoints/",
    "num_layers": "drafter decoder layers",
    "block_size": "tokens per block (drafts block_size - 1 per step)",
    "mask_token_id": "embedding row used for the block's masked slots (default: a row the tokenizer never uses)",
    "target_layer_ids": "target layers whose outputs condition the drafter (default: the DFlash rule)",
    "num_anchors": "blocks per sequence per step (recipe: 512; lower on CPU)",
    "gamma": "slot weight decay exp(-(k-1)/gamma); default by block size",
    "max_length": "truncate training sequences to this many tokens",
    "batch_size": "sequences per process per micro-batch",
    "gradient_accumulation_steps": "micro-batches per optimizer step",
    "learning_rate": "AdamW peak learning rate (cosine schedule)",
    "weight_decay": "AdamW weight decay",
    "warmup_ratio": "share of the steps spent in linear warm-up",
    "max_grad_norm": "gradient clipping norm",
    "epochs": "passes over the data (ignored with --max-steps)",
    "max_steps": "optimizer steps (overrides --epochs)",
    "bf16": "bf16 autocast with fp32 master weights (default: on where the device computes bf16 natively)",
    "seed": "seed of the data order, anchors and initialisation",
    "save_steps": "checkpoint every N steps (resumable with --resume)",
    "logging_steps": "log loss, slot accuracy and predicted tau every N steps",
    "lm_head_chunk_size": "rows per lm_head + loss chunk (bounds memory)",
    "features": "feature store written by prepare-data --save-features: the target is not run for features",
    "cache_features": "without a store: compute target features once and keep them in memory",
    "resume": "continue from the newest checkpoint in OUTPUT/checkpoints",
    "report_to": "accelerate tracker (tensorboard, wandb, ...)",
    "eval_prompts": "prompts file for a real acceptance-length eval with generate",
    "eval_steps": "run that eval every N steps (0: at the end only)",
    "eval_max_new_tokens": "new tokens per eval prompt",
    "dtype": "dtype of the target (float32, bfloat16, ...)",
    "target_device_map": "device_map of the target, e.g. auto to spread it over several devices",
    "init_from": "start from another drafter's weights: drafter folder, Hub id, checkpoint folder or .safetensors",
    "draft_vocab_size": "draft and score only the N most frequent response tokens (cheaper drafting and loss)",
    "bigram_prior": "count the training responses' bigram prior into the saved drafter (drafts conditioned on their "
    "parent token; --no-bigram-prior leaves it out)",
    "loss": "dpace (default: confidence-weighted slots, measured best), ce (the paper's) or lk (against the target's "
    "distribution; needs a store with --target-topk)",
    "dpace_alpha": "D-PACE confidence smoothing",
    "architecture": "dflash, or dflash2 (convolutions and a candidate selector, trained jointly)",
    "selector_rank": "DFlash2: rank of the candidate selector",
    "selector_loss_alpha": "DFlash2: weight of the selector's loss beside the drafter's",
    "threads": "torch threads of this process",
}
