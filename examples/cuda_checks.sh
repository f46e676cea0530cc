#!/usr/bin/env bash
# The checks to run on a CUDA GPU. From the repository root on the GPU machine, with torch there (its own CUDA build):
#
#   OUT=cuda_checks_out bash examples/cuda_checks.sh        # ~5 minutes on an H100 / H200
#
# 1. tests/test_cuda.py (chain, trees, "auto", sampling and the bigram prior, token-identical to plain greedy on the
#    GPU in float64) and tests/test_bigram.py;
# 2. the training and feature-store tests, which train on the GPU there (accelerate picks it; bf16 autocast), except
#    the two-process one, which compares a CPU run over gloo with a single process that would now be on the GPU;
# 3. the float32 oracle at block 16 with 32- and 64-node trees beside the chain (random Qwen3-8B shape, batch 1,
#    2 prompts, 128 new tokens): what verifying a tree costs against the chain on a GPU.
# If the machine's transformers is older than the package needs, put the wheels of transformers and its newer
# dependencies in .whl/ (pip download --no-deps ...) and they are installed to /tmp/site first.
set -o pipefail
OUT=${OUT:-cuda_checks_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TOKENIZERS_PARALLELISM=false
case $(python3 -c "import transformers; print(transformers.__version__)") in
    5.2[4-9]* | 5.[3-9]*) ;;
    *) python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
           && export PYTHONPATH=/tmp/site:$PWD ;;
esac
python3 -c "import torch, transformers, accelerate; print(torch.__version__, transformers.__version__, accelerate.__version__, torch.cuda.get_device_name())" | tee "$OUT/versions.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_bigram.py 2>&1 | tail -15 | tee "$OUT/test_cuda.log"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_training.py tests/test_store.py -k "not two_process" \
    --durations=5 2>&1 | tail -40 | tee "$OUT/test_training_cuda.log"
timeout 200 python3 -m hf_dflash bench --random-target qwen3-8b --device cuda --dtype float32 --oracle \
    --block-sizes 16 --draft-tree-sizes 0 32 64 --batch-sizes 1 --num-prompts 2 --prompt-tokens 128 --max-new-tokens 128 \
    --baselines plain --threads 1 --warmup 1 --no-plot --output-dir "$OUT/oracle-trees" 2>&1 | grep -v "it/s\|s/it" | tail -30
