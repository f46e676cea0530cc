"""`pipeline("text-generation", assistant_model=drafter)` runs DFlash and returns what the plain pipeline returns."""

import functools

import pytest
from transformers import pipeline

from hf_dflash.generation import loop

from conftest import make_drafter, make_target, make_tokenizer

PROMPTS = ["Hello", "abc", "xyz!!?", "Q"]


@pytest.fixture(scope="module")
def models():
    target = make_target("qwen3")
    return target, make_drafter(target, block_size=4), make_tokenizer()


@pytest.fixture
def dflash_runs(monkeypatch):
    """Counts the DFlash decoding loops that run."""
    calls = []
    original = loop.dflash_decode

    @functools.wraps(original)
    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(loop, "dflash_decode", counted)
    return calls


def texts(outputs):
    return [out[0]["generated_text"] if isinstance(out, list) else out["generated_text"] for out in outputs]


def test_greedy_matches_the_plain_pipeline(models, dflash_runs):
    target, drafter, tokenizer = models
    plain = pipeline("text-generation", model=target, tokenizer=tokenizer)
    fast = pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=drafter)
    assert fast.assistant_model is drafter
    expected = plain(PROMPTS[0], do_sample=False, max_new_tokens=12)
    assert fast(PROMPTS[0], do_sample=False, max_new_tokens=12) == expected
    assert dflash_runs == [1]
    assert len(expected[0]["generated_text"]) > len(PROMPTS[0])
    # the pipeline's default is sampling: that path runs too
    sampled = fast(PROMPTS[0], max_new_tokens=6)[0]["generated_text"]
    assert sampled.startswith(PROMPTS[0]) and len(dflash_runs) == 2


def test_batched_prompts(models, dflash_runs):
    target, drafter, tokenizer = models
    plain = pipeline("text-generation", model=target, tokenizer=tokenizer)
    fast = pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=drafter)
    kwargs = dict(do_sample=False, max_new_tokens=10, batch_size=2)
    assert texts(fast(PROMPTS, **kwargs)) == texts(plain(PROMPTS, **kwargs))
    assert len(dflash_runs) == 2  # 4 prompts in batches of 2


def test_stop_sequence(models, dflash_runs):
    target, drafter, tokenizer = models
    plain = pipeline("text-generation", model=target, tokenizer=tokenizer)
    fast = pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=drafter)
    full = plain(PROMPTS[1], do_sample=False, max_new_tokens=16, return_full_text=False)[0]["generated_text"]
    stop = full[5:7]  # ends at the 7th new token
    expected = plain(PROMPTS[1], do_sample=False, max_new_tokens=16, return_full_text=False, stop_sequence=stop)
    got = fast(PROMPTS[1], do_sample=False, max_new_tokens=16, return_full_text=False, stop_sequence=stop)
    assert got == expected
    assert got[0]["generated_text"].endswith(stop) and len(got[0]["generated_text"]) < len(full)
    assert dflash_runs == [1]


def test_assistant_model_per_call(models, dflash_runs):
    target, drafter, tokenizer = models
    plain = pipeline("text-generation", model=target, tokenizer=tokenizer)
    expected = plain(PROMPTS[2], do_sample=False, max_new_tokens=12)
    assert dflash_runs == []
    assert plain(PROMPTS[2], do_sample=False, max_new_tokens=12, assistant_model=drafter) == expected
    assert dflash_runs == [1]
