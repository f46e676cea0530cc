"""`draft_tree_size="auto"`: forward costs measured once per model / device / dtype / batch and kept on disk, and
the per-step choice of the tree size they make pay; lossless like every other setting."""

import json

import pytest
import torch

from hf_dflash.generation import forward_costs
from hf_dflash.generation.auto_size import NodeCalibration, choose_tree_size, tree_size_menu
from hf_dflash.generation.forward_costs import (
    ForwardCosts,
    LoopCosts,
    StepCosts,
    load_forward_costs,
    measure_forward_costs,
)
from hf_dflash.generation.tree import DraftTree

from conftest import ForwardCounter, left_padded, make_drafter, make_target
from test_tree import tree_oracle  # noqa: F401 (a fixture)

FLAT = ForwardCosts((1, 2, 4, 8, 16, 32), (0.01,) * 6)  # a GPU: every verification costs a one-token step
STEEP = ForwardCosts((1, 2, 4, 8, 16, 32), (0.01, 0.02, 0.04, 0.08, 0.16, 0.32))  # cost proportional to tokens
CPU = ForwardCosts((1, 2, 4, 8, 16, 32), (0.01, 0.015, 0.03, 0.06, 0.12, 0.24))  # 2 tokens cheap, then linear


@pytest.fixture(autouse=True)
def costs_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DFLASH_CACHE", str(tmp_path))
    return tmp_path / "forward_costs"


def test_interpolation():
    costs = ForwardCosts((1, 2, 4), (1.0, 2.0, 3.0))
    assert [costs(k) for k in (0, 1, 1.5, 2, 3, 4, 6)] == [1.0, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0]
    assert costs.max_tokens == 4


def test_chooser_on_synthetic_curves():
    sure = torch.tensor([[0.9, 0.81, 0.73, 0.3, 0.2, 0.1, 0.05, 0.01]], dtype=torch.float64)
    unsure = torch.tensor([[0.2, 0.1, 0.05, 0.02]], dtype=torch.float64)
    assert choose_tree_size(sure, FLAT) == 8  # a flat curve: every node with a chance pays
    assert choose_tree_size(unsure, FLAT) == 4
    assert choose_tree_size(unsure, STEEP) == 0  # steep curve, unsure drafter: no drafts
    assert choose_tree_size(sure, STEEP) == 0  # cost proportional to tokens: only certain drafts would pay
    # the first sure draft pays where 2 tokens cost 1.5 one-token steps (1.9 tokens in 1.5 steps), a third node
    # does not (3.44 tokens in 3 steps)
    assert choose_tree_size(sure, CPU) == 1
    assert choose_tree_size(unsure, CPU) == 0
    # the drafter's time is paid by every step: it makes verifying drafts relatively cheaper
    assert choose_tree_size(torch.tensor([[0.6]], dtype=torch.float64), STEEP) == 0
    assert choose_tree_size(torch.tensor([[0.6]], dtype=torch.float64), STEEP, overhead=0.05) == 1
    # a batch shares one tree size: the rows' expectations add up
    assert choose_tree_size(torch.cat([unsure, sure[:, :4]]), CPU) == 1  # 3.1 tokens in 1.5 steps > 2 in 1


def test_menu_adds_narrow_trees_where_a_forward_over_few_tokens_is_cheap():
    """The fixed-shape path's menu: powers of two (widths 1, 4, 8, ...); trees of 1 and 2 drafts too where the curve
    prices a forward over 2 or 3 tokens at least 10 % below one over 4 (float32 on a CPU), not where it is flat."""
    assert tree_size_menu(15) == tree_size_menu(15, FLAT) == (0, 3, 7, 15)
    assert tree_size_menu(31, STEEP) == (0, 1, 2, 3, 7, 15, 31)
    float32 = ForwardCosts((1, 2, 3, 4, 8, 16), (62.5, 66.3, 71.8, 97.3, 128.9, 128.4))  # the Xeon, 2026-12-07
    assert tree_size_menu(15, float32) == (0, 1, 2, 3, 7, 15)
    only_three = ForwardCosts((1, 2, 3, 4), (0.9, 0.95, 0.8, 1.0))  # t(2) 5 % below t(4): 1 draft is not worth it
    assert tree_size_menu(3, only_three) == (0, 2, 3)
    assert tree_size_menu(2, STEEP) == (0,)  # no power-of-two tree fits: nothing narrower is offered either


def test_chooser_on_a_menu_and_live_rows():
    """The fixed-shape path chooses among a few sizes, and its stopped rows (still in the batch) do not count."""
    sure = torch.tensor([[0.9, 0.81, 0.73, 0.3, 0.2, 0.1, 0.05, 0.01]], dtype=torch.float64)
    assert choose_tree_size(sure, FLAT, sizes=(0, 3, 7)) == 7
    assert choose_tree_size(sure, FLAT, sizes=(0, 3)) == 3
    assert choose_tree_size(sure, FLAT, sizes=(0, 3, 15)) == 3  # a size past the tree's is not one
    assert choose_tree_size(sure, CPU, sizes=(0, 3, 7)) == 3  # 1 would be best (above); 3 still beats none
    unsure = torch.tensor([[0.2, 0.1, 0.05, 0.02]] + [[0.0] * 4] * 3, dtype=torch.float64)
    sure = torch.tensor([[0.9, 0.81, 0.73, 0.3]] * 4, dtype=torch.float64)
    assert choose_tree_size(sure, CPU) == 1  # 4 sure rows: their first draft pays
    # only the unsure row is live: no drafts pay, as for it alone
    assert choose_tree_size(sure, CPU, live=torch.tensor([False, True, False, False])) == 1
    assert choose_tree_size(unsure, CPU, live=torch.tensor([True, False, False, False])) == 0
    mixed = torch.cat([unsure[:1], sure[:3]])
    assert choose_tree_size(mixed, CPU) == 1
    assert choose_tree_size(mixed, CPU, live=torch.tensor([True, False, False, False])) == 0


def test_step_costs_learn_each_width_from_the_call_s_steps():
    costs = StepCosts(CPU)
    assert costs(8) == CPU(8) and costs.overhead == 0
    clock = 0.0
    # the first two steps compile (the drafter's second draft), and so does the first at each width
    for width, seconds in [(16, 50.0), (16, 40.0), (16, 0.2), (16, 0.2), (4, 30.0), (4, 0.1), (16, 0.2), (4, 0.1)]:
        costs.step_begins(width, clock)
        clock += seconds
    costs.step_begins(1, clock)
    assert costs.seconds[16] == pytest.approx([0.2] * 3) and costs.seconds[4] == pytest.approx([0.1] * 2)
    assert costs.seconds[1] == []  # the step under way
    assert costs(16) == pytest.approx(0.2) and costs(4) == pytest.approx(0.1)
    # a width not measured: the curve, scaled as the measured widths are (0.3 s where the curve says 0.15)
    assert costs(8) == pytest.approx(CPU(8) * 0.3 / (CPU(16) + CPU(4)))
    costs.step_begins(4, clock + 0.1)
    costs.step_begins(4, clock + 5.1)  # the median shrugs off one stalled step
    assert len(costs.seconds[4]) == 3
    assert costs(1) == pytest.approx(CPU(1) * (0.2 + 0.1) / (CPU(16) + CPU(4)))
    assert costs(4) == pytest.approx(0.1)


def run_steps(costs: LoopCosts, steps) -> None:
    """Feed `costs` steps of (tokens verified, verification seconds, the rest of the step's seconds)."""
    clock = 0.0
    for tokens, verify, rest in steps:
        costs.step_begins(clock)
        costs.verified(tokens, verify)
        clock += verify + rest
    costs.step_begins(clock)


def test_loop_costs_learn_what_the_call_s_verifications_cost():
    costs = LoopCosts(CPU, prior_steps=8)
    assert [costs(k) for k in (1, 2, 5, 9)] == [CPU(k) for k in (1, 2, 5, 9)] and costs.overhead == 0
    # the loop's verifications cost 2 ms + 1 ms a token more than the curve, its other work 5 ms a step
    truth = lambda k: CPU(k) + 0.002 + 0.001 * (k - 1)  # noqa: E731
    run_steps(costs, [(k, truth(k), 0.005) for k in (1, 3, 5, 9, 12, 6) * 50])
    assert costs.overhead == pytest.approx(0.005)
    assert costs.excess == pytest.approx((0.002, 0.001), rel=0.05)  # 300 steps against a prior of 8
    assert costs(7) == pytest.approx(truth(7), rel=0.01)
    # the fit leans on the curve before the steps say much: 2 steps, each 10 ms over
    few = LoopCosts(CPU, prior_steps=8)
    run_steps(few, [(4, CPU(4) + 0.010, 0.005)] * 2)
    assert 0 < few(4) - CPU(4) < 0.010 / 4
    # one step on a stalled machine moves the fit by at most a quarter of the curve, shrunk
    slow = LoopCosts(CPU, prior_steps=8)
    run_steps(slow, [(4, 10.0, 0.005)])
    assert slow.excess[0] <= CPU(4) / 4 / 9


def flat_auto_setup(tree_oracle, monkeypatch):
    """A tiny llama, a block-4 drafter whose right token is its runner-up at depth 1 (the tree oracle), a 5-token
    prompt, and a flat measured cost curve."""
    target = make_target("llama")
    drafter = make_drafter(target, block_size=4)
    ids, _ = left_padded(1, lengths=[5])
    tree_oracle([1, 0, 0])
    with_costs(monkeypatch, FLAT)
    return target, drafter, ids


def test_auto_feeds_its_steps_to_the_loop_costs(tree_oracle, monkeypatch):  # noqa: F811
    target, drafter, ids = flat_auto_setup(tree_oracle, monkeypatch)
    seen = []
    monkeypatch.setattr(LoopCosts, "verified", lambda self, tokens, seconds: seen.append((tokens, seconds)))
    counter = ForwardCounter(target)
    target.generate(ids, do_sample=False, max_new_tokens=13, assistant_model=drafter, draft_tree_size="auto")
    assert [tokens for tokens, _ in seen] == counter.tokens[1:]  # every verification after the prefill, timed
    assert all(seconds > 0 for _, seconds in seen)


def test_node_calibration_tempers_an_overconfident_drafter():
    # a root with two children (slots 1 and 3, depth 1) and a grandchild (slot 2, depth 2): scores 0.9, 0.8, 0.1;
    # the target always takes slot 1 and never slot 2 or 3
    tree = DraftTree(
        tokens=torch.tensor([[5, 6, 7, 8]]), parents=torch.tensor([[-1, 0, 1, 0]]), depths=torch.tensor([[0, 1, 2, 1]]),
        scores=torch.tensor([[0.9, 0.8, 0.1]], dtype=torch.float64),
    )
    calibration = NodeCalibration(max_depth=3, prior_steps=4)
    assert torch.equal(calibration(tree), tree.scores)  # nothing seen yet: the drafter's own scores
    for _ in range(16):
        calibration.update(tree, path=torch.tensor([[0, 1, 0]]), accepted=torch.tensor([1]))
    assert calibration.observed.tolist() == [16, 0, 0]
    assert calibration.predicted.tolist() == pytest.approx([16 * 1.0, 16 * 0.8, 0])
    # per depth: (observed + 4 x the depth's mean score) / (predicted + 4 x the mean score); depth 1's nodes score
    # 0.5 on average (0.9 and 0.1) and were taken half the time: calibrated
    depth2 = 3.2 / (12.8 + 3.2)
    assert calibration(tree)[0].tolist() == pytest.approx([0.9, depth2 * 0.8, 0.1])
    assert choose_tree_size(tree.scores, FLAT) == 3
    gentle = ForwardCosts((1, 2, 3, 4), (0.010, 0.011, 0.013, 0.020))
    assert choose_tree_size(tree.scores, gentle) == 2  # 2.7 tokens in 1.3 steps
    assert choose_tree_size(calibration(tree), gentle) == 1  # the deep node stopped paying
    # a batch of two rows: one accepted slots 1 and 2, the other nothing
    two = DraftTree(tree.tokens.repeat(2, 1), tree.parents.repeat(2, 1), tree.depths.repeat(2, 1),
                    tree.scores.repeat(2, 1))
    calibration.update(two, torch.tensor([[0, 1, 2], [0, 0, 0]]), torch.tensor([2, 0]))
    assert calibration.observed.tolist() == [17, 1, 0]
    assert calibration.nodes.tolist() == [36, 18, 0]
    # a stopped row (the fixed-shape path keeps it in the batch) adds nothing
    both = torch.tensor([[0, 1, 2], [0, 1, 2]])
    calibration.update(two, both, torch.tensor([2, 2]), live=torch.tensor([False, True]))
    assert calibration.observed.tolist() == [18, 2, 0]
    assert calibration.nodes.tolist() == [38, 19, 0]


def test_measure_and_cache(costs_dir, monkeypatch):
    target = make_target("qwen3", dtype=torch.float32)
    costs = measure_forward_costs(target, sizes=(1, 4), context=16, repeats=2)
    assert costs.tokens == (1, 4) and all(t > 0 for t in costs.seconds)
    loaded = load_forward_costs(target, batch_size=2, sizes=(1, 4), context=16, repeats=2)
    files = list(costs_dir.glob("forward_costs-*.json"))
    assert len(files) == 1
    saved = json.loads(files[0].read_text())
    assert saved["key"]["batch_size"] == 2 and saved["key"]["dtype"] == "torch.float32"
    assert tuple(saved["seconds"]) == loaded.seconds

    def fail(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr(forward_costs, "measure_forward_costs", fail)
    assert load_forward_costs(target, batch_size=2, sizes=(1, 4), context=16, repeats=2) == loaded  # from disk
    with pytest.raises(AssertionError, match="measured again"):  # another batch size is another measurement
        load_forward_costs(target, batch_size=3, sizes=(1, 4), context=16, repeats=2)
    # another CPU is another measurement: a cache folder may travel with a home directory or an image
    assert saved["key"]["device"] == f"cpu ({forward_costs.cpu_description()})"
    monkeypatch.setattr(forward_costs, "cpu_description", lambda: "Other CPU (avx2)")
    with pytest.raises(AssertionError, match="measured again"):
        load_forward_costs(target, batch_size=2, sizes=(1, 4), context=16, repeats=2)


def test_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_DFLASH_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert forward_costs.forward_costs_dir() == tmp_path / "hf" / "hf_dflash" / "forward_costs"
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert forward_costs.forward_costs_dir() == tmp_path / "xdg" / "hf_dflash" / "forward_costs"


def with_costs(monkeypatch, costs):
    monkeypatch.setattr("hf_dflash.generation.proposer.load_forward_costs", lambda target, batch_size: costs)


@pytest.mark.parametrize("costs, tokens", [(FLAT, [5] + [32] * 3), (STEEP, [5] + [1] * 12)])
def test_auto_follows_the_cost_curve(costs, tokens, tree_oracle, monkeypatch):  # noqa: F811
    target = make_target("llama")
    drafter = make_drafter(target, block_size=4)
    drafter.config.dflash_config["assistant_confidence_threshold"] = 0.9  # ignored by "auto"
    ids, _ = left_padded(1, lengths=[5])
    plain = target.generate(ids, do_sample=False, max_new_tokens=13)
    tree_oracle([1, 0, 0])
    # in units a real step cannot tip ("auto" adds the rest of a step, measured, to every choice's cost,
    # and on a loaded machine they can exceed a fake 10 ms forward)
    with_costs(monkeypatch, ForwardCosts(costs.tokens, tuple(100 * t for t in costs.seconds)))
    counter = ForwardCounter(target)
    out = target.generate(ids, do_sample=False, max_new_tokens=13, assistant_model=drafter, draft_tree_size="auto")
    assert torch.equal(out, plain)
    # flat: the largest tree the curve covers (31 nodes + the root); steep: the oracle's drafter is unsure
    # (0.5 for its favourite) and verifying k tokens costs k one-token steps: no drafts
    assert counter.tokens == tokens


def test_auto_keeps_the_explicit_overrides(tree_oracle, monkeypatch):  # noqa: F811
    target, drafter, ids = flat_auto_setup(tree_oracle, monkeypatch)
    counter = ForwardCounter(target)
    kwargs = dict(do_sample=False, max_new_tokens=13, assistant_model=drafter, draft_tree_size="auto")
    out = target.generate(ids, num_assistant_tokens=1, return_dict_in_generate=True, **kwargs)
    assert out.acceptance_lengths[0] == [2] * 6  # depth 1: the runner-up accepted, nothing below
    counter.tokens.clear()
    target.generate(ids, assistant_confidence_threshold=0.6, **kwargs)
    assert counter.tokens == [5] + [1] * 12  # the favourite's 0.5 is under the explicit threshold


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_auto_is_lossless_with_measured_costs(arch, costs_dir):
    target = make_target(arch)
    drafter = make_drafter(target, block_size=5)
    drafter.config.dflash_config["draft_tree_size"] = "auto"  # the drafter's default
    ids, mask = left_padded(3)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
    out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, assistant_model=drafter)
    assert torch.equal(out, plain)
    assert len(list(costs_dir.glob("forward_costs-*.json"))) == 1  # measured once, for batch 3


def test_time_forwards_masks_what_the_loop_masks():
    target = make_target("llama")
    masks = {}

    def record(module, args, kwargs):  # the timed forwards (the cache's prefill has no position ids)
        if kwargs.get("position_ids") is not None:
            masks.setdefault(kwargs["input_ids"].shape[1], kwargs.get("attention_mask"))

    hook = target.register_forward_pre_hook(record, with_kwargs=True)
    forward_costs.time_forwards(target, [1, 3], context=6, repeats=1, tree=True)
    assert masks[1].dim() == 4 and masks[3].dim() == 4  # on a CPU the one-token step too (`mask_one_token`)
    masks.clear()
    forward_costs.time_forwards(target, [1, 3], context=6, repeats=1)
    assert masks[1] is None and masks[3] is None  # chains: the causal mask
    hook.remove()


def test_sizes_kept_are_the_powers_of_two_and_real_departures():
    # a float32-like curve: t(13..15) well above the line to t(16), t(3) below it; the rest within noise
    seconds = {k: 0.05 + 0.005 * k for k in range(1, 17)} | {32: 0.25}
    seconds |= {3: 0.05, 13: 0.175, 14: 0.18, 15: 0.172, 6: 0.08 * 1.05, 12: 0.11 * 0.95}
    kept = forward_costs._significant_points(seconds)
    assert sorted(kept) == [1, 2, 3, 4, 8, 13, 14, 15, 16, 32]
    assert all(kept[k] == seconds[k] for k in kept)
    # explicit sizes that are not powers of two: the ends are the base
    assert sorted(forward_costs._significant_points({3: 1.0, 5: 2.0, 6: 2.5})) == [3, 6]
    assert sorted(forward_costs._significant_points({3: 1.0, 5: 3.0, 6: 2.5})) == [3, 5, 6]
