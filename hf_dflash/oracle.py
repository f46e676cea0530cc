"""Moved: the oracle to `hf_dflash.bench.oracle`, random targets to `hf_dflash.bench.random_models`; this import path
stays for existing code."""

from .bench.oracle import OracleDecoder, OracleDrafts, OracleProposer, ceilings, oracle_generate
from .bench.random_models import RANDOM_SHAPES, build_random_models, random_prompts, random_target_config

__all__ = [
    "OracleDecoder", "OracleDrafts", "OracleProposer", "RANDOM_SHAPES", "build_random_models", "ceilings",
    "oracle_generate", "random_prompts", "random_target_config",
]
