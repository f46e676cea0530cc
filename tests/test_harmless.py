"""The hooks change nothing outside DFlash drafters: every other generate path gives the same output with the hooks
installed as with transformers' own functions, and the native DFlash path still works with our drafter."""

import importlib

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM, GenerationMixin, Qwen3ForCausalLM, Qwen3Model

import hf_dflash
from hf_dflash import DFlashDraftModel
from hf_dflash.generation import hooks, loop

from conftest import left_padded, make_drafter, make_target


def with_and_without_hooks(call):
    """(output with the hooks installed, output after uninstall_hooks()); each call starts from the same seed."""
    torch.manual_seed(0)
    hooked = call()
    hf_dflash.uninstall_hooks()
    try:
        assert GenerationMixin.generate is hooks.original_generate
        torch.manual_seed(0)
        unhooked = call()
    finally:
        hf_dflash.install_hooks()
    return hooked, unhooked


@pytest.mark.parametrize("do_sample", [False, True])
def test_plain_generate(do_sample):
    target = make_target("qwen3")
    ids, mask = left_padded(3)
    hooked, unhooked = with_and_without_hooks(
        lambda: target.generate(ids, attention_mask=mask, do_sample=do_sample, max_new_tokens=10)
    )
    assert torch.equal(hooked, unhooked)


def test_autoregressive_assistant():
    target = make_target("qwen3")
    assistant = make_target("qwen3", seed=5, num_hidden_layers=1)
    ids, _ = left_padded(1)
    plain = target.generate(ids, do_sample=False, max_new_tokens=12)
    hooked, unhooked = with_and_without_hooks(
        lambda: target.generate(ids, do_sample=False, max_new_tokens=12, assistant_model=assistant)
    )
    assert torch.equal(hooked, unhooked)
    assert torch.equal(hooked, plain)


def test_prompt_lookup():
    target = make_target("qwen3")
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])  # repeated n-grams for the lookup to find
    plain = target.generate(ids, do_sample=False, max_new_tokens=12)
    hooked, unhooked = with_and_without_hooks(
        lambda: target.generate(ids, do_sample=False, max_new_tokens=12, prompt_lookup_num_tokens=3)
    )
    assert torch.equal(hooked, unhooked)
    assert torch.equal(hooked, plain)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_native_dflash_path_with_our_drafter(arch):
    """`speculation_type="dflash"` selects transformers' own DFlash loop; the hook must let it through, and our
    drafter's forward must satisfy that loop's contract (greedy output == plain greedy)."""
    target = make_target(arch)
    drafter = make_drafter(target, block_size=5)
    ids, _ = left_padded(1)
    plain = target.generate(ids, do_sample=False, max_new_tokens=15)
    hooked, unhooked = with_and_without_hooks(
        lambda: target.generate(
            ids, do_sample=False, max_new_tokens=15, assistant_model=drafter, speculation_type="dflash"
        )
    )
    assert torch.equal(hooked, plain)
    assert torch.equal(unhooked, plain)


def test_native_loop_drafts_like_ours():
    """Fed through the native contract (context via its own cache, noise embeddings from the target's embedding
    module), the drafter computes the same draft hidden states as in our loop. The random drafter is never
    accepted, so both loops draft from the same contexts step by step; only the last blocks differ in length."""
    target = make_target("gemma3")  # scaled embeddings: the native loop embeds with the target's module
    drafter = make_drafter(target, block_size=5)
    ids, _ = left_padded(1)
    drafts = []
    drafter.register_forward_hook(lambda module, args, out: drafts.append(out.last_hidden_state))
    target.generate(ids, do_sample=False, max_new_tokens=15, assistant_model=drafter)
    ours = drafts[:]
    drafts.clear()
    target.generate(ids, do_sample=False, max_new_tokens=15, assistant_model=drafter, speculation_type="dflash")
    full = [(a, b) for a, b in zip(ours, drafts) if a.shape == b.shape]
    assert len(full) >= 10
    for a, b in full:
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_native_path_is_not_intercepted(monkeypatch):
    calls = []
    monkeypatch.setattr(hooks, "generate", lambda *a, **k: calls.append(1))
    target = make_target("qwen3")
    drafter = make_drafter(target)
    ids, _ = left_padded(1)
    target.generate(ids, do_sample=False, max_new_tokens=3, assistant_model=drafter, speculation_type="dflash")
    assert calls == []
    target.generate(ids, do_sample=False, max_new_tokens=3, assistant_model=drafter)
    assert calls == [1]


def test_install_hooks_is_idempotent():
    hf_dflash.install_hooks()
    generate, from_pretrained = GenerationMixin.generate, AutoModel.from_pretrained.__func__
    hf_dflash.install_hooks()
    assert GenerationMixin.generate is generate
    assert AutoModel.from_pretrained.__func__ is from_pretrained
    assert GenerationMixin.generate.__wrapped__ is hooks.original_generate  # one layer of wrapping
    assert not getattr(hooks.original_generate, "_hf_dflash_hook", False)


def test_reimported_hooks_do_not_wrap_themselves():
    original = hooks.original_generate
    hf_dflash.install_hooks()
    importlib.reload(loop)  # captures `GenerationMixin.generate` while it is the installed hook
    module = importlib.reload(hooks)
    try:
        assert module.original_generate is original
        module.install_hooks()
        assert GenerationMixin.generate.__wrapped__ is original
    finally:
        module.uninstall_hooks()
        assert GenerationMixin.generate is original
        module.install_hooks()


def test_auto_model_loads_plain_checkpoints_as_usual(tmp_path):
    target = make_target("qwen3")
    target.save_pretrained(tmp_path)
    assert type(AutoModel.from_pretrained(tmp_path)) is Qwen3Model
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path)) is Qwen3ForCausalLM
    make_drafter(target).save_pretrained(tmp_path / "drafter")
    assert type(AutoModel.from_pretrained(tmp_path / "drafter")) is DFlashDraftModel
