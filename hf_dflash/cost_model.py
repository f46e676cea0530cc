"""Moved: forward costs to `hf_dflash.generation.forward_costs`, the "auto" policy to
`hf_dflash.generation.auto_size`; this import path stays for existing code."""

from .generation.auto_size import NodeCalibration, choose_tree_size
from .generation.forward_costs import (
    ForwardCosts,
    LoopCosts,
    forward_costs_dir,
    load_forward_costs,
    measure_forward_costs,
    time_forwards,
)

__all__ = [
    "ForwardCosts",
    "LoopCosts",
    "NodeCalibration",
    "choose_tree_size",
    "forward_costs_dir",
    "load_forward_costs",
    "measure_forward_costs",
    "time_forwards",
]
