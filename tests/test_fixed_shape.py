"""The fixed-shape path (`cache_implementation="static"`): the same tokens as plain `generate`, the same distribution
when sampling, one compiled graph for every step, and the general loop wherever it cannot serve a call."""

import itertools

import pytest
import torch
from torch.overrides import TorchFunctionMode
from transformers import StoppingCriteria, StoppingCriteriaList

from hf_dflash import compile_everywhere
from hf_dflash.generation import DFlashProposer, auto_size, kv_cache, loop
from hf_dflash.generation.auto_size import AutoTreeSize
from hf_dflash.generation.fixed_shape import FixedShapeDecoder
from hf_dflash.generation.forward_costs import ForwardCosts

from conftest import ARCHITECTURES, HYBRIDS, left_padded, make_drafter, make_hybrid, make_target, make_tokenizer
from test_cost_model import FLAT, STEEP
from test_sampling import SAMPLES, drafter, exact_distribution, g_test, greedy_oracle, target  # noqa: F401 (fixtures: test_sampling's 8-token target)
from test_tree import PROBS, calibrated_oracle, draw_tree, tree_oracle  # noqa: F401 (fixtures)

STATIC = dict(cache_implementation="static")


def loops_run(monkeypatch) -> list:
    """Which path each DFlash call ran: "fixed" or "general" (the decoder the one loop ran with)."""
    runs = []
    real = loop.speculative_loop

    def recorded(proposer, decoder, input_ids):
        runs.append("fixed" if isinstance(decoder, FixedShapeDecoder) else "general")
        return real(proposer, decoder, input_ids)

    monkeypatch.setattr(loop, "speculative_loop", recorded)
    return runs


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_equals_plain_generate(arch, batch, oracle, monkeypatch):
    runs = loops_run(monkeypatch)
    target = make_target(arch)
    drafter = make_drafter(target, block_size=4)
    ids, mask = left_padded(batch)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24)
    oracle(correct_upto="random", seed=2)  # rows accept different numbers of drafts, every step
    out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24, assistant_model=drafter,
                          return_dict_in_generate=True, **STATIC)
    assert runs == ["fixed"]
    assert torch.equal(out.sequences, plain)
    steps = [n for row in out.acceptance_lengths for n in row]
    assert max(steps) > 1 and min(steps) >= 1 and len(set(steps)) > 1
    assert [sum(row) for row in out.acceptance_lengths] == [24 - 1] * batch  # the prefill commits the first


@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_5_text"])  # a hybrid's frozen rows keep their states too
def test_eos_inside_a_block_and_the_max_length_cut(model_type, oracle):
    target = make_hybrid(model_type) if model_type in HYBRIDS else make_target(model_type)
    drafter = make_drafter(target, block_size=5)
    ids, mask = left_padded(3)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30)
    eos = int(reference[0, ids.shape[1] + 6])  # row 0's 7th new token: inside a block of the oracle's drafts
    for max_new_tokens in (30, 9):  # 9: every row's last step is cut by max_length inside its block
        plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                                eos_token_id=eos, pad_token_id=0)
        oracle(correct_upto=None)
        fast = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                               eos_token_id=eos, pad_token_id=0, assistant_model=drafter, **STATIC)
        assert torch.equal(fast, plain)
    assert (plain[0] == eos).any()


@pytest.mark.slow
@pytest.mark.parametrize("tree_size", [0, 6])
def test_one_graph_for_every_step(tree_size, oracle, tree_oracle, request):
    """fullgraph=True, and no recompile over a 64+-step generation whose rows accept different lengths."""
    torch._dynamo.reset()
    recompiles = torch._dynamo.config.patch(error_on_recompile=True)  # monkeypatch would delete the config entry
    recompiles.__enter__()
    request.addfinalizer(lambda: recompiles.__exit__(None, None, None))
    target = make_target("gemma3")  # sliding-window and full-attention layers
    drafter = make_drafter(target, block_size=4)
    drafter.config.dflash_config = {**(drafter.config.dflash_config or {}), "draft_tree_size": tree_size}
    ids, mask = left_padded(3)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=170)
    oracle(correct_upto="random", seed=5)
    tree_oracle({0: [1, 0, 0], 1: [0, 1, 0], 2: [0, None]})
    compile_config = compile_everywhere(backend="aot_eager", fullgraph=True, mode=None)
    out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=170, assistant_model=drafter,
                          return_dict_in_generate=True, compile_config=compile_config, **STATIC)
    assert torch.equal(out.sequences, plain)
    assert max(len(row) for row in out.acceptance_lengths) >= 64  # steps: the longest-lived row's
    # a second call with other prompt lengths reuses the graphs (error_on_recompile would raise otherwise)
    ids, mask = left_padded(3, lengths=[2, 8, 5], seed=1)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=170)
    oracle(correct_upto="random", seed=6)
    tree_oracle({0: [0, 0], 1: [None], 2: [1, 0, 0]})
    again = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=170, assistant_model=drafter,
                            compile_config=compile_config, **STATIC)
    assert torch.equal(again, plain)


def test_steps_compile_where_transformers_compiles(monkeypatch):
    """On a CPU, transformers compiles plain decoding only when `compile_config` asks for every device (hf-dflash's
    public way: `compile_everywhere()`); so does the fixed-shape path, and `disable_compile` turns it off."""
    assert compile_everywhere("cpu").mode == "default" and compile_everywhere("cuda").mode == "reduce-overhead"
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging

    compiled = []
    monkeypatch.setattr("torch.compile", lambda fn, **kwargs: compiled.append(kwargs) or fn)
    target = make_target("qwen3")
    drafter = make_drafter(target, block_size=4)
    ids, mask = left_padded(2)
    logger = logging.get_logger("hf_dflash.generation.compiling")
    type(logger).warning_once.cache_clear()
    with CaptureLogger(logger) as captured:  # said once: how to compile
        for _ in range(2):
            target.generate(ids, attention_mask=mask, max_new_tokens=6, assistant_model=drafter, **STATIC)
    assert compiled == [] and captured.out.count("compile_config=hf_dflash.compile_everywhere()") == 1
    compile_config = compile_everywhere(backend="aot_eager")
    type(logger).warning_once.cache_clear()
    with CaptureLogger(logger) as captured:  # not when the user asked for no compiling
        target.generate(ids, attention_mask=mask, max_new_tokens=6, assistant_model=drafter,
                        compile_config=compile_config, disable_compile=True, **STATIC)
    assert compiled == [] and captured.out == ""
    target.generate(ids, attention_mask=mask, max_new_tokens=6, assistant_model=drafter,
                    compile_config=compile_config, **STATIC)
    assert len(compiled) == 2 and all(c["backend"] == "aot_eager" for c in compiled)  # the drafter and the target


@pytest.mark.parametrize("tree_size", [0, 5])
@pytest.mark.parametrize("settings", [dict(temperature=0.7, top_k=3, top_p=0.9), dict(temperature=1.3, min_p=0.05)])
def test_sampling_draws_the_target_distribution(target, drafter, greedy_oracle, calibrated_oracle,  # noqa: F811
                                                settings, tree_size, monkeypatch):
    """Chains (the greedy continuation as drafts) and trees (the target's own top candidates along it), every slot
    sampled with Gumbel noise: the target's distribution, with whole blocks or paths accepted."""
    runs = loops_run(monkeypatch)
    dist = exact_distribution(target, settings)
    counts, acceptance = draw_tree(target, drafter, {**settings, **STATIC}, tree_size)
    assert set(runs) == {"fixed"}
    assert set(counts) <= set(dist), "sampled a sequence the processors give probability 0"
    g, threshold = g_test(counts, dist)
    assert g < threshold
    assert sum(row[0] == 3 for row in acceptance) > SAMPLES // 10  # whole blocks accepted
    g_other, threshold_other = g_test(counts, exact_distribution(target, {**settings, "temperature": 2.0}))
    assert g_other > 2 * threshold_other  # negative control


class NeverStop(StoppingCriteria):
    def __call__(self, input_ids, scores, **kwargs):
        return torch.zeros(len(input_ids), dtype=torch.bool, device=input_ids.device)


@pytest.mark.parametrize("setting, reason", [
    (dict(assistant_confidence_threshold=0.5), "assistant_confidence_threshold=0.5"),
    (dict(repetition_penalty=1.3), "RepetitionPenaltyLogitsProcessor"),
    (dict(stopping_criteria=StoppingCriteriaList([NeverStop()])), "custom criteria"),
    (dict(output_scores=True, return_dict_in_generate=True), "output_scores"),
])
def test_what_it_cannot_serve_runs_on_the_general_loop(setting, reason, monkeypatch):
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging

    runs = loops_run(monkeypatch)
    target = make_target("qwen3")
    drafter = make_drafter(target, block_size=4)
    ids, mask = left_padded(2)
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=8, tokenizer=make_tokenizer(), **setting)
    plain = target.generate(ids, **{k: v for k, v in kwargs.items() if k != "draft_tree_size"})
    logger = logging.get_logger("hf_dflash.generation.loop")
    type(logger).warning_once.cache_clear()
    with CaptureLogger(logger) as captured:
        out = target.generate(ids, assistant_model=drafter, **kwargs, **STATIC)
    assert runs == ["general"]
    assert "runs on the general loop" in captured.out and reason in captured.out
    plain = plain if torch.is_tensor(plain) else plain.sequences
    assert torch.equal(out if torch.is_tensor(out) else out.sequences, plain)


@pytest.mark.parametrize("tree_size", [0, 6])
def test_stop_strings_inside_an_accepted_block(tree_size, oracle, tree_oracle, monkeypatch):
    """Stop strings are checked on the device at every committed token: a row stops where plain `generate` stops it,
    inside a block of right drafts (and of a tree's path)."""
    runs = loops_run(monkeypatch)
    target, tokenizer = make_target("qwen3"), make_tokenizer()
    ids, mask = left_padded(3)
    unbounded = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
    texts = tokenizer.batch_decode(unbounded[:, ids.shape[1]:])
    stops = [texts[0][3:5], texts[1][9:11]]  # inside row 0's and row 1's text
    eos = next(t for t in range(2, 95) if t not in set(unbounded.flatten().tolist()))  # pads the stopped rows
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=20, stop_strings=stops, tokenizer=tokenizer,
                  eos_token_id=eos)
    plain = target.generate(ids, **kwargs)
    oracle(correct_upto=None)
    tree_oracle([1, 0, 0, 0, 0, 0, 0])
    out = target.generate(ids, assistant_model=make_drafter(target, block_size=8), draft_tree_size=tree_size,
                          return_dict_in_generate=True, **kwargs, **STATIC)
    assert runs == ["fixed"] and torch.equal(out.sequences, plain)
    stopped = tokenizer.batch_decode(plain[:, ids.shape[1]:], skip_special_tokens=True)
    for row in (0, 1):  # each stopped inside what it would have generated, at the end of its stop string
        assert len(stopped[row]) < len(texts[row]) and stopped[row].endswith(stops[row])


class HostReads(TorchFunctionMode):
    """Counts the tensor operations that make the host wait for the device's result."""

    READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
             torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.nonzero, torch.nonzero, torch.Tensor.unique}

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += func in self.READS
        return func(*args, **(kwargs or {}))


def test_one_host_read_per_step():
    target = make_target("qwen3")
    drafter = make_drafter(target, block_size=4)
    ids, mask = left_padded(3)
    reads = {}
    for name, kwargs in (("fixed", STATIC), ("general", {})):
        with HostReads() as counter:
            out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40,
                                  assistant_model=drafter, return_dict_in_generate=True, **kwargs)
        reads[name] = (counter.count, max(len(row) for row in out.acceptance_lengths))
    count, steps = reads["fixed"]
    assert steps >= 20 and count <= steps + 10  # one a step, plus a few for the prefill and the result
    assert reads["general"][0] > 5 * steps  # the counter sees the general loop's reads


# --- trees -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
@pytest.mark.parametrize("batch", [1, 3])
def test_trees_equal_plain_generate(arch, batch, tree_oracle, monkeypatch):
    """A tree built on the device, its accepted path moved into place in the cache: plain's tokens, with rows whose
    paths run through runner-up nodes (mistral: window 5, gemma3: window 6, both shorter than the outputs)."""
    runs = loops_run(monkeypatch)
    target = make_target(arch)
    drafter = make_drafter(target, block_size=5)
    ids, mask = left_padded(batch)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24)
    tree_oracle({0: [1, 0, 2, 0], 1: [0, 0, 1, None], 2: [2, 1]})
    out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24, assistant_model=drafter,
                          draft_tree_size=12, return_dict_in_generate=True, **STATIC)
    assert runs == ["fixed"]
    assert torch.equal(out.sequences, plain)
    assert max(out.acceptance_lengths[0]) >= 3  # row 0's path runs through a runner-up: (1, 0) at least
    assert all(n == 12 for row in out.draft_lengths for n in row)
    for size in (2, 9, 40):  # the random drafter's own trees
        fast = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24, assistant_model=drafter,
                               draft_tree_size=size, **STATIC)
        assert torch.equal(fast, plain)
    assert runs == ["fixed"] * 4


def test_rows_accept_paths_of_different_lengths(tree_oracle):
    """With 6 nodes the tree holds (0), (0,0), (0,0,0), (1), (1,0), (1,0,0): each row's path is known."""
    assert PROBS[0][:2] == [0.5, 0.4] and PROBS[1][0] == 0.9  # the tree test_tree's probabilities make
    target = make_target("gemma3")
    drafter = make_drafter(target, block_size=4)
    ids, mask = left_padded(3)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=25)
    tree_oracle({0: [1, 0, 0], 1: [0, 1, 0], 2: [None]})  # 4, 2 and 1 tokens per step
    out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=25, assistant_model=drafter,
                          draft_tree_size=6, return_dict_in_generate=True, **STATIC)
    assert torch.equal(out.sequences, plain)
    assert out.acceptance_lengths[0][:5] == [4] * 5
    assert out.acceptance_lengths[1][:5] == [2] * 5
    assert out.acceptance_lengths[2][:5] == [1] * 5


def test_eos_inside_an_accepted_path_and_the_max_length_cut(tree_oracle):
    target = make_target("qwen3")
    drafter = make_drafter(target, block_size=5)
    ids, mask = left_padded(3)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30)
    eos = int(reference[0, ids.shape[1] + 6])
    for max_new_tokens in (30, 9):
        plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                                eos_token_id=eos, pad_token_id=0)
        tree_oracle([1, 0, 0, 0])  # every path through a runner-up
        fast = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                               eos_token_id=eos, pad_token_id=0, assistant_model=drafter, draft_tree_size=8, **STATIC)
        assert torch.equal(fast, plain)
    assert (plain[0] == eos).any()


@pytest.mark.parametrize("tree_size", [0, 8])
def test_the_spare_slot_past_max_length(tree_size, oracle, tree_oracle, monkeypatch):
    """Caches of exactly `max_length` + 1 slots: a last step's tokens past `max_length` all write to the spare slot,
    and a tree's nodes there are never accepted (their keys were lost): still plain's tokens, rows cut inside a
    block and rows stopped by EOS alike."""
    monkeypatch.setattr(kv_cache, "CAPACITY_STEP", 1)
    spilled = []  # whether a step's slots ran past the cache
    real = FixedShapeDecoder.step_slots
    monkeypatch.setattr(FixedShapeDecoder, "step_slots", lambda self, width: spilled.append(
        int(self.slot.max()) + width > self.capacity) or real(self, width))
    target = make_target("qwen3")
    drafter = make_drafter(target, block_size=5)
    ids, mask = left_padded(3)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30)
    for max_new_tokens, eos in ((9, None), (23, None), (30, int(reference[0, ids.shape[1] + 6]))):
        plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                                eos_token_id=eos, pad_token_id=0)
        oracle(correct_upto=None)
        tree_oracle([1, 0, 0, 0])  # a tree's every path through a runner-up: nodes deep in its slots
        fast = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                               eos_token_id=eos, pad_token_id=0, assistant_model=drafter, draft_tree_size=tree_size,
                               **STATIC)
        assert torch.equal(fast, plain)
    assert any(spilled)


def test_dflash2_trees(monkeypatch):
    """A DFlash2 drafter's selector ranks each node's children under it: its conditional candidates build the tree."""
    from test_dflash2 import make_dflash2

    runs = loops_run(monkeypatch)
    target = make_target("qwen3")
    drafter = make_dflash2(target)
    ids, mask = left_padded(2)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
    fast = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, assistant_model=drafter,
                           draft_tree_size=7, **STATIC)
    assert runs == ["fixed"] and torch.equal(fast, plain)


# --- "auto" ----------------------------------------------------------------------------------------------------


def with_costs(monkeypatch, costs):
    monkeypatch.setattr(auto_size, "load_forward_costs", lambda target, batch_size: costs)


@pytest.mark.parametrize("costs, size", [(FLAT, 7), (STEEP, 0)])
def test_auto_sizes_steps_by_the_cost_curve(costs, size, monkeypatch):
    """A flat curve (a GPU): the widest tree "auto" may build, two candidates a depth at block 4; a curve where
    k tokens cost k one-token steps: none, as the random drafter's drafts are unsure. Plain's tokens either way."""
    runs = loops_run(monkeypatch)
    with_costs(monkeypatch, ForwardCosts(costs.tokens, tuple(100 * t for t in costs.seconds)))  # beyond real steps'
    target = make_target("qwen3")
    drafter = make_drafter(target, block_size=4)
    ids, mask = left_padded(3)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
    out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, assistant_model=drafter,
                          draft_tree_size="auto", return_dict_in_generate=True, **STATIC)
    assert runs == ["fixed"]
    assert torch.equal(out.sequences, plain)
    assert {n for row in out.draft_lengths for n in row} == {size}


@pytest.mark.slow
@pytest.mark.parametrize("arch, batch", [("qwen3", 1), ("gemma3", 3)])
def test_auto_changes_the_width_between_steps(arch, batch, tree_oracle, monkeypatch):
    """Each step verifies another of the menu's sizes (0: the root alone), compiled with fullgraph=True, every width
    before the first step (no step recompiles: a tree's tensors must have a new one's strides, also with one row):
    plain's tokens, rows whose paths run through runner-ups, and each step's size in the record."""
    sizes = itertools.cycle((3, 0, 7, 15, 1))
    with_costs(monkeypatch, FLAT)
    monkeypatch.setattr(AutoTreeSize, "choose", lambda self, tree, live=None: next(sizes))
    monkeypatch.setattr(auto_size, "tree_size_menu", lambda widest, costs=None: (0, 1, 3, 7, 15))
    torch._dynamo.reset()
    target = make_target(arch)
    drafter = make_drafter(target, block_size=5)
    ids, mask = left_padded(batch)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40)
    tree_oracle({0: [1, 0, 2, 0], 1: [0, 0, 1, None], 2: [2, 1]})
    compile_config = compile_everywhere(backend="aot_eager", fullgraph=True, mode=None)
    with torch._dynamo.config.patch(error_on_recompile=True):
        out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40, assistant_model=drafter,
                              draft_tree_size="auto", compile_config=compile_config, return_dict_in_generate=True,
                              **STATIC)
    assert torch.equal(out.sequences, plain)
    assert out.draft_lengths[0][:10] == [3, 0, 7, 15, 1] * 2
    assert max(out.acceptance_lengths[0]) >= 3


def test_auto_reads_the_device_once_per_step(monkeypatch):
    """The choice is one read a step, beside what a fixed size reads (the stop flags, a copy made the step before)."""
    with_costs(monkeypatch, FLAT)  # "auto" then verifies the widest tree, 7 nodes, as the fixed size does
    target = make_target("qwen3")
    drafter = make_drafter(target, block_size=4)
    ids, mask = left_padded(3)
    reads = {}
    for size in (7, "auto"):
        with HostReads() as counter:
            out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40,
                                  assistant_model=drafter, draft_tree_size=size, return_dict_in_generate=True,
                                  **STATIC)
        reads[size] = (counter.count, max(len(row) for row in out.acceptance_lengths))
    (fixed, steps), (auto, auto_steps) = reads[7], reads["auto"]
    assert steps == auto_steps >= 20 and auto - fixed == steps


# --- as under CUDA graphs ----------------------------------------------------------------------------------------


class ReusedOutputs:
    """A `torch.compile` backend that reuses output memory as CUDA graphs do (`mode="reduce-overhead"`, cudagraph
    trees' shared pool): a call of any function it compiled overwrites the outputs of the calls before, here with
    NaN (integers: -1). Code that reads a compiled output after the next compiled call reads garbage, as on a GPU,
    where torch raises instead. `reads` collects what the drafter's context held at each step."""

    name = "hf_dflash_test_reused_outputs"

    def __init__(self):
        self.outputs = []
        torch._dynamo.register_backend(self, name=self.name)

    def __call__(self, graph, example_inputs, **kwargs):
        def run(*args):
            for output in self.outputs:
                output.fill_(float("nan") if output.is_floating_point() else -1)
            inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
            out = graph(*args)
            self.outputs = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)
                            and t.untyped_storage().data_ptr() not in inputs]  # not a cache the graph wrote into
            return out

        return run


REUSED_OUTPUTS = ReusedOutputs()


@pytest.mark.parametrize("tree_size", [0, 6, "auto"])
def test_nothing_is_read_after_the_next_compiled_call(tree_size, monkeypatch):
    """Chains, trees and "auto" (whose accepted path moves in a compiled call after the verification) under a backend
    that overwrites earlier outputs at every compiled call: plain's tokens, and the drafter's context is never read
    from an overwritten output."""
    with_costs(monkeypatch, FLAT)
    contexts = []
    real = DFlashProposer.extend_context
    monkeypatch.setattr(DFlashProposer, "extend_context", lambda self, context: contexts.append(
        bool(context.features.isfinite().all())) or real(self, context))
    torch._dynamo.reset()
    target = make_target("qwen3", dtype=torch.float32)
    drafter = make_drafter(target, block_size=4)
    ids, mask = left_padded(2)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
    out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, assistant_model=drafter,
                          draft_tree_size=tree_size, compile_config=compile_everywhere(backend=REUSED_OUTPUTS.name,
                                                                                       mode=None), **STATIC)
    assert torch.equal(out, plain)
    assert len(contexts) > 5 and all(contexts)


def test_caches_keep_their_addresses_across_calls(monkeypatch):
    """CUDA graphs replay only over the tensors they recorded: a second call of the same shape writes the same
    cache tensors (no recording inside each `generate`); another batch size gets caches of its own."""
    addresses, held = [], []  # held: the caches stay alive, so a new one can never reuse their memory
    real = kv_cache.RowCacheLayer.update
    monkeypatch.setattr(kv_cache.RowCacheLayer, "update", lambda self, *args, **kwargs: (
        real(self, *args, **kwargs), addresses[-1].add(self.keys.data_ptr()), held.append(self.keys))[0])
    target = make_target("qwen3")
    drafter = make_drafter(target, block_size=4)
    for batch, seed in ((2, 0), (2, 1), (3, 0)):
        ids, mask = left_padded(batch, seed=seed)
        addresses.append(set())
        out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12, assistant_model=drafter,
                              **STATIC)
        assert torch.equal(out, target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12))
    first, second, other = addresses
    assert first == second and len(first) == len(other) == 4 + 1  # the target's 4 layers and the drafter's 1
