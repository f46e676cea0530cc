#!/usr/bin/env bash
# After continue_h.sh: drafter I as it would ship (bfloat16 weights, draft_tree_size "auto", no confidence threshold;
# reproduce_smollm2.sh's last step for G) in $RUNS/i_bf16, then its acceptance against the shipped G as RESULTS.md
# measures drafters (float32 target, block 8, the chain, 16 prompts of each of the five sets, 96 new tokens, one
# thread; ~25 min here), and on MT-Bench's second turns ("mtbench2" of eval_acceptance.py, apart: the five sets' mean
# stays comparable with earlier drafters'). Run from the repository root in the set-up virtualenv, after training:
#   RUNS=/work/runs/smollm2 bash examples/drafters/evaluate_i.sh
set -euo pipefail
RUNS=${RUNS:-runs/smollm2}
G=examples/drafters/smollm2-135m-instruct-dflash
[ -s "$RUNS/i/model.safetensors" ] || {
    echo "$RUNS/i holds no finished drafter: run (or resume) examples/drafters/continue_h.sh first" >&2
    exit 1
}
python - "$RUNS/i" "$RUNS/i_bf16" <<'PY'
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
OMP_NUM_THREADS=1 python examples/drafters/eval_acceptance.py "$RUNS/i_bf16" "$G" \
    --sets gsm8k mbpp alpaca humaneval mtbench --num-prompts 16 --max-new-tokens 96 --block-size 8 \
    --dtype float32 --threads 1 --out "$RUNS/acceptance_i_vs_g.json"
# multi-turn chat, what the later turns train: MT-Bench's second turns after the target's own first answer (~8 min)
OMP_NUM_THREADS=1 python examples/drafters/eval_acceptance.py "$RUNS/i_bf16" "$G" \
    --sets mtbench2 --num-prompts 16 --max-new-tokens 96 --block-size 8 \
    --dtype float32 --threads 1 --out "$RUNS/acceptance_i_vs_g_turn2.json"
