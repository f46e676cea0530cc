"""The same losslessness on a CUDA device (skipped without one; CI has none): the loop's tensors, masks, trees and
cost measurement must all live on the target's device. float64 where token equality is asserted, as on the CPU."""

import pytest
import torch

from conftest import MASK, left_padded, make_drafter, make_target
from test_bigram import record_proposals, with_prior

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def on_cuda(arch: str, block_size: int, dtype=torch.float64):
    target = make_target(arch).to("cuda", dtype)
    return target, make_drafter(target, block_size=block_size).to("cuda", dtype)


def generate(target, ids, mask, **kwargs):
    return target.generate(ids.cuda(), attention_mask=mask.cuda(), max_new_tokens=24, **kwargs)


@pytest.mark.parametrize("arch", ["qwen3", "llama", "gemma3"])
@pytest.mark.parametrize("batch", [1, 3])
def test_chain_and_trees_match_plain_greedy(arch, batch):
    target, drafter = on_cuda(arch, block_size=5)
    ids, mask = left_padded(batch)
    plain = generate(target, ids, mask, do_sample=False)
    assert plain.device.type == "cuda"
    for size in (0, 2, 9, 40):
        fast = generate(target, ids, mask, do_sample=False, assistant_model=drafter, draft_tree_size=size)
        assert torch.equal(fast, plain), f"draft_tree_size={size}"


def test_auto_measures_cuda_costs_and_stays_lossless(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DFLASH_CACHE", str(tmp_path))
    target, drafter = on_cuda("qwen3", block_size=8)
    ids, mask = left_padded(2)
    plain = generate(target, ids, mask, do_sample=False)
    fast = generate(target, ids, mask, do_sample=False, assistant_model=drafter, draft_tree_size="auto")
    assert torch.equal(fast, plain)
    assert len(list((tmp_path / "forward_costs").glob("forward_costs-*.json"))) == 1


@pytest.mark.parametrize("size", [0, 9])
def test_sampling_with_top_k_1_is_greedy(size):
    target, drafter = on_cuda("qwen3", block_size=5)
    ids, mask = left_padded(3)
    plain = generate(target, ids, mask, do_sample=False)
    sampled = generate(target, ids, mask, do_sample=True, top_k=1, assistant_model=drafter, draft_tree_size=size)
    assert torch.equal(sampled, plain)


def test_bfloat16_runs_and_reports_acceptance():
    target, drafter = on_cuda("qwen3", block_size=8, dtype=torch.bfloat16)
    ids, mask = left_padded(2)
    out = generate(target, ids, mask, do_sample=False, assistant_model=drafter, return_dict_in_generate=True)
    assert out.sequences.shape == (2, ids.shape[1] + 24)
    # every token after the prefill's first is counted once, in the step that committed it
    assert [sum(lengths) for lengths in out.acceptance_lengths] == [23, 23]


def test_the_loop_runs_without_cudnn_attention():
    # cuDNN attention builds a graph per new key length (~60 ms on an H200), and every step has a new one
    target, drafter = on_cuda("qwen3", block_size=8, dtype=torch.bfloat16)
    seen = []

    def record(*_):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())

    handles = [m.register_forward_pre_hook(record) for m in (target, drafter)]
    ids, mask = left_padded(2)
    try:
        generate(target, ids, mask, do_sample=False, assistant_model=drafter)
    finally:
        for handle in handles:
            handle.remove()
    assert len(seen) > 2 and not any(seen)
    assert torch.backends.cuda.cudnn_sdp_enabled()  # restored for the user's other work


def test_bigram_prior_on_cuda_is_lossless_and_changes_the_drafts(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DFLASH_CACHE", str(tmp_path))
    target, drafter = on_cuda("qwen3", block_size=5)
    with_prior(drafter.cpu(), MASK + 1).to("cuda")  # the prior's buffers travel with the drafter
    assert drafter.bigram_prior[0].device.type == "cuda"
    ids, mask = left_padded(3)
    plain = generate(target, ids, mask, do_sample=False)
    proposals = record_proposals(monkeypatch)
    keys, boosts, _ = drafter.bigram_prior
    for size in (0, 9, "auto"):
        for prior in ((None, None), (keys, boosts)):
            drafter.set_bigram_prior(*prior, beta=1.0)
            fast = generate(target, ids, mask, do_sample=False, assistant_model=drafter, draft_tree_size=size)
            assert torch.equal(fast, plain), f"draft_tree_size={size}, prior={prior[0] is not None}"
    assert proposals[True] != proposals[False]
