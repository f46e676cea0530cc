"""`generate` under `torch.inference_mode()`, as most inference code calls it: every path runs, and gives what it gives
under `torch.no_grad()`, with the drafter's bfloat16 linears prepacked (`hf_dflash.cpu_ops`). The packed path is
forced on any CPU with stand-ins for oneDNN's packing ops, and also run with the real ones where this torch has them
(CPUs with AVX512-BF16 or AMX, where hf-dflash runs bfloat16 by default)."""

import contextlib

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from transformers import pipeline

from hf_dflash import compile_everywhere, cpu_ops
from hf_dflash.modeling.modeling_dflash import same_states, tensor_states

from conftest import left_padded, make_drafter, make_target, make_tokenizer

PATHS = {
    "chain": {},
    "tree": {"draft_tree_size": 4},
    "auto": {"draft_tree_size": "auto"},
    "sampling": {"do_sample": True, "temperature": 0.8},
    "sampling tree": {"do_sample": True, "draft_tree_size": 4},
    "fixed chain": {"cache_implementation": "static"},
    "fixed auto": {"cache_implementation": "static", "draft_tree_size": "auto"},
}


@pytest.fixture(params=["stand-in", "oneDNN"])
def packs(request, monkeypatch) -> list:
    """The shapes of the weights packed during the test (a CPU without oneDNN bfloat16 packing runs stand-ins)."""
    packed = []
    if request.param == "oneDNN":
        if not cpu_ops.packing_available():
            pytest.skip("no oneDNN bfloat16 packing in this torch build / CPU (the stand-in run covers the code)")
        real = cpu_ops.pack_weight
        monkeypatch.setattr(cpu_ops, "pack_weight", lambda weight: packed.append(weight.shape) or real(weight))
    else:
        monkeypatch.setattr(cpu_ops, "packing_available", lambda: True)
        # another layout than the weight's, as oneDNN's blocked one is
        monkeypatch.setattr(cpu_ops, "pack_weight",
                            lambda weight: packed.append(weight.shape) or weight.detach().t().contiguous())
        monkeypatch.setattr(cpu_ops, "packed_linear", lambda x, weight_t, bias: F.linear(x, weight_t.t(), bias))
    return packed


def models():
    target = make_target("qwen3", dtype=torch.float32)
    return target, make_drafter(target, block_size=4).to(torch.bfloat16)  # bfloat16: the packed path


@pytest.mark.parametrize("path", list(PATHS))
def test_every_path_runs_under_inference_mode(path, packs):
    target, drafter = models()
    ids, mask = left_padded(2)
    outputs = []
    for context in (torch.inference_mode, torch.no_grad, torch.inference_mode):  # a fresh drafter's first call first
        torch.manual_seed(0)
        with context():
            outputs.append(target.generate(ids, attention_mask=mask, max_new_tokens=12, assistant_model=drafter,
                                           **{"do_sample": False, **PATHS[path]}))
    assert torch.equal(outputs[0], outputs[1]) and torch.equal(outputs[2], outputs[1])
    linears = sum(type(m) is nn.Linear for m in drafter.modules())  # the classes are back after each call
    assert linears > 0 and len(packs) > 0  # the drafter's linears multiplied prepacked weights
    # each weight packed once over the three calls: the draft head's copy (a float32 target's head, in bfloat16) is
    # an ordinary tensor even when made under inference mode, so it is kept across calls and never repacked per step
    assert len(packs) == linears + 1


def test_compiled_fixed_shape_path_under_inference_mode(packs):
    target, drafter = models()
    ids, mask = left_padded(2)
    compile_config = compile_everywhere(backend="eager", mode=None)
    settings = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, assistant_model=drafter,
                    cache_implementation="static", draft_tree_size=3, compile_config=compile_config)
    with torch.no_grad():
        expected = target.generate(ids, **settings)
    with torch.inference_mode():
        assert torch.equal(target.generate(ids, **settings), expected)


@pytest.mark.parametrize("context", [torch.inference_mode, torch.no_grad, contextlib.nullcontext])
def test_a_pipeline_under_inference_mode(context, packs):
    target, drafter = models()
    tokenizer = make_tokenizer()
    pipe = pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=drafter)
    plain = pipeline("text-generation", model=target, tokenizer=tokenizer)
    with context():
        got = pipe(["Hello", "abc!"], max_new_tokens=10, do_sample=False, batch_size=2)
    assert got == plain(["Hello", "abc!"], max_new_tokens=10, do_sample=False, batch_size=2)


def test_inference_tensors_are_never_taken_for_unchanged():
    """An inference tensor counts no in-place writes: a cache keyed by its state must be rebuilt, never trusted."""
    ordinary = torch.ones(3)
    with torch.inference_mode():
        made_inside = torch.ones(3)
        assert same_states((None, *tensor_states(ordinary)), (None, *tensor_states(ordinary)))
        assert not same_states((None, *tensor_states(made_inside)), (None, *tensor_states(made_inside)))
    assert not same_states((None, *tensor_states(made_inside)), (None, *tensor_states(made_inside)))
    before = (None, *tensor_states(ordinary))
    ordinary.add_(1)
    assert not same_states(before, (None, *tensor_states(ordinary)))


def test_a_weight_made_under_inference_mode_is_multiplied_unpacked(packs):
    with torch.inference_mode():
        layer = cpu_ops.pack_linears(nn.Linear(8, 4).to(torch.bfloat16))
        x = torch.randn(2, 8, dtype=torch.bfloat16)
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    assert type(layer) is cpu_ops.PackedLinear and packs == []
