"""The benchmark's "vllm" baseline (`hf-dflash bench --baselines ... vllm`): vLLM beside plain `generate` and
hf-dflash, in the same run and table (`hf_dflash.engines`)."""

from pathlib import Path

from ..engines import VLLM_PYTHON, VLLMEngine, unpadded
from ..prompts import response_tokens


class VLLMBaselines:
    """The benchmark's "vllm" baseline: vLLM plain ("vllm") and vLLM with the run's drafter as its DFlash speculator at
    the same block ("vllm_dflash"), on the same prompts (padding stripped), dtype, cores and token budget, greedy. The
    drafter is written by `save_pretrained` first, as a user publishes it: the run checks that vLLM loads what
    hf-dflash saves. One engine each, started at its first prompt and kept."""

    names = ("vllm", "vllm_dflash")

    def __init__(self, python: str | None, target, drafters: dict, folder: Path, *, threads: int, max_new_tokens: int,
                 stop_ids: list[int]):
        self.python, self.target, self.drafters, self.folder = python, target, drafters, folder
        self.threads, self.max_new_tokens, self.stop_ids = threads, max_new_tokens, stop_ids
        self.engines = {}

    def unavailable(self) -> str | None:
        """Why vLLM cannot run here, or None."""
        if self.python is None:
            return f"no vLLM virtualenv ({VLLM_PYTHON} unset; examples/make_vllm_env.sh builds one)"
        if not self.target.name_or_path:
            return "the target has no folder or Hub id vLLM could load (a random target)"
        return None

    def engine(self, name: str, block: int) -> VLLMEngine:
        key = block if name == "vllm_dflash" else None
        if key not in self.engines:
            drafter = None
            if key is not None:
                drafter = self.folder / f"vllm-drafter-b{block}"
                self.drafters[block].save_pretrained(drafter)
            self.engines[key] = VLLMEngine(self.python, self.target.name_or_path, drafter, block - 1,
                                           dtype=str(self.target.dtype).removeprefix("torch."), threads=self.threads)
        return self.engines[key]

    def measure(self, name: str, inputs: dict, block: int, plain_rows: list) -> dict:
        """One prompt batch: new tokens, seconds, identity with plain's rows, and vLLM's speculative counters."""
        out = self.engine(name, block).generate(unpadded(inputs["input_ids"], inputs["attention_mask"]),
                                                self.max_new_tokens)
        rows = [response_tokens(row, self.stop_ids, self.max_new_tokens) for row in out["sequences"]]
        return {"new_tokens": sum(map(len, rows)), "seconds": out["seconds"], "identical": rows == plain_rows,
                "drafts": out["drafts"], "accepted": out["accepted"]}

    def close(self) -> None:
        for engine in self.engines.values():
            engine.close()


__all__ = ["VLLMBaselines"]
