#!/usr/bin/env bash
# After evaluate_i.sh: drafter I replaces G as the shipped drafter if it accepts more on average over the five sets
# (the run of evaluate_i.sh, both drafters measured side by side); its bfloat16 weights and config go into the drafter
# folder with the training record, and I's log and acceptance into results-i/. Then measure the speed tables again
# (RESULTS.md's bench commands) and regenerate the card from the new bench (hf-dflash card DIR --results ...).
#   RUNS=/work/runs/smollm2 bash examples/drafters/ship_i.sh
set -euo pipefail
RUNS=${RUNS:-runs/smollm2}
OUT=examples/drafters/smollm2-135m-instruct-dflash
python - "$RUNS" "$OUT" <<'PY'
import json, shutil, sys
from pathlib import Path

runs, out = Path(sys.argv[1]), Path(sys.argv[2])
drafter_i, drafter_g = json.loads((runs / "acceptance_i_vs_g.json").read_text())["results"]
if drafter_i["mean"] <= drafter_g["mean"]:
    sys.exit(f"I accepts {drafter_i['mean']:.3f} on average, G {drafter_g['mean']:.3f}: I is not shipped")
results = Path("examples/drafters/results-i")
results.mkdir(exist_ok=True)
for name in ("train_log.jsonl", "training_args.json"):
    shutil.copyfile(runs / "i" / name, results / name)
for name in ("acceptance_i_vs_g.json", "acceptance_i_vs_g_turn2.json"):
    if (runs / name).is_file():
        shutil.copyfile(runs / name, results / name)
for name in ("config.json", "model.safetensors"):
    shutil.copyfile(runs / "i_bf16" / name, out / name)
record = json.loads((runs / "i" / "training_args.json").read_text())
log = [json.loads(line) for line in open(runs / "i" / "train_log.jsonl")]
window = record["logging_steps"]  # each log line times the `window` steps before it, across resumed runs too
record.update(
    output="i",
    train_seconds=round(sum(r["s_per_step"] * window for r in log if r["step"] <= record["max_steps"]), 1),
    data="G's 20,869 regenerated samples and 10,194 regenerated ShareGPT later turns, interleaved 2:1 (31,063; "
         "examples/drafters/data/, continue_h.sh), features from the store",
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
