"""Moved to `hf_dflash.generation.hooks`; this import path stays for existing code."""

from .generation.hooks import install_hooks, is_dflash_checkpoint, original_generate, uninstall_hooks

__all__ = ["install_hooks", "is_dflash_checkpoint", "original_generate", "uninstall_hooks"]
