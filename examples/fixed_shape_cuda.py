"""The fixed-shape path against plain `generate` at its best, on one GPU.

Random weights (nothing to download; the default):

    python examples/fixed_shape_cuda.py [--shape qwen3-8b] [--output-dir fixed_shape_cuda_out] [--auto]

A random-weight target of Qwen3-8B's shape and a matching random 5-layer drafter, bfloat16, block 16, batch 1 and 8,
128-token random prompts, 128 new tokens. It measures, in one run: plain `generate` eager and with a static cache
(compiled, as transformers compiles it on a GPU), DFlash on the general loop and on the compiled fixed-shape path,
the oracle on the fixed-shape path at batch 1 (always-right drafts: its speedup over plain at its best against the
ceiling timed with the same compiled forwards), and the host synchronisations per step of each DFlash path
(`torch.cuda.set_sync_debug_mode`). A random drafter's drafts are rejected, so the DFlash numbers are the loop's cost
per step, not a speedup a trained drafter would give; the oracle's are what a perfect drafter would give. Prints the
tables and writes OUTPUT_DIR/{general,fixed,oracle}/bench_results.json and OUTPUT_DIR/syncs.json; under 8 minutes on
one H100 / H200. `--auto` adds the shipped default, `draft_tree_size="auto"`, on the fixed-shape path at batch 1
(OUTPUT_DIR/fixed-auto): with drafts that never come true it should learn to verify no drafts and run about as fast
as plain at its best; it compiles one more graph per verification width (0, 3, 7, 15 and 31 drafts at block 16), so
run it after the rest has run once.

Real weights (local folders: a target, its trained drafter, a prompt file as `hf_dflash.prompts.read_prompts` reads
it), in stages:

    python examples/fixed_shape_cuda.py --target Qwen3-8B/ --drafter Qwen3-8B-DFlash-b16/ --prompts prompts.jsonl \
        [--stage 1] [--num-prompts 8] [--max-new-tokens 512] [--dtype bfloat16] [--output-dir ...]

Stage 1 (sized for under 5 minutes on an H100 with a warm inductor cache; not yet run on a GPU): batch 1, the chain on
the compiled fixed-shape path against plain `generate` with a compiled static cache. `--stage 2` then adds a fixed
tree (`--tree-size`) and "auto" at batch 1, and plain, the chain, the tree and "auto" at batch 8. Every call of a new
shape runs once untimed first (it compiles); the timed calls are timed with CUDA events. Reported per run: decode
tokens/s (new tokens after the first, over the call's time less its prefill's), acceptance length, host
synchronisations per step, and against plain greedy: identical rows, and where bfloat16 parts at a near-tie the first
differing position (float32: every row must be identical). Writes OUTPUT_DIR/real.json and prints a table.

    python examples/fixed_shape_cuda.py --shape tiny --device cpu --dtype float32   # the same code path on a CPU
    # (tests/test_bench.py runs both modes so, with --backend eager: inductor takes minutes on a CPU)
"""

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path

import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer
from transformers.cache_utils import StaticCache

import hf_dflash
from hf_dflash.bench import benchmark, build_random_models, first_difference, random_prompts, write_outputs
from hf_dflash.generation.kv_cache import cache_capacity
from hf_dflash.prompts import left_padded_batch, read_prompts, stop_ids


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen3-8b", help="random weights: the target's shape")
    parser.add_argument("--target", help="real weights: the target's folder")
    parser.add_argument("--drafter", help="real weights: the drafter's folder")
    parser.add_argument("--prompts", help="real weights: a prompt file (JSONL / JSON / text)")
    parser.add_argument("--stage", type=int, choices=(1, 2), default=1, help="real weights: 1, or 1 and 2")
    parser.add_argument("--tree-size", type=int, default=15, help="real weights: stage 2's fixed tree")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--num-prompts", type=int, default=None, help="default: 4 random, 8 real")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: 128 random, 512 real")
    parser.add_argument("--output-dir", default="fixed_shape_cuda_out")
    parser.add_argument("--backend", default="inductor", help="torch.compile's backend")
    parser.add_argument("--auto", action="store_true", help='random weights: also "auto" on the fixed-shape path')
    return parser.parse_args()


def compile_config_of(args, device):
    """`--backend` compiled on any device: CUDA graphs on a GPU with inductor, no mode with another backend."""
    mode = "reduce-overhead" if args.backend == "inductor" and device.type == "cuda" else None
    return hf_dflash.compile_everywhere(device, backend=args.backend, mode=mode)


def syncs_per_step(target, ids, generate_kwargs) -> float:
    """Host synchronisations per decoding step of one DFlash call (CUDA only; NaN elsewhere)."""
    if ids.device.type != "cuda":
        return float("nan")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = target.generate(ids, **{**generate_kwargs, "return_dict_in_generate": True})
        finally:
            torch.cuda.set_sync_debug_mode("default")
    synchronizing = [w for w in caught if "synchroniz" in str(w.message)]
    return len(synchronizing) / max(len(result.acceptance_lengths[0]), 1)


# --- random weights ----------------------------------------------------------------------------------------------
def random_weights(args, device, dtype) -> None:
    target, drafter = build_random_models(args.shape, device, dtype, block_size=16)
    prompts = {"random": random_prompts(args.num_prompts or 4, 128, target.config.vocab_size)}
    compile_config = compile_config_of(args, device)
    common = dict(block_sizes=[16], batch_sizes=[1, 8], max_new_tokens=args.max_new_tokens or 128,
                  draft_tree_sizes=[0], assistant_confidence_threshold=0.0, warmup=1, compile_config=compile_config,
                  progress=True)
    out = Path(args.output_dir)
    static = dict(baselines=("plain", "static"), cache_implementation="static")
    runs = [("general", dict(baselines=("plain", "static"))), ("fixed", static),
            ("oracle", dict(static, oracle=True, batch_sizes=[1]))]
    if args.auto:
        runs.append(("fixed-auto", dict(static, draft_tree_sizes=["auto"], batch_sizes=[1])))
    for name, settings in runs:
        results = benchmark(target, drafter, None, prompts, **{**common, **settings})
        write_outputs(results, out / name, make_plot=False)
        print(f"## DFlash on the {name} path\n\n{results['markdown']}")
    if device.type == "cuda":
        ids = torch.tensor(prompts["random"][:1], device=device)
        base = dict(max_new_tokens=args.max_new_tokens or 128, assistant_model=drafter, draft_tree_size=0,
                    assistant_confidence_threshold=0.0)
        syncs = {"general": syncs_per_step(target, ids, base),
                 "fixed": syncs_per_step(target, ids, dict(base, cache_implementation="static",
                                                           compile_config=compile_config))}
        if args.auto:
            syncs["fixed-auto"] = syncs_per_step(target, ids, dict(base, draft_tree_size="auto",
                                                                   cache_implementation="static",
                                                                   compile_config=compile_config))
        (out / "syncs.json").write_text(json.dumps(syncs, indent=1) + "\n")
        print(f"host synchronisations per step: {syncs}")


# --- real weights ------------------------------------------------------------------------------------------------
def seconds_of(fn, device) -> tuple:
    """`fn()` and its seconds: CUDA events on a GPU (the device's time, no host sync inside), else the wall clock."""
    if device.type != "cuda":
        began = time.perf_counter()
        return fn(), time.perf_counter() - began
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    out = fn()
    end.record()
    end.synchronize()
    return out, start.elapsed_time(end) / 1000


def real_weights(args, device, dtype) -> None:
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).to(device).eval()
    drafter = AutoModel.from_pretrained(args.drafter).to(device=device, dtype=dtype).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.target, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    prompts = list(read_prompts(args.prompts, limit=args.num_prompts or 8))
    runs = [("plain", 1, None), ("chain", 1, 0)]
    if args.stage == 2:
        runs += [("tree", 1, args.tree_size), ("auto", 1, "auto"),
                 ("plain", 8, None), ("chain", 8, 0), ("tree", 8, args.tree_size), ("auto", 8, "auto")]
    bench = RealBench(target, drafter, tokenizer, args.max_new_tokens or 512, compile_config_of(args, device))
    results = []
    for name, batch_size, tree_size in runs:
        results.append(bench.run(name, batch_size, prompts, tree_size))
        print(_row(results[-1]), flush=True)
    if dtype == torch.float32:  # exact arithmetic: any difference is a bug, not a near-tie
        assert all(r["identical_rows"] == r["rows"] for r in results), "float32 output differs from plain greedy"
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    settings = {**{k: str(v) for k, v in vars(args).items()}, "torch": torch.__version__,
                "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type}
    (out / "real.json").write_text(json.dumps({"settings": settings, "runs": results}, indent=1) + "\n")


class RealBench:
    """Plain `generate` with a compiled static cache, and DFlash on the compiled fixed-shape path, over batches of
    prompts; plain's run of a batch size comes first (its tokens and prefill time are the others' reference)."""

    def __init__(self, target, drafter, tokenizer, max_new_tokens: int, compile_config):
        self.target, self.drafter, self.tokenizer = target, drafter, tokenizer
        self.max_new_tokens, self.compile_config = max_new_tokens, compile_config
        self.stops = stop_ids(target, tokenizer)
        self.warm = set()
        self.plain_rows, self.prefills = {}, {}  # (batch size, batch index) -> plain's new tokens, prefill seconds

    def call(self, inputs, tree_size, max_new_tokens):
        """One `generate` call: plain (`tree_size` None) with a static cache as long as the fixed-shape path's (both
        sides of the comparison read caches of one length), else DFlash on the fixed-shape path."""
        settings = dict(max_new_tokens=max_new_tokens, do_sample=False, compile_config=self.compile_config)
        if tree_size is None:
            capacity = cache_capacity(inputs["input_ids"].shape[1] + self.max_new_tokens)
            return self.target.generate(**inputs, **settings,
                                        cache=StaticCache(config=self.target.config, max_cache_len=capacity))
        return self.target.generate(**inputs, **settings, assistant_model=self.drafter, draft_tree_size=tree_size,
                                    cache_implementation="static", assistant_confidence_threshold=0.0,
                                    return_dict_in_generate=True)

    def run(self, name: str, batch_size: int, prompts: list, tree_size) -> dict:
        device = self.target.device
        batches = [prompts[i : i + batch_size] for i in range(0, len(prompts), batch_size)]
        record = {"run": name, "batch_size": batch_size, "draft_tree_size": tree_size, "new_tokens": 0,
                  "seconds": 0.0, "prefill_seconds": 0.0, "steps": 0, "identical_rows": 0, "rows": 0,
                  "first_differences": []}
        for index, batch in enumerate(batches):
            key = (batch_size, index)
            inputs = left_padded_batch(batch, self.tokenizer, self.tokenizer.pad_token_id, device)
            prompt_len = inputs["input_ids"].shape[1]
            shape = (name, len(batch), cache_capacity(prompt_len + self.max_new_tokens))
            if shape not in self.warm:  # compiling is no call's cost
                self.warm.add(shape)
                self.call(inputs, tree_size, self.max_new_tokens)
            out, seconds = seconds_of(lambda: self.call(inputs, tree_size, self.max_new_tokens), device)  # noqa: B023
            sequences = out if tree_size is None else out.sequences
            rows = [_new(row, prompt_len, self.stops) for row in sequences.tolist()]
            if tree_size is None:  # the prompt's forward, the same in every run: its time is no decoding's
                self.plain_rows[key] = rows
                self.prefills[key] = seconds_of(lambda: self.call(inputs, None, 1), device)[1]  # noqa: B023
            else:
                record["steps"] += max(len(steps) for steps in out.acceptance_lengths)
                differences = [first_difference(plain, mine) for mine, plain in zip(rows, self.plain_rows[key],
                                                                                      strict=True)]
                record["identical_rows"] += differences.count(None)
                record["first_differences"] += [d for d in differences if d is not None]
                record["rows"] += len(rows)
            record["new_tokens"] += sum(len(row) - 1 for row in rows)  # after the prefill's token
            record["seconds"] += seconds
            record["prefill_seconds"] += self.prefills[key]
        record["decode_tokens_per_second"] = record["new_tokens"] / (record["seconds"] - record["prefill_seconds"])
        if tree_size is not None:
            batch_of_one = batch_size == 1  # tokens per step of the batch's rows: tau at batch 1 only
            record["acceptance_length"] = record["new_tokens"] / max(record["steps"], 1) if batch_of_one else None
            ids = left_padded_batch(batches[0][:1], self.tokenizer, self.tokenizer.pad_token_id, device)["input_ids"]
            record["syncs_per_step"] = syncs_per_step(self.target, ids, dict(
                max_new_tokens=self.max_new_tokens, assistant_model=self.drafter, draft_tree_size=tree_size,
                cache_implementation="static", assistant_confidence_threshold=0.0, compile_config=self.compile_config))
        return record


def _new(row: list[int], prompt_len: int, stops: list[int]) -> list[int]:
    """A row's new tokens up to and with its first stop token."""
    new = row[prompt_len:]
    ends = [i for i, token in enumerate(new) if token in stops]
    return new[: ends[0] + 1] if ends else new


def _row(record: dict) -> str:
    differences = record["first_differences"]
    parted = f", first difference median {statistics.median(differences)}" if differences else ""
    extra = "" if record["draft_tree_size"] is None else (
        f", identical {record['identical_rows']}/{record['rows']}{parted}, tau {record['acceptance_length']}, "
        f"syncs/step {record['syncs_per_step']:.2f}")
    return (f"{record['run']:>6} batch {record['batch_size']}: {record['decode_tokens_per_second']:.1f} decode "
            f"tokens/s{extra}")


def main() -> None:
    args = parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if args.target or args.drafter or args.prompts:
        if not (args.target and args.drafter and args.prompts):
            raise SystemExit("Real weights need --target, --drafter and --prompts (folders and a prompt file).")
        real_weights(args, device, dtype)
    else:
        random_weights(args, device, dtype)


if __name__ == "__main__":
    main()
