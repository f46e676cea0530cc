"""Training a DFlash drafter for any target: `train(TrainingConfig(...))`, or `hf-dflash train`.

    config.py    TrainingConfig, the options of `hf-dflash train`
    store.py     the feature store written while the target regenerates the data (prepare-data --save-features)
    features.py  where a step's target features come from: the store, an in-memory cache, or a target forward
    batches.py   anchors, blocks, labels and the attention masks of a step
    losses.py    the chunked loss through the frozen head: ce, dpace, lk; the draft-vocabulary head
    loop.py      the accelerate training loop, checkpoints, evaluation
"""

from .batches import build_batch, flex_training_mask, sample_anchors, training_mask
from .config import FIELD_HELP, LOSSES, TrainingConfig
from .features import target_features
from .losses import (
    LossHead,
    chunked_loss,
    chunked_slot_losses,
    default_gamma,
    dpace_weights,
    drafter_loss,
    slot_weights,
)
from .loop import load_drafter_weights, train
from .store import FeatureCapture, FeatureStore, StoreMismatch

__all__ = [
    "FIELD_HELP",
    "LOSSES",
    "FeatureCapture",
    "FeatureStore",
    "LossHead",
    "StoreMismatch",
    "TrainingConfig",
    "build_batch",
    "chunked_loss",
    "chunked_slot_losses",
    "default_gamma",
    "dpace_weights",
    "drafter_loss",
    "flex_training_mask",
    "load_drafter_weights",
    "sample_anchors",
    "slot_weights",
    "target_features",
    "train",
    "training_mask",
]
