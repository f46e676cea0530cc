#!/usr/bin/env bash
# The shipped drafter's speed tables (RESULTS.md's commands): plain `generate` against the chain and "auto" at block 8,
# greedy, batch 1, 128 new tokens, the five prompt sets; bfloat16 (8 prompts per set) and float32 (4) side by side, one
# per core, one torch thread each. About 1 h on 2 cores; nothing else may run meanwhile (it is a timing). Then the
# tables (results_tables.py) into $OUT/tables.md. With SHIP=1 the bench files replace the drafter folder's (bench.md,
# bench.png, bench_results.json; bench-float32/) and its model card is rendered from them. Run from the repository
# root in the set-up virtualenv:
#   OUT=/work/runs/smollm2/speed SHIP=1 bash examples/drafters/measure_speed.sh
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
if [ "${SHIP:-0}" = 1 ]; then
    mkdir -p "$D/bench-float32"
    for name in bench.md bench.png bench_results.json; do
        cp "$OUT/bench-bf16/$name" "$D/$name"
        cp "$OUT/bench-fp32/$name" "$D/bench-float32/$name"
    done
    hf-dflash card "$D" --results "$D/bench_results.json"
fi
