#!/usr/bin/env bash
# The shipped drafter's speed tables (RESULTS.md's commands): plain `generate` against the chain and "auto" at block 8,
# greedy, batch 1, 128 new tokens, the five prompt sets; bfloat16 (8 prompts per set) and float32 (4) side by side, one
# per core, one torch thread each. About 15-20 min on the 2-core EPYC; nothing else may run meanwhile (a timing).
# Then the tables (results_tables.py) into $OUT/tables.md; ship_drafter.sh puts the bench files in the drafter folder.
# Run from the repository root in the set-up virtualenv:
#   D=examples/drafters/results-j/drafter OUT=/work/runs/smollm2/speed_j bash examples/drafters/measure_speed.sh
# Arguments after the script's name go to both benches, last (a smoke check: ... measure_speed.sh --num-prompts 1
# --max-new-tokens 8 --sets gsm8k).
set -euo pipefail
D=${D:-examples/drafters/smollm2-135m-instruct-dflash}
OUT=${OUT:-runs/speed}
S=(--sets gsm8k mbpp alpaca humaneval mtbench --max-new-tokens 128 --block-sizes 8 --assistant-confidence-threshold 0
   --baselines plain --threads 1 --draft-tree-sizes 0 auto)
mkdir -p "$OUT"
OMP_NUM_THREADS=1 hf-dflash bench --drafter "$D" "${S[@]}" --num-prompts 8 --dtype bfloat16 --output-dir "$OUT/bench-bf16" "$@" &
bf16=$!
OMP_NUM_THREADS=1 hf-dflash bench --drafter "$D" "${S[@]}" --num-prompts 4 --dtype float32 --output-dir "$OUT/bench-fp32" "$@"
wait "$bf16"
python examples/drafters/results_tables.py bf16="$OUT/bench-bf16/bench_results.json" \
    fp32="$OUT/bench-fp32/bench_results.json" | tee "$OUT/tables.md"
