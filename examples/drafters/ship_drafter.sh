#!/usr/bin/env bash
# Ship a trained drafter ($NAME, trained by continue_h.sh, evaluated by evaluate_drafter.sh against the shipped $VS),
# in two steps:
# 1. `ship_drafter.sh stage`: $NAME's bfloat16 weights and config (as it would ship), training log and arguments and
#    its acceptance against $VS go from $RUNS to examples/drafters/results-$NAME/ (committed: the next session need
#    not find $RUNS). Then measure its speed: measure_speed.sh with D=examples/drafters/results-$NAME/drafter.
# 2. `SPEED=<measure_speed.sh's OUT> ship_drafter.sh`: if $NAME accepts more than $VS on average over the five sets,
#    $VS's record and bench files move to results-$VS/, $NAME's weights, config and training record (extending
#    $VS's: steps, runs) and the bench files from $SPEED go into the drafter folder, and the card is rendered.
#   NAME=j VS=i RUNS=/work/runs/smollm2 bash examples/drafters/ship_drafter.sh stage
#   NAME=j VS=i SPEED=/work/runs/smollm2/speed_j bash examples/drafters/ship_drafter.sh
# DATA (a sentence) describes the training data when it differs from $VS's. Drafter I shipped this way on 2026-12-05
# (then one I-specific script; its record: the drafter folder's training_args.json).
set -euo pipefail
RUNS=${RUNS:-runs/smollm2}
NAME=${NAME:?set NAME, the run to ship (j, ...)}
VS=${VS:?set VS, the letter of the shipped drafter}
OUT=examples/drafters/smollm2-135m-instruct-dflash
STAGE=examples/drafters/results-$NAME
if [ "${1:-}" = stage ]; then
    mkdir -p "$STAGE/drafter"
    cp "$RUNS/$NAME/train_log.jsonl" "$RUNS/$NAME/training_args.json" "$RUNS/acceptance_${NAME}_vs_$VS.json" "$STAGE/"
    [ ! -s "$RUNS/acceptance_${NAME}_vs_${VS}_turn2.json" ] || cp "$RUNS/acceptance_${NAME}_vs_${VS}_turn2.json" "$STAGE/"
    cp "$RUNS/${NAME}_bf16/config.json" "$RUNS/${NAME}_bf16/model.safetensors" "$STAGE/drafter/"
    echo "staged $NAME in $STAGE"
    exit 0
fi
SPEED=${SPEED:?set SPEED, the OUT folder of measure_speed.sh run on $STAGE/drafter}
[ -s "$SPEED/bench-bf16/bench_results.json" ] && [ -s "$SPEED/bench-fp32/bench_results.json" ] || {
    echo "$SPEED lacks bench-bf16/ or bench-fp32/: run measure_speed.sh with D=$STAGE/drafter OUT=$SPEED first" >&2
    exit 1
}
python - "$STAGE" "$OUT" "$NAME" "$VS" "${DATA:-}" <<'PY'
import json, shutil, sys
from pathlib import Path

stage, out, name, vs, data = Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:]
new, shipped = json.loads((stage / f"acceptance_{name}_vs_{vs}.json").read_text())["results"]
if new["mean"] <= shipped["mean"]:
    sys.exit(f"{name} accepts {new['mean']:.3f} on average, {vs} {shipped['mean']:.3f}: {name} is not shipped")
previous = json.loads((out / "training_args.json").read_text())
archive = out.parent / f"results-{vs}"
archive.mkdir(exist_ok=True)
shutil.copyfile(out / "training_args.json", archive / "training_args_shipped.json")
for bench in ("bench.md", "bench.png", "bench_results.json", "bench-float32"):
    if (out / bench).exists():
        shutil.move(out / bench, archive / bench)
for file in ("config.json", "model.safetensors"):
    shutil.copyfile(stage / "drafter" / file, out / file)
record = json.loads((stage / "training_args.json").read_text())
log = [json.loads(line) for line in open(stage / "train_log.jsonl")]
window = record["logging_steps"]  # each log line times the `window` steps before it, across resumed runs too
total = previous["total_steps"] + record["max_steps"]
record.update(
    output=name,
    train_seconds=round(sum(r["s_per_step"] * window for r in log if r["step"] <= record["max_steps"]), 1),
    data=data or previous["data"],
    init_from=f"{vs.upper()} as shipped ({previous['total_steps']:,} steps in all; its record: "
              f"examples/drafters/results-{vs}/training_args_shipped.json)",
    runs=f"{previous['runs']} -> {name.upper()} ({record['samples'] + record['dropped_short']:,} samples, "
         f"{record['max_steps']:,} steps, cosine from lr {record['learning_rate']:g}, {record['threads']} threads)",
    total_steps=total,
    draft_tree_size_shipped=previous["draft_tree_size_shipped"],
    machine=previous["machine"],
    shipped_dtype=previous["shipped_dtype"],
    **{f"acceptance_{name}_and_{vs}": {k: [round(new[k], 3), round(shipped[k], 3)]
                                       for k in new if k not in ("drafter", "block_size")}},
)
(out / "training_args.json").write_text(json.dumps(record, indent=2))
print(f"shipped {name}: acceptance {new['mean']:.3f} against {vs}'s {shipped['mean']:.3f}, {total:,} steps in all")
PY
mkdir -p "$OUT/bench-float32"
for file in bench.md bench.png bench_results.json; do
    cp "$SPEED/bench-bf16/$file" "$OUT/$file"
    cp "$SPEED/bench-fp32/$file" "$OUT/bench-float32/$file"
done
hf-dflash card "$OUT" --results "$OUT/bench_results.json"
