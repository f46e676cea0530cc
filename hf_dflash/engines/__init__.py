"""Serving engines beside transformers: vLLM, run from a virtualenv of its own (it pins an older transformers) as a
worker process kept alive across calls (`VLLMEngine`; the worker: `vllm_worker.py`). The benchmark's vLLM baseline
(`hf_dflash.bench.vllm`) and regeneration for training (`VLLMGenerator`: `prepare-data --engine vllm`) use it.
`examples/make_vllm_env.sh` builds that virtualenv; `HF_DFLASH_VLLM_PYTHON` (or `--vllm-python`) names its python."""

import json
import os
import subprocess
import tempfile
from pathlib import Path

import torch

WORKER = Path(__file__).with_name("vllm_worker.py")  # run by path: it imports nothing of hf-dflash
VLLM_PYTHON = "HF_DFLASH_VLLM_PYTHON"
VLLM_ARGS = "HF_DFLASH_VLLM_ARGS"  # JSON: more `vllm.LLM` arguments (tensor_parallel_size, gpu_memory_utilization...)


def vllm_python(python: str | None = None) -> str | None:
    """The python of the vLLM virtualenv: `python`, else `$HF_DFLASH_VLLM_PYTHON`, else None (no vLLM here)."""
    python = python or os.environ.get(VLLM_PYTHON)
    if python and not Path(python).is_file():
        raise FileNotFoundError(f"{python} (the vLLM virtualenv's python, {VLLM_PYTHON} or --vllm-python) does not "
                                "exist: build one with examples/make_vllm_env.sh")
    return python


def worker_environment(python: str, threads: int) -> dict:
    """The worker's environment: vLLM's CPU build on the first `threads` cores (as hf-dflash's timed runs pin their
    torch threads), a 2 GiB KV cache, and the OpenMP runtime its CPU kernels were built against preloaded (without it
    the speculative decoding path failed to load on this CPU)."""
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}" if threads > 1 else "0",
               TOKENIZERS_PARALLELISM="false")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    iomp = Path(python).resolve().parent.parent / "lib" / "libiomp5.so"
    if iomp.is_file() and str(iomp) not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = ":".join(p for p in (str(iomp), env.get("LD_PRELOAD")) if p)
    return env


class VLLMEngine:
    """One vLLM `LLM` (the target, with `drafter` as its DFlash speculator or plain) in a worker process; `generate`
    sends a batch of prompts and returns the new tokens, the engine's seconds and its speculative counters. More
    `LLM` arguments come from `$HF_DFLASH_VLLM_ARGS` (JSON; on GPUs `{"tensor_parallel_size": 8}`). The worker's log
    goes to a file named in any error."""

    def __init__(self, python: str, target: str, drafter: str | None = None, num_speculative_tokens: int = 0, *,
                 dtype: str = "bfloat16", max_model_len: int = 2048, threads: int = 1, seed: int = 0):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="hf_dflash_vllm_", suffix=".log", delete=False)
        self.process = subprocess.Popen([python, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.log, text=True, env=worker_environment(python, threads))
        settings = dict(target=str(target), drafter=None if drafter is None else str(drafter), dtype=dtype,
                        num_speculative_tokens=num_speculative_tokens, max_model_len=max_model_len, seed=seed,
                        engine_args=json.loads(os.environ.get(VLLM_ARGS, "{}")))
        self._send(settings)

    def _send(self, message: dict) -> dict:
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            raise RuntimeError(f"The vLLM worker exited ({self.process.returncode}): its log is {self.log.name}\n"
                               + _tail(self.log.name))
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"vLLM: {answer['error']} (its log: {self.log.name})")
        return answer

    def generate(self, prompts: list[list[int]], max_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int | None = None) -> dict:
        """{"sequences": new token ids per prompt, "seconds", "drafts", "accepted"}; greedy at temperature 0."""
        return self._send({"prompts": prompts, "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p,
                           "seed": seed})

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.write("\n")
            self.process.stdin.flush()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def unpadded(input_ids: torch.LongTensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """Each row's tokens without its padding: what an engine that batches by itself is given."""
    return [ids[mask.bool()].tolist() for ids, mask in zip(input_ids.cpu(), attention_mask.cpu())]


def _tail(path: str, lines: int = 20) -> str:
    return "".join(Path(path).read_text(errors="replace").splitlines(keepends=True)[-lines:])


class VLLMGenerator:
    """A target's `generate` for `hf_dflash.training.prepare_data`, served by vLLM (`prepare-data --engine vllm`):
    the same left-padded ids in, the prompts and their responses out ([rows, width + new], padded), so regeneration
    keeps its chat template, sampling settings and resumability. vLLM batches the prompts itself (continuous
    batching; on GPUs its tensor parallelism through `$HF_DFLASH_VLLM_ARGS`). It computes no features: the store
    comes from `store-features` afterwards."""

    engine_name = "vllm"  # recorded in each sample's "generation"

    def __init__(self, engine: VLLMEngine, name_or_path: str, generation_config, seed: int = 0):
        self.engine, self.name_or_path, self.generation_config = engine, name_or_path, generation_config
        self.device, self.seed = torch.device("cpu"), seed

    @classmethod
    def load(cls, name_or_path: str, python: str | None, dtype: str = "auto", threads: int = 1,
             save_features=None) -> tuple:
        """(the generator, the target's tokenizer) for `prepare-data --engine vllm`, the target's weights in vLLM
        only."""
        from ..devices import resolve_dtype
        from ..packaged import load_for_engine

        if save_features:
            raise ValueError("prepare-data --engine vllm stores no features (vLLM gives no hidden states here): "
                             "leave out --save-features and run store-features on its output.")
        if not vllm_python(python):
            raise ValueError("--engine vllm: name a vLLM virtualenv's python (--vllm-python or "
                             f"${VLLM_PYTHON}; examples/make_vllm_env.sh builds one).")
        path, tokenizer, generation_config = load_for_engine(name_or_path)
        dtype = str(resolve_dtype(dtype)).removeprefix("torch.")  # "auto" as hf-dflash means it
        engine = VLLMEngine(vllm_python(python), path, dtype=dtype, threads=threads)
        return cls(engine, path, generation_config), tokenizer  # named as `load_target` names it

    def generate(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor, max_new_tokens: int,
                 do_sample: bool = False, pad_token_id: int = 0, temperature: float = 1.0, top_p: float = 1.0,
                 **kwargs) -> torch.LongTensor:
        if kwargs:
            raise ValueError(f"prepare-data --engine vllm cannot pass {sorted(kwargs)} (use the transformers engine)")
        prompts = unpadded(input_ids, attention_mask)
        self.seed += 1  # each batch its own draws, reproducible from the first seed
        out = self.engine.generate(prompts, max_new_tokens, temperature if do_sample else 0.0, top_p, self.seed)
        width = max(map(len, out["sequences"]), default=0)
        new = [row + [pad_token_id] * (width - len(row)) for row in out["sequences"]]
        return torch.cat([input_ids.cpu(), torch.tensor(new, dtype=torch.long).view(len(new), width)], dim=1)


__all__ = ["VLLMEngine", "VLLMGenerator", "VLLM_ARGS", "VLLM_PYTHON", "unpadded", "vllm_python"]
