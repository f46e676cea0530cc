#!/usr/bin/env bash
# The oracle benchmark on one CUDA GPU, without downloading weights: a random-weight target of Qwen3-8B's shape in
# bfloat16 with a matching random 5-layer drafter, block 16, batch 1 and 8. The drafter runs every step as a trained
# one would, then the target's own greedy continuation replaces its drafts (always right), so the run measures the
# loop's speedup over plain generate against the ceiling 16 x t(1) / t(16), the target's forwards timed in the same
# run (hf-dflash README, "Benchmark").
#
#   bash examples/oracle_cuda.sh [OUTPUT_DIR]      # default: oracle_cuda_out
#
# Writes OUTPUT_DIR/bench_results.json (everything, machine info included) and OUTPUT_DIR/bench.md (the tables; the
# oracle table is the one to read). A few minutes on an H100/H200; under 30 GB of GPU memory at batch 8.
# SHAPE=tiny DEVICE=cpu DTYPE=float32 bash examples/oracle_cuda.sh /tmp/o  checks the script on a CPU in seconds.
set -euo pipefail
out="${1:-oracle_cuda_out}"
python -m hf_dflash bench --random-target "${SHAPE:-qwen3-8b}" --device "${DEVICE:-cuda}" --dtype "${DTYPE:-bfloat16}" --oracle \
    --block-sizes 16 --batch-sizes 1 8 --num-prompts 8 --prompt-tokens 128 --max-new-tokens 256 \
    --baselines plain --threads 1 --warmup 1 --no-plot --output-dir "$out"
echo "results: $out/bench.md, $out/bench_results.json"
