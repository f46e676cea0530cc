"""Measuring drafters: `benchmark` (run.py) against plain `generate` and baselines on prompt sets (prompt_sets.py),
its report (report.py), the oracle's ceiling (oracle.py), plain `generate` and DFlash at their best (static.py) and
random targets (random_models.py). `hf-dflash bench` is the command-line front end."""

from .oracle import OracleDecoder, OracleDrafts, OracleProposer, ceilings, oracle_generate
from .prompt_sets import BENCH_FILES, PACKAGED_SETS, load_prompt_set
from .random_models import RANDOM_SHAPES, build_random_models, random_prompts, random_target_config
from .report import plot, to_markdown, write_outputs
from .run import BASELINES, DEFAULT_BASELINES, benchmark, first_difference, machine_info

__all__ = [
    "BASELINES",
    "DEFAULT_BASELINES",
    "BENCH_FILES",
    "PACKAGED_SETS",
    "RANDOM_SHAPES",
    "OracleDecoder",
    "OracleDrafts",
    "OracleProposer",
    "benchmark",
    "build_random_models",
    "ceilings",
    "first_difference",
    "load_prompt_set",
    "machine_info",
    "oracle_generate",
    "plot",
    "random_prompts",
    "random_target_config",
    "to_markdown",
    "write_outputs",
]
