#!/usr/bin/env bash
# After continue_h.sh: drafter $NAME as it would ship (bfloat16 weights, draft_tree_size "auto", no confidence
# threshold; reproduce_smollm2.sh's last step for G) in $RUNS/${NAME}_bf16, then its acceptance against the shipped
# drafter (called $VS in the file names) as RESULTS.md measures drafters (float32 target, block 8, the chain, 16
# prompts of each of the five sets, 96 new tokens, one thread; ~25 min here), and on MT-Bench's second turns
# ("mtbench2" of eval_acceptance.py, apart: the five sets' mean stays comparable with earlier drafters'). Acceptance
# only, so it may run beside training. Run from the repository root in the set-up virtualenv, after training:
#   NAME=i VS=g RUNS=/work/runs/smollm2 bash examples/drafters/evaluate_drafter.sh   # I against G (2026-12-05)
#   NAME=j VS=i RUNS=/work/runs/smollm2 bash examples/drafters/evaluate_drafter.sh   # J against I
set -euo pipefail
RUNS=${RUNS:-runs/smollm2}
NAME=${NAME:?set NAME, the run in \$RUNS to evaluate (i, j, ...)}
VS=${VS:?set VS, the letter of the shipped drafter (for the file names)}
SHIPPED=examples/drafters/smollm2-135m-instruct-dflash
[ -s "$RUNS/$NAME/model.safetensors" ] || {
    echo "$RUNS/$NAME holds no finished drafter: run (or resume) examples/drafters/continue_h.sh first" >&2
    exit 1
}
python - "$RUNS/$NAME" "$RUNS/${NAME}_bf16" <<'PY'
import sys
import torch
from transformers import AutoModel
import hf_dflash  # noqa: F401  (registers the drafter with AutoModel)

trained, out = sys.argv[1:]
drafter = AutoModel.from_pretrained(trained, dtype=torch.bfloat16)
drafter.config.dflash_config.pop("assistant_confidence_threshold", None)
drafter.config.dflash_config["draft_tree_size"] = "auto"
drafter.save_pretrained(out)
print("wrote", out)
PY
OMP_NUM_THREADS=1 python examples/drafters/eval_acceptance.py "$RUNS/${NAME}_bf16" "$SHIPPED" \
    --sets gsm8k mbpp alpaca humaneval mtbench --num-prompts 16 --max-new-tokens 96 --block-size 8 \
    --dtype float32 --threads 1 --out "$RUNS/acceptance_${NAME}_vs_${VS}.json"
# multi-turn chat, what the later turns train: MT-Bench's second turns after the target's own first answer (~8 min)
OMP_NUM_THREADS=1 python examples/drafters/eval_acceptance.py "$RUNS/${NAME}_bf16" "$SHIPPED" \
    --sets mtbench2 --num-prompts 16 --max-new-tokens 96 --block-size 8 \
    --dtype float32 --threads 1 --out "$RUNS/acceptance_${NAME}_vs_${VS}_turn2.json"
