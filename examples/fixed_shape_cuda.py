"""The fixed-shape path against plain `generate` at its best, on one GPU, without downloading weights.

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

    python examples/fixed_shape_cuda.py --shape tiny --device cpu --dtype float32   # the same code path on a CPU
    # (tests/test_bench.py runs that with --backend eager: compiling with inductor takes minutes on a CPU)
"""

import argparse
import json
import warnings
from pathlib import Path

import torch
from transformers import CompileConfig

from hf_dflash.bench import benchmark, build_random_models, random_prompts, write_outputs

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--shape", default="qwen3-8b")
parser.add_argument("--device", default="cuda")
parser.add_argument("--dtype", default="bfloat16")
parser.add_argument("--num-prompts", type=int, default=4)
parser.add_argument("--max-new-tokens", type=int, default=128)
parser.add_argument("--output-dir", default="fixed_shape_cuda_out")
parser.add_argument("--backend", default="inductor", help="torch.compile's backend")
parser.add_argument("--auto", action="store_true", help='also "auto" on the fixed-shape path, batch 1')
args = parser.parse_args()

device, dtype = torch.device(args.device), getattr(torch, args.dtype)
target, drafter = build_random_models(args.shape, device, dtype, block_size=16)
prompts = {"random": random_prompts(args.num_prompts, 128, target.config.vocab_size)}
mode = ("reduce-overhead" if device.type == "cuda" else "default") if args.backend == "inductor" else None
compile_config = CompileConfig(backend=args.backend, mode=mode)
compile_config._compile_all_devices = True  # a CPU run compiles too, so that it checks the same path
common = dict(block_sizes=[16], batch_sizes=[1, 8], max_new_tokens=args.max_new_tokens, draft_tree_sizes=[0],
              assistant_confidence_threshold=0.0, warmup=1, compile_config=compile_config, progress=True)
out = Path(args.output_dir)
for name, settings in (("general", dict(baselines=("plain", "static"))),
                       ("fixed", dict(baselines=("plain", "static"), cache_implementation="static")),
                       ("oracle", dict(baselines=("plain", "static"), cache_implementation="static", oracle=True,
                                       batch_sizes=[1])),
                       *([("fixed-auto", dict(baselines=("plain", "static"), cache_implementation="static",
                                              draft_tree_sizes=["auto"], batch_sizes=[1]))] if args.auto else [])):
    results = benchmark(target, drafter, None, prompts, **{**common, **settings})
    write_outputs(results, out / name, make_plot=False)
    print(f"## DFlash on the {name} path\n\n{results['markdown']}")


def syncs_per_step(draft_tree_size=0, **kwargs) -> float:
    """Host synchronisations per decoding step of one batch-1 DFlash call (CUDA only)."""
    ids = torch.tensor(prompts["random"][:1], device=device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = target.generate(ids, max_new_tokens=args.max_new_tokens, assistant_model=drafter,
                                     draft_tree_size=draft_tree_size, assistant_confidence_threshold=0.0,
                                     return_dict_in_generate=True, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    synchronizing = [w for w in caught if "synchroniz" in str(w.message)]
    return len(synchronizing) / max(len(result.acceptance_lengths[0]), 1)


if device.type == "cuda":
    syncs = {"general": syncs_per_step(),
             "fixed": syncs_per_step(cache_implementation="static", compile_config=compile_config)}
    if args.auto:
        syncs["fixed-auto"] = syncs_per_step("auto", cache_implementation="static", compile_config=compile_config)
    (out / "syncs.json").write_text(json.dumps(syncs, indent=1) + "\n")
    print(f"host synchronisations per step: {syncs}")
