"""Moved: prompt reading to `hf_dflash.prompts`, data preparation to `hf_dflash.training.data`; this import path
stays for existing code."""

from .prompts import DataError, Prompt, read_prompts
from .training.data import PrepareStats, frequent_tokens, load_samples, prepare_data, store_features

__all__ = [
    "DataError", "PrepareStats", "Prompt", "frequent_tokens", "load_samples", "prepare_data", "read_prompts",
    "store_features",
]
