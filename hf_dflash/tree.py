"""Moved to `hf_dflash.generation.tree`; this import path stays for existing code."""

from .generation.tree import DraftTree, ancestors, build_tree, greedy_paths, mask_one_token, tree_attention_mask

__all__ = ["DraftTree", "ancestors", "build_tree", "greedy_paths", "mask_one_token", "tree_attention_mask"]
