"""Where hf-dflash keeps and finds files outside a model folder: its cache folder and the benchmark's prompt sets."""

import os
from pathlib import Path

BENCH_DIR_VARIABLE = "HF_DFLASH_BENCH_DIR"


def cache_dir(*parts: str) -> Path:
    """hf-dflash's cache folder, joined with `parts`: `$HF_DFLASH_CACHE`, else `$HF_HOME/hf_dflash`, else
    `$XDG_CACHE_HOME/hf_dflash`, else `~/.cache/hf_dflash`. It holds the packaged models converted on first use
    (`packaged/`) and the targets' measured forward costs (`forward_costs/`)."""
    if os.environ.get("HF_DFLASH_CACHE"):
        root = Path(os.environ["HF_DFLASH_CACHE"]).expanduser()
    elif os.environ.get("HF_HOME"):
        root = Path(os.environ["HF_HOME"]).expanduser() / "hf_dflash"
    else:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "hf_dflash"
    return root.joinpath(*parts)


def bench_dir(folder: str | os.PathLike | None = None) -> Path | None:
    """The folder holding the benchmark's named prompt set files: `folder` when given, else `$HF_DFLASH_BENCH_DIR`,
    else None."""
    if folder is not None:
        return Path(folder).expanduser()
    value = os.environ.get(BENCH_DIR_VARIABLE)
    return Path(value).expanduser() if value else None
