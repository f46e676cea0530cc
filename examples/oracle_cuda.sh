#!/usr/bin/env bash
# The oracle benchmark on one CUDA GPU, without downloading weights: a random-weight target of Qwen3-8B's shape in
# float32 with a matching random 5-layer drafter, block 16, batch 1 and 8. The drafter runs every step as a trained
# one would, then the target's own greedy continuation replaces its drafts (always right), so the run measures the
# loop's speedup over plain generate against the ceiling 16 x t(1) / t(16), the target's forwards timed in the same
# run (docs/benchmark.md).
#
# Why float32: a random target's logits are nearly flat, and in bfloat16 a verification over 16 tokens rounds them
# differently from one-token forwards, so its argmax leaves the precomputed continuation at most steps (on an H200,
# 34 of 40 steps rejected an oracle draft: examples/drafters/oracle-cuda-h200/ at commit 39fc9e6, indexed in
# docs/results.md), and the run measures near-ties and the oracle's recomputations rather than the loop.
# DTYPE=bfloat16 runs it anyway.
#
#   bash examples/oracle_cuda.sh [OUTPUT_DIR]      # default: oracle_cuda_out
#
# Writes OUTPUT_DIR/bench_results.json (everything, machine info included) and OUTPUT_DIR/bench.md (the tables; the
# oracle table is the one to read). Needs the 33 GB of float32 weights plus activations in GPU memory.
# SHAPE=tiny DEVICE=cpu DTYPE=float32 bash examples/oracle_cuda.sh /tmp/o  checks the script on a CPU in seconds.
set -euo pipefail
out="${1:-oracle_cuda_out}"
python3 -m hf_dflash bench --random-target "${SHAPE:-qwen3-8b}" --device "${DEVICE:-cuda}" --dtype "${DTYPE:-float32}" --oracle \
    --block-sizes 16 --batch-sizes 1 8 --num-prompts 8 --prompt-tokens 128 --max-new-tokens 256 \
    --baselines plain --threads 1 --warmup 1 --no-plot --output-dir "$out"
echo "results: $out/bench.md, $out/bench_results.json"
