"""`hf_dflash.cpu_ops`: the chunked argmax and the prepacked drafter linears give exactly what torch gives."""

import copy
import pickle

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from hf_dflash.cpu_ops import CHUNK, PACKED, PackedLinear, argmax, pack_linears, packing_available

from conftest import left_padded, make_drafter, make_target


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("vocab", [7, 4 * CHUNK, 49_152, 49_157, 151_936])
def test_argmax_is_torch_argmax(dtype, vocab):
    generator = torch.Generator().manual_seed(vocab)
    scores = torch.randn(3, 5, vocab, generator=generator).to(dtype)
    # ties: the maximum repeated later in the row, in the same chunk, in a later chunk and in the last column
    top = scores.amax(-1, keepdim=True) + 1
    for column in {min(c, vocab - 1) for c in (vocab // 3, vocab // 3 + 1, vocab // 3 + CHUNK, vocab - 1)}:
        scores[0, :, column] = top[0, :, 0]
    scores[1, 2, -1] = top[1, 2, 0] + 1  # the maximum alone in a short last chunk
    scores[2, 0] = float("-inf")  # a row without a finite score
    assert torch.equal(argmax(scores), torch.argmax(scores, dim=-1))


def test_argmax_with_nan_is_torch_argmax():
    scores = torch.randn(2, 49_152).bfloat16()
    scores[0, 30_000] = scores[0, 40_000] = float("nan")
    assert torch.equal(argmax(scores), torch.argmax(scores, dim=-1))


needs_packing = pytest.mark.skipif(not packing_available(), reason="no oneDNN bfloat16 support in this torch build")


@needs_packing
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(16, 576), (1, 31, 576), (2, 3, 576)])
def test_packed_linear_is_bitwise_linear(shape, bias):
    torch.manual_seed(0)
    linear = nn.Linear(576, 1536, bias=bias).bfloat16()
    x = torch.randn(shape).bfloat16()
    expected = F.linear(x, linear.weight, linear.bias)
    pack_linears(linear)
    assert type(linear) is PackedLinear
    with torch.no_grad():
        out = linear(x)
    assert linear in PACKED  # the packed path ran
    assert torch.equal(out, expected)


@needs_packing
def test_packed_linear_compiles_with_inductor():
    """Compiled (the fixed-shape path on a CPU with bfloat16), a packed linear is a plain one that inductor packs its
    own way: inductor could not lower the op on an eagerly packed weight, and the staleness check broke the graph."""
    torch.manual_seed(0)
    linear = pack_linears(nn.Linear(576, 1728, bias=False).bfloat16())
    x = torch.randn(1, 8, 576).bfloat16()
    with torch.no_grad():
        expected = F.linear(x, linear.weight)
        linear(x)  # eager: packed first
        out = torch.compile(linear, backend="inductor", fullgraph=True)(x)
    torch.testing.assert_close(out, expected)


@needs_packing
def test_packed_linear_follows_the_weight():
    torch.manual_seed(0)
    linear = pack_linears(nn.Linear(64, 32, bias=False).bfloat16())
    x = torch.randn(4, 64).bfloat16()
    # with gradients it is nn.Linear (training the drafter)
    linear.weight.requires_grad_(True)
    linear(x.requires_grad_(True)).sum().backward()
    assert linear.weight.grad is not None and linear not in PACKED
    with torch.no_grad():
        before = linear(x)
        torch.optim.SGD(linear.parameters(), lr=1.0).step()  # an in-place write: the packed copy is stale
        after = linear(x)
        assert not torch.equal(before, after)
        assert torch.equal(after, F.linear(x, linear.weight))
        linear.weight = nn.Parameter(torch.randn(32, 64).bfloat16())  # another tensor
        assert torch.equal(linear(x), F.linear(x, linear.weight))
        linear.float()  # another dtype: plain F.linear
        assert torch.equal(linear(x.float()), F.linear(x.float(), linear.weight))


@needs_packing
def test_packed_drafter_copies_saves_and_drafts_the_same():
    target = make_target("qwen3", dtype=torch.bfloat16)
    drafter = make_drafter(target, block_size=4)
    context = torch.randn(2, 5, len(drafter.config.target_layer_ids) * target.config.hidden_size).bfloat16()
    embeds = drafter.embed(target, torch.randint(0, target.config.vocab_size, (2, 4)))

    def drafts(model):
        with torch.no_grad():
            positions = torch.arange(9).expand(2, -1)
            states = model(noise_embeds=embeds, context_hidden_states=context, position_ids=positions)
            return model.draft_tokens(states.last_hidden_state, target.get_output_embeddings()), states

    plain_ids, plain_states = drafts(drafter)
    keys = set(drafter.state_dict())
    pack_linears(pack_linears(drafter))  # idempotent
    packed_ids, packed_states = drafts(drafter)
    assert all(type(m) is not nn.Linear for m in drafter.modules())
    assert torch.equal(packed_states.last_hidden_state, plain_states.last_hidden_state)
    assert torch.equal(packed_ids, plain_ids)
    assert set(drafter.state_dict()) == keys
    for clone in (copy.deepcopy(drafter), pickle.loads(pickle.dumps(drafter))):
        assert torch.equal(drafts(clone)[0], plain_ids)


@needs_packing
def test_generate_packs_a_cpu_drafter_and_keeps_the_output():
    target = make_target("qwen3", dtype=torch.float32)
    drafter = make_drafter(target, block_size=4).bfloat16()  # a bfloat16 drafter beside a float32 target, as shipped
    ids, mask = left_padded(2)
    plain = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    out = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                          assistant_model=drafter)
    # the packed path ran, and the user's drafter has its classes back
    assert all(type(m) is nn.Linear for m in drafter.modules() if isinstance(m, nn.Linear))
    assert drafter.layers[0].mlp.gate_proj in PACKED
    head = drafter._draft_head_cache[1][0]  # the drafter's bfloat16 copy of the target's float32 head (its own)
    assert type(head) is PackedLinear and head in PACKED
    assert torch.equal(out, plain)


@needs_packing
def test_generate_packs_a_bfloat16_target_where_memory_allows(monkeypatch):
    """A DFlash call multiplies a bfloat16 target's linears prepacked too (docs/design.md: 1.24x on SmolLM2 here),
    with bitwise the same logits, so the same tokens as without; the target keeps its classes; where the packed
    copies would not fit twice in the available memory the target is left unpacked (the drafter still packs)."""
    from hf_dflash import cpu_ops

    ids, mask = left_padded(2)
    for room in (True, False):
        target = make_target("qwen3", dtype=torch.bfloat16)
        drafter = make_drafter(target, block_size=4)
        kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, output_logits=True,
                      return_dict_in_generate=True)
        plain = target.generate(**kwargs)
        monkeypatch.setattr(cpu_ops, "available_memory", lambda room=room: 2**40 if room else 0)
        with cpu_ops.packed_linears(target):  # plain generate packed: bitwise plain's logits
            assert all(torch.equal(a, b) for a, b in zip(target.generate(**kwargs).logits, plain.logits))
        PACKED.clear()
        out = target.generate(**kwargs, assistant_model=drafter)
        assert torch.equal(out.sequences, plain.sequences)
        assert all(type(m) is nn.Linear for m in target.modules() if isinstance(m, nn.Linear))
        assert (target.model.layers[0].mlp.gate_proj in PACKED) is room
        assert drafter.layers[0].mlp.gate_proj in PACKED


@needs_packing
def test_generate_leaves_a_shared_output_head_unpacked():
    target = make_target("qwen3", dtype=torch.bfloat16)
    drafter = make_drafter(target, block_size=4)  # the same dtype, no draft vocabulary: the target's head as is
    ids, mask = left_padded(2)
    target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False, assistant_model=drafter)
    assert type(target.get_output_embeddings()) is nn.Linear and drafter._draft_head_cache is None
    assert type(drafter.draft_head(target.get_output_embeddings())[0]) is nn.Linear  # no packed twin of a shared head


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_draft_logits_multiply_the_head_as_one_matrix_of_rows(kind):
    """The drafter's positions reach an unpacked head as a 2-D matrix: a 3-D input to a linear without bias took a
    batched matmul that copied the whole weight each call (seconds a step at Qwen3.5's 248k-token vocabulary, bfloat16,
    inside the loop). Same logits either way."""
    from test_dflash2 import make_dflash2

    target = make_target("qwen3", dtype=torch.bfloat16)
    drafter = make_dflash2(target) if kind == "dflash2" else make_drafter(target, block_size=4).to(torch.bfloat16)
    head = target.get_output_embeddings()
    shapes = []
    handle = head.register_forward_pre_hook(lambda module, args: shapes.append(args[0].dim()))
    hidden = torch.randn(3, 3, target.config.hidden_size, dtype=torch.bfloat16)  # 3 draft positions (block 4)
    with torch.inference_mode():
        own = drafter.draft_head(head)
        if kind == "dflash2":
            drafter.candidates(hidden, head, torch.zeros(3, dtype=torch.long))
        else:
            ids = drafter.draft_tokens(hidden, head)
            assert torch.equal(ids, F.linear(hidden, head.weight).max(-1).indices)
    handle.remove()
    assert shapes == [2]
    calls = []
    handle = own[0].register_forward_pre_hook(lambda module, args: calls.append(args[0].dim()))
    with torch.inference_mode():
        if kind == "dflash2":
            drafter.candidates(hidden, head, torch.zeros(3, dtype=torch.long), own)
        else:
            drafter.draft_tokens(hidden, head, own)
    handle.remove()
    assert calls == [2]
