#!/usr/bin/env bash
# Drafter I, in two steps. `ship_i.sh stage`, after evaluate_i.sh: I's bfloat16 weights and config (as it would ship),
# training log and arguments and its acceptance against G go from $RUNS to examples/drafters/results-i/ (committed:
# the next session need not find $RUNS). Then measure I's speed tables (measure_speed.sh with
# D=examples/drafters/results-i/drafter) and run `ship_i.sh`: I replaces G in the drafter folder if it accepts more on
# average over the five sets (evaluate_i.sh measured both side by side), with its training record; then
# measure_speed.sh's SHIP=1 step (or its copy commands) puts I's bench files in the folder and renders the card.
#   RUNS=/work/runs/smollm2 bash examples/drafters/ship_i.sh stage
#   bash examples/drafters/ship_i.sh
set -euo pipefail
RUNS=${RUNS:-runs/smollm2}
OUT=examples/drafters/smollm2-135m-instruct-dflash
STAGE=examples/drafters/results-i
if [ "${1:-}" = stage ]; then
    mkdir -p "$STAGE/drafter"
    cp "$RUNS/i/train_log.jsonl" "$RUNS/i/training_args.json" "$RUNS/acceptance_i_vs_g.json" "$STAGE/"
    [ ! -s "$RUNS/acceptance_i_vs_g_turn2.json" ] || cp "$RUNS/acceptance_i_vs_g_turn2.json" "$STAGE/"
    cp "$RUNS/i_bf16/config.json" "$RUNS/i_bf16/model.safetensors" "$STAGE/drafter/"
    echo "staged I in $STAGE"
    exit 0
fi
python - "$STAGE" "$OUT" <<'PY'
import json, shutil, sys
from pathlib import Path

stage, out = Path(sys.argv[1]), Path(sys.argv[2])
drafter_i, drafter_g = json.loads((stage / "acceptance_i_vs_g.json").read_text())["results"]
if drafter_i["mean"] <= drafter_g["mean"]:
    sys.exit(f"I accepts {drafter_i['mean']:.3f} on average, G {drafter_g['mean']:.3f}: I is not shipped")
for name in ("config.json", "model.safetensors"):
    shutil.copyfile(stage / "drafter" / name, out / name)
record = json.loads((stage / "training_args.json").read_text())
log = [json.loads(line) for line in open(stage / "train_log.jsonl")]
window = record["logging_steps"]  # each log line times the `window` steps before it, across resumed runs too
record.update(
    output="i",
    train_seconds=round(sum(r["s_per_step"] * window for r in log if r["step"] <= record["max_steps"]), 1),
    data="G's 20,869 regenerated samples and 10,194 regenerated ShareGPT later turns, interleaved 2:1 (31,063, "
         "30,134 of them long enough to train on; examples/drafters/data/, continue_h.sh), features from the store",
    init_from="G as shipped (44,200 steps since drafter C; G's own record is in git history)",
    runs="C -> D1 -> D2 -> E -> F -> G (44,200 steps, RESULTS.md) -> I (31,063 samples, 20,000 steps, cosine from "
         "lr 2e-4, two threads)",
    total_steps=44200 + record["max_steps"],
    draft_tree_size_shipped='"auto": per step, the tree size that maximises expected tokens per second from the '
                            "target's forward costs measured on the user's machine",
    machine="2-core AMD EPYC (AVX512-BF16, no AMX), no GPU, 2 torch threads",
    shipped_dtype="bfloat16 (trained with bf16 autocast, fp32 master weights)",
    acceptance_i_and_g={k: [round(drafter_i[k], 3), round(drafter_g[k], 3)]
                        for k in drafter_i if k not in ("drafter", "block_size")},
)
(out / "training_args.json").write_text(json.dumps(record, indent=2))
print(f"shipped I: acceptance {drafter_i['mean']:.3f} against G's {drafter_g['mean']:.3f}")
PY
