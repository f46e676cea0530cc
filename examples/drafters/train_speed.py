"""Seconds per training step of `hf-dflash train` under each speed option alone and together, measured one
configuration after the other in fresh processes on the same data, steps and seed.

    python examples/drafters/train_speed.py --data DATA.jsonl --features STORE --out speed.json

DATA/STORE: written by `hf-dflash prepare-data ... --save-features STORE` (the store's layers are the drafter's).
Prints a markdown table: median seconds per step over the logged windows after the first (warm-up) window.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TARGET = "HuggingFaceTB/SmolLM2-135M-Instruct"
# the shipped drafter's shape: 2 layers, block 8, 2 sequences x 32 anchors per step
BASE = ["--num-layers", "2", "--target-layer-ids", "1", "14", "27", "--block-size", "8", "--num-anchors", "32",
        "--batch-size", "2", "--max-length", "512", "--logging-steps", "10", "--save-steps", "100000", "--seed", "0"]
CONFIGS = {  # name: (extra flags, torch threads, processes)
    "before: --cache-features, fp32, full-vocabulary loss, 1 thread": (["--cache-features", "--no-bf16"], 1, 1),
    "--features STORE (instead of --cache-features)": (["--features", "{store}", "--no-bf16"], 1, 1),
    "--draft-vocab-size 8192 (loss over the draft vocabulary)": (["--cache-features", "--no-bf16",
                                                                  "--draft-vocab-size", "8192"], 1, 1),
    "--bf16 (autocast)": (["--cache-features", "--bf16"], 1, 1),
    "2 threads": (["--cache-features", "--no-bf16"], 2, 1),
    "all: store + draft vocabulary + bf16, 1 thread": (["--features", "{store}", "--bf16", "--draft-vocab-size",
                                                        "8192"], 1, 1),
    "all, 2 threads": (["--features", "{store}", "--bf16", "--draft-vocab-size", "8192"], 2, 1),
    "all, 2 processes x 1 thread (accelerate, gloo)": (["--features", "{store}", "--bf16", "--draft-vocab-size",
                                                        "8192", "--batch-size", "1"], 1, 2),
}


def run(name, flags, threads, processes, args, workdir):
    out = Path(workdir) / f"run{abs(hash(name)) % 10**8}"
    flags = [f.replace("{store}", args.features) for f in flags]
    cmd = ["-m", "hf_dflash", "train", "--target", TARGET, "--data", args.data, "--output", str(out),
           "--max-steps", str(args.steps), "--threads", str(threads), *BASE, *flags]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if processes > 1:  # torchrun over gloo, told to stay on the CPU
        env["ACCELERATE_USE_CPU"] = "true"
        cmd = ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
               "--num_machines", "1", "--dynamo_backend", "no",
               "--mixed_precision", "bf16" if "--bf16" in flags else "no", *cmd]
    subprocess.run([sys.executable, *cmd], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = [json.loads(line) for line in open(out / "train_log.jsonl") if '"s_per_step"' in line]
    windows = [r["s_per_step"] for r in log[1:]]
    return {"name": name, "threads": threads, "processes": processes, "s_per_step": statistics.median(windows),
            "windows": windows, "loss_at_end": log[-1]["loss"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True)
    parser.add_argument("--features", required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--only", nargs="*", help="substrings of the configuration names to run")
    parser.add_argument("--out", default="train_speed.json")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as workdir:
        for name, (flags, threads, processes) in CONFIGS.items():
            if args.only and not any(s in name for s in args.only):
                continue
            results.append(run(name, flags, threads, processes, args, workdir))
            print(f"{results[-1]['s_per_step']:.3f} s/step  {name}", flush=True)
    base = results[0]["s_per_step"]
    print("\n| configuration | s / step | vs before |\n|---|---|---|")
    for r in results:
        print(f"| {r['name']} | {r['s_per_step']:.3f} | {base / r['s_per_step']:.2f}x |")
    Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
