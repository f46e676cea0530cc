#!/usr/bin/env bash
# The loss comparison of the README (Training, Losses): ce / dpace / lk on the same data, steps and seed, then the
# acceptance length of each with generate on held-out prompts. Run from the repository root in the set-up
# virtualenv after steps 1-2 of reproduce_smollm2.sh (RUNS/data.jsonl and RUNS/store, with --target-topk 16).
set -euo pipefail
RUNS=${RUNS:-runs/smollm2}
OUT=${OUT:-runs/loss}
mkdir -p "$OUT"
head -1024 "$RUNS/data.jsonl" > "$OUT/data_1k.jsonl"
for loss in ce dpace lk; do
  OMP_NUM_THREADS=1 hf-dflash train --target HuggingFaceTB/SmolLM2-135M-Instruct --data "$OUT/data_1k.jsonl" \
    --features "$RUNS/store" --output "$OUT/$loss" --num-layers 2 --target-layer-ids 1 14 27 --block-size 8 \
    --num-anchors 32 --batch-size 2 --max-length 512 --max-steps 1500 --learning-rate 1e-3 --draft-vocab-size 8192 \
    --threads 1 --loss "$loss" --logging-steps 50 --save-steps 500 --seed 0 --resume
done
OMP_NUM_THREADS=1 python examples/drafters/eval_acceptance.py "$OUT/ce" "$OUT/dpace" "$OUT/lk" \
  --sets gsm8k mbpp alpaca --num-prompts 8 --max-new-tokens 96 --block-size 8 --out "$OUT/acceptance.json"
