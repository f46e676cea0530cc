"""Greedy losslessness of `target.generate(assistant_model=drafter)`: token-identical to plain greedy."""

import pytest
import torch

from hf_dflash.generation import decoder as decoder_module

from conftest import ARCHITECTURES, PAD, ForwardCounter, left_padded, make_drafter, make_target


def plain_and_dflash(target, drafter, ids, mask, **kwargs):
    plain = target.generate(ids, attention_mask=mask, do_sample=False, **kwargs)
    fast = target.generate(ids, attention_mask=mask, do_sample=False, assistant_model=drafter, **kwargs)
    return plain, fast


@pytest.mark.parametrize("block_size", [2, 3, 8, 16])
@pytest.mark.parametrize("max_new_tokens", [1, 2, 5, 8, 21])
def test_random_drafter_matches_plain_greedy(block_size, max_new_tokens):
    target = make_target("qwen3")
    drafter = make_drafter(target, block_size=block_size)
    ids, mask = left_padded(3)
    plain, fast = plain_and_dflash(target, drafter, ids, mask, max_new_tokens=max_new_tokens)
    assert torch.equal(plain, fast)


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
@pytest.mark.parametrize("correct_upto", [None, 0, 2, "random"])
def test_oracle_drafter_matches_plain_greedy(arch, correct_upto, oracle):
    target = make_target(arch)
    drafter = make_drafter(target, block_size=5)
    ids, mask = left_padded(4)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24)
    oracle(correct_upto=correct_upto)
    out = target.generate(
        ids, attention_mask=mask, do_sample=False, max_new_tokens=24, assistant_model=drafter,
        return_dict_in_generate=True,
    )
    assert torch.equal(plain, out.sequences)
    taus = [sum(a) / len(a) for a in out.acceptance_lengths]
    if correct_upto is None:
        assert min(taus) > 4.0  # block 5: nearly every step commits 5 tokens
    elif correct_upto == 0:
        assert max(taus) == 1.0


@pytest.mark.parametrize("arch", ["gemma3", "qwen3"])
def test_batched_equals_each_row_alone(arch, oracle, monkeypatch):
    """Rows keeping different numbers of verified slots: gemma3 (sliding windows shorter than the outputs) moves
    each row's rejected slots to its left end; qwen3 (full attention only) leaves them in place, masked."""
    holes, uneven = [], []  # per call: holes allowed; per step: rows kept different numbers of slots
    allowed, keep_verified = decoder_module.holes_allowed, decoder_module.keep_verified
    monkeypatch.setattr(decoder_module, "holes_allowed", lambda *a: holes.append(allowed(*a)) or holes[-1])
    monkeypatch.setattr(
        decoder_module, "keep_verified",
        lambda cache, valid, keep, shift: uneven.append(len(set(keep.sum(-1).tolist())) > 1)
        or keep_verified(cache, valid, keep, shift),
    )
    target = make_target(arch)
    drafter = make_drafter(target, block_size=4)
    ids, mask = left_padded(4, lengths=[3, 9, 6, 1])
    oracle(correct_upto="random", seed=3)
    batched = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30, assistant_model=drafter)
    for row in range(4):
        start = int((mask[row] == 0).sum())
        alone = target.generate(ids[row : row + 1, start:], do_sample=False, max_new_tokens=30, assistant_model=drafter)
        assert torch.equal(alone[0], batched[row, start:])
    assert holes == [arch == "qwen3"] * 5  # the batch, then each row alone
    assert sum(uneven) >= 3


def test_accepts_several_tokens_per_target_forward(oracle):
    target = make_target("llama")
    drafter = make_drafter(target, block_size=4)
    ids, _ = left_padded(1, lengths=[5])
    oracle(correct_upto=None)
    counter = ForwardCounter(target)
    out = target.generate(ids, do_sample=False, max_new_tokens=13, assistant_model=drafter)
    assert out.shape[1] == 5 + 13
    # 13 tokens in 4 target forwards: the prefill's token, then 3 verifications committing 4 each
    assert counter.tokens == [5, 4, 4, 4]


@pytest.mark.parametrize("where", ["argument", "generation_config"])
def test_num_assistant_tokens_shortens_the_block(where, oracle):
    from transformers import GenerationConfig

    target = make_target("llama")
    drafter = make_drafter(target, block_size=8)
    ids, _ = left_padded(1, lengths=[5])
    plain = target.generate(ids, do_sample=False, max_new_tokens=13)
    oracle(correct_upto=None)
    counter = ForwardCounter(target)
    if where == "argument":
        kwargs = {"num_assistant_tokens": 3}
    else:
        kwargs = {"generation_config": GenerationConfig(num_assistant_tokens=3, max_new_tokens=13)}
    out = target.generate(ids, do_sample=False, max_new_tokens=13, assistant_model=drafter, **kwargs)
    assert torch.equal(out, plain)
    assert counter.tokens == [5, 4, 4, 4]  # 3 drafts + the newest token per verification, not the block of 8
    counter.tokens.clear()
    target.generate(ids, do_sample=False, max_new_tokens=13, assistant_model=drafter, num_assistant_tokens=0)
    assert counter.tokens == [5] + [1] * 12  # no drafts: one token per target forward
    with pytest.raises(ValueError, match="num_assistant_tokens=-1"):
        target.generate(ids, max_new_tokens=3, assistant_model=drafter, num_assistant_tokens=-1)


def test_confidence_threshold_skips_unsure_blocks(oracle):
    target = make_target("llama")
    drafter = make_drafter(target, block_size=4)
    ids, _ = left_padded(1, lengths=[5])
    plain = target.generate(ids, do_sample=False, max_new_tokens=13)
    oracle(correct_upto=None)  # right drafts, but the confidence is the random drafter's: far below 0.9
    counter = ForwardCounter(target)
    out = target.generate(ids, do_sample=False, max_new_tokens=13, assistant_model=drafter,
                          assistant_confidence_threshold=0.9)
    assert torch.equal(out, plain)
    assert counter.tokens == [5] + [1] * 12  # every step skipped its drafts: one-token target forwards
    counter.tokens.clear()
    drafter.config.dflash_config["assistant_confidence_threshold"] = 0.9  # the drafter's own default
    out = target.generate(ids, do_sample=False, max_new_tokens=13, assistant_model=drafter,
                          return_dict_in_generate=True)
    assert torch.equal(out.sequences, plain)
    assert counter.tokens == [5] + [1] * 12
    assert out.draft_lengths == [[0] * 12] and out.acceptance_lengths == [[1] * 12]
    counter.tokens.clear()
    target.generate(ids, do_sample=False, max_new_tokens=13, assistant_model=drafter, assistant_confidence_threshold=0)
    assert counter.tokens == [5, 4, 4, 4]  # the argument wins over the drafter's default; 0 never skips
    with pytest.raises(ValueError, match="assistant_confidence_threshold=1.5"):
        target.generate(ids, max_new_tokens=3, assistant_model=drafter, assistant_confidence_threshold=1.5)


@pytest.mark.parametrize("sure_rows", [0, 1])
def test_confidence_threshold_skips_only_when_every_row_is_unsure(sure_rows, oracle, monkeypatch):
    from hf_dflash.generation import DFlashProposer

    target = make_target("qwen3")
    drafter = make_drafter(target, block_size=4)
    ids, mask = left_padded(3)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=9)
    oracle(correct_upto=None)
    propose = DFlashProposer.draft_chain  # the oracle

    def unsure(self, decoder, verify_len):  # the first `sure_rows` rows of the batch are sure of their drafts
        drafts, _ = propose(self, decoder, verify_len)
        return drafts, torch.tensor([0.9 if row < sure_rows else 0.1 for row in decoder.rows.tolist()])

    monkeypatch.setattr(DFlashProposer, "draft_chain", unsure)
    counter = ForwardCounter(target)
    out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=9, assistant_model=drafter,
                          assistant_confidence_threshold=0.5)
    assert torch.equal(out, plain)
    # tokens per row of each verification: one sure row keeps the whole batch on full blocks
    assert counter.tokens[1:] == ([4, 4] if sure_rows else [1] * 8)


def test_eos_inside_an_accepted_block(oracle):
    target = make_target("qwen3")
    drafter = make_drafter(target, block_size=8)
    ids, mask = left_padded(2)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
    eos = int(plain[0, ids.shape[1] + 4])  # row 0's 5th new token
    oracle(correct_upto=None)
    plain, fast = plain_and_dflash(target, drafter, ids, mask, max_new_tokens=20, eos_token_id=eos)
    assert torch.equal(plain, fast)
    assert (fast[0, ids.shape[1] :] == eos).nonzero()[0].item() <= 4  # row 0 stopped inside a block


def test_max_length_instead_of_max_new_tokens(oracle):
    target = make_target("qwen3")
    drafter = make_drafter(target, block_size=6)
    ids, mask = left_padded(3)
    oracle(correct_upto=None)
    plain, fast = plain_and_dflash(target, drafter, ids, mask, max_length=ids.shape[1] + 9)
    assert torch.equal(plain, fast)


@pytest.mark.parametrize("draft_vocab", [None, range(2, 60)])
def test_drafter_in_another_dtype_is_cast(draft_vocab):
    target = make_target("qwen3", dtype=torch.float32)
    drafter = make_drafter(target).to(torch.bfloat16)
    drafter.set_draft_vocab(draft_vocab)
    head = target.get_output_embeddings()
    linear, rows = drafter.draft_head(head)  # drafts are scored in the drafter's dtype, the target's in its own
    weight = linear.weight
    assert weight.dtype == torch.bfloat16 and head.weight.dtype == torch.float32
    assert torch.equal(weight, head.weight.to(torch.bfloat16) if rows is None else head.weight[rows].to(torch.bfloat16))
    ids, mask = left_padded(2)
    plain, fast = plain_and_dflash(target, drafter, ids, mask, max_new_tokens=12)
    assert torch.equal(plain, fast)


def test_draft_vocab_is_lossless_and_confines_drafts(monkeypatch):
    from hf_dflash.generation import DFlashProposer

    target = make_target("qwen3")
    drafter = make_drafter(target, block_size=4)
    allowed = torch.arange(2, 50)
    drafter.set_draft_vocab(allowed.tolist())
    seen = []
    propose = DFlashProposer.draft_chain
    monkeypatch.setattr(DFlashProposer, "draft_chain", lambda self, *a: seen.append(propose(self, *a)) or seen[-1])
    ids, mask = left_padded(3)
    plain, fast = plain_and_dflash(target, drafter, ids, mask, max_new_tokens=12)
    assert torch.equal(plain, fast)
    assert seen and all(torch.isin(drafts, allowed).all() for drafts, _ in seen)


@pytest.mark.parametrize("offload", ["cpu", "disk"])
@pytest.mark.parametrize("draft_vocab", [None, range(2, 60)])
@pytest.mark.parametrize("tree_size", [0, "auto"])
def test_offloaded_target(offload, draft_vocab, tree_size, oracle, tmp_path, monkeypatch):
    """A target whose weights accelerate keeps elsewhere between forwards (`device_map` with "cpu" / "disk" entries;
    here `cpu_offload` / `disk_offload`: meta placeholders on the module): the drafter reads the target's embedding
    and output head through the offload's own copy, and the output stays plain `generate`'s."""
    from accelerate import cpu_offload, disk_offload

    monkeypatch.setenv("HF_DFLASH_CACHE", str(tmp_path / "cache"))  # "auto" times the offloaded target's forwards
    target = make_target("qwen3")
    drafter = make_drafter(target)
    drafter.set_draft_vocab(draft_vocab)
    oracle(correct_upto="random")
    ids, mask = left_padded(2)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=13)
    if offload == "cpu":
        cpu_offload(target, execution_device="cpu")
    else:
        disk_offload(target, str(tmp_path / "offload"), execution_device="cpu")
    assert target.get_input_embeddings().weight.device.type == "meta"
    fast = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=13, assistant_model=drafter,
                           draft_tree_size=tree_size)
    assert torch.equal(plain, fast)


@pytest.mark.parametrize(
    "setting, expected",
    [
        (dict(output_attentions=True, return_dict_in_generate=True), "output_attentions=True is ignored"),
        (dict(prompt_lookup_num_tokens=3), "prompt_lookup_num_tokens=3 is ignored"),
        (dict(assistant_early_exit=2), "assistant_early_exit=2 is ignored"),
        (dict(num_assistant_tokens_schedule="heuristic"), "num_assistant_tokens_schedule='heuristic' is ignored"),
        (dict(num_assistant_tokens_schedule="constant"), None),
    ],
)
def test_settings_of_other_methods_are_said_to_be_ignored(setting, expected):
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging

    target = make_target("qwen3")
    drafter = make_drafter(target)
    ids, mask = left_padded(1, lengths=[7])
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=6)
    logger = logging.get_logger("hf_dflash.generation")
    type(logger).warning_once.cache_clear()
    with CaptureLogger(logger) as captured:
        out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=6, assistant_model=drafter,
                              **setting)
    assert torch.equal(out if torch.is_tensor(out) else out.sequences, plain)
    assert (expected in captured.out) if expected else captured.out == ""


def test_outputs_are_ordinary_tensors(oracle):
    """The loop runs in inference mode, but what it returns is used as plain `generate`'s is: written in place, fed
    to a model that is being trained (inference tensors allow neither)."""
    target = make_target("qwen3", dtype=torch.float32)
    drafter = make_drafter(target)
    oracle()
    ids, mask = left_padded(2)
    out = target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=9, do_sample=False,
                          return_dict_in_generate=True, output_scores=True, output_logits=True)
    assert max(map(max, out.acceptance_lengths)) > 1  # drafts were accepted: the loop ran its multi-token path
    for tensor in (out.sequences, *out.scores, *out.logits):
        assert not tensor.is_inference()
    out.sequences[:, 0] = PAD
    out.scores[0].add_(1.0)
    target.get_input_embeddings()(out.sequences).sum().backward()  # the ids are saved for backward
    assert target.get_input_embeddings().weight.grad is not None


@pytest.mark.parametrize("given", [None, "cache", "static", "offloaded"])
def test_a_given_cache_is_left_alone_and_said_so(given):
    """The loop keeps its own target cache: a prefilled `cache` is neither read nor extended and another
    cache implementation is not used, with one warning naming it; "static" selects the fixed-shape path (its only
    warning: on a CPU, that it runs uncompiled); the output is plain `generate`'s."""
    from transformers import DynamicCache
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging

    target = make_target("qwen3")
    drafter = make_drafter(target)
    ids, mask = left_padded(1, lengths=[7])
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=10)
    kwargs, cache = {}, None
    if given == "cache":
        cache = DynamicCache(config=target.config)
        with torch.no_grad():
            target(ids[:, :3], cache=cache)
        kwargs["cache"] = cache
    elif given is not None:
        kwargs["cache_implementation"] = given
    logger = logging.get_logger("hf_dflash.generation")
    type(logger).warning_once.cache_clear()
    with CaptureLogger(logger) as captured:
        fast = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=10, assistant_model=drafter,
                               **kwargs)
    assert torch.equal(fast, plain)
    expected = {
        None: "",
        "cache": "does not read or extend the given cache (3 cached tokens)",
        "static": "runs DFlash's fixed-shape path uncompiled on cpu",
        "offloaded": "uses its own DynamicCache, not an offloaded DynamicCache",
    }[given]
    assert expected in captured.out and bool(captured.out) == bool(expected)
    if cache is not None:
        assert cache.get_seq_length() == 3
