"""The rest of what `generate` offers works with a DFlash drafter as without one: logits processors that read
input_ids, stopping criteria of every kind (checked at every committed token, not per block), streamers, dict outputs
with scores and logits, acceptance statistics, num_return_sequences, the explicit API, and drafts capped to the
tokens left."""

import threading

import pytest
import torch
from transformers import (
    GenerationConfig,
    StoppingCriteria,
    StoppingCriteriaList,
    TextIteratorStreamer,
    TextStreamer,
)

import hf_dflash

from conftest import ForwardCounter, Recorder, left_padded, make_drafter, make_target, make_tokenizer

NEW = 20


@pytest.fixture(scope="module")
def target():
    return make_target("qwen3")


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="module")
def prompts():
    return left_padded(3)  # lengths 7, 5, 3


def greedy(target, ids, mask=None, drafter=None, max_new_tokens=NEW, **kwargs):
    return target.generate(
        ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens, assistant_model=drafter, **kwargs
    )


def new_tokens(sequences, ids):
    return sequences[:, ids.shape[1] :]


def padding_eos(sequences) -> int:
    """An EOS id the sequences never contain. Plain `generate` pads the rows that stopped only when an EOS token is
    set (without one it keeps generating them until every row stops); DFlash always pads them."""
    used = set(sequences.flatten().tolist())
    return next(t for t in range(2, 95) if t not in used)


# --- logits processors that read input_ids -------------------------------------------------------------------


def allowed_by_row(batch_id, ids):
    """Row-dependent constraint: row r may only produce ids congruent to r or r + 1 modulo 3."""
    return [t for t in range(96) if t % 3 in (batch_id % 3, (batch_id + 1) % 3)]


@pytest.mark.parametrize(
    "setting", ["repetition_penalty", "no_repeat_ngram_size", "min_new_tokens", "prefix_allowed_tokens_fn"]
)
def test_input_dependent_processors(target, prompts, oracle, setting):
    """Processors that read the ids, or per-row state (repetition_penalty ignores each row's left padding;
    prefix_allowed_tokens_fn gets the row index), while rows commit different numbers of tokens per step."""
    ids, mask = prompts
    unprocessed = greedy(target, ids, mask)
    if setting == "min_new_tokens":
        eos = int(new_tokens(unprocessed, ids)[0, 1])  # row 0 would stop at its 2nd token
        kwargs = dict(min_new_tokens=6, eos_token_id=eos)
    elif setting == "prefix_allowed_tokens_fn":
        kwargs = dict(prefix_allowed_tokens_fn=allowed_by_row)
    else:
        kwargs = {setting: 1.5 if setting == "repetition_penalty" else 2}
    plain = greedy(target, ids, mask, **kwargs)
    assert not torch.equal(plain, unprocessed)  # the processor changes the output
    oracle(correct_upto="random", seed=1)
    fast = greedy(target, ids, mask, make_drafter(target, block_size=5), **kwargs)
    assert torch.equal(fast, plain)
    if setting == "min_new_tokens":
        assert not (new_tokens(fast, ids)[:, :6] == eos).any()


def test_classifier_free_guidance(target, prompts, oracle):
    """guidance_scale: its processor runs the target on the unconditional ids with a cache of its own, one token per
    call. The loop calls processors position by position only as far as the drafts match, so for one prompt the
    calls follow the committed text as in plain `generate` (the guidance's float64 output in the float64 target
    kept as it is); for several prompts, whose rows commit different numbers of tokens, a clear error."""
    ids, mask = prompts
    plain = greedy(target, ids[:1], mask[:1], guidance_scale=1.5)
    assert not torch.equal(plain, greedy(target, ids[:1], mask[:1]))  # the guidance changes the output
    oracle(correct_upto="random", seed=2)
    fast = greedy(target, ids[:1], mask[:1], make_drafter(target, block_size=5), guidance_scale=1.5)
    assert torch.equal(fast, plain)
    with pytest.raises(ValueError, match="guidance_scale with a batch of several prompts.*one prompt at a time"):
        greedy(target, ids, mask, make_drafter(target, block_size=5), guidance_scale=1.5)


def test_user_callbacks_get_ordinary_tensors(target, oracle):
    """The loop runs in inference mode; logits processors, stopping criteria and streamers are user code and run as in
    plain `generate` (no_grad): what they keep of the tensors they get can be written in place after the call."""
    from transformers import LogitsProcessor, LogitsProcessorList

    kept = []

    class KeepingProcessor(LogitsProcessor):
        def __call__(self, input_ids, scores):
            kept.extend([input_ids, scores])
            return scores.add_(0.0)  # processors may work in place

    class KeepingCriterion(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            kept.extend([input_ids, scores])
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    class KeepingStreamer(Recorder):
        def put(self, value):
            kept.append(value)

    ids, mask = left_padded(3)  # not the module's prompts: generate streams the prompt itself, which is written below
    oracle(correct_upto="random", seed=3)
    greedy(target, ids, mask, make_drafter(target, block_size=5), max_new_tokens=8, streamer=KeepingStreamer(),
           logits_processor=LogitsProcessorList([KeepingProcessor()]),
           stopping_criteria=StoppingCriteriaList([KeepingCriterion()]))
    assert len(kept) > 8
    for tensor in kept:
        assert not tensor.is_inference()
        tensor.add_(1)


# --- stopping ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["kwarg", "generation_config"])
def test_stop_strings_inside_an_accepted_block(target, prompts, tokenizer, oracle, where):
    ids, mask = prompts
    unbounded = greedy(target, ids, mask)
    assert tokenizer.decode(new_tokens(unbounded, ids)[0]).startswith("uDio5")  # row 0's text
    stops = ["o5", "w3"]  # row 0 stops at its 5th new token, row 1 at its 11th; row 2 never
    eos = padding_eos(unbounded)
    kwargs = (
        dict(stop_strings=stops, eos_token_id=eos)
        if where == "kwarg"
        else dict(
            generation_config=GenerationConfig(
                stop_strings=stops, eos_token_id=eos, pad_token_id=0, max_new_tokens=NEW, do_sample=False
            )
        )
    )
    plain = greedy(target, ids, mask, tokenizer=tokenizer, **kwargs)
    oracle(correct_upto=None)
    out = greedy(
        target, ids, mask, make_drafter(target, block_size=8), tokenizer=tokenizer, return_dict_in_generate=True,
        **kwargs,
    )
    assert torch.equal(out.sequences, plain)
    texts = tokenizer.batch_decode(new_tokens(plain, ids), skip_special_tokens=True)
    assert texts[0] == "uDio5" and texts[1].endswith("w3")
    # fully accepted blocks of 8 after the prefill's token: both stops fell inside a block and cut it
    assert out.acceptance_lengths[0] == [4] and out.acceptance_lengths[1] == [8, 2]


def test_stop_strings_need_the_tokenizer(target, prompts):
    ids, mask = prompts
    with pytest.raises(ValueError, match="stop_strings need the tokenizer"):
        greedy(target, ids, mask, make_drafter(target), stop_strings=["o5"])


class StopAtSum(StoppingCriteria):
    """Stops a row once the ids it generated add up to `total`: depends on content, not on length."""

    def __init__(self, prompt_len: int, total: int):
        self.prompt_len, self.total = prompt_len, total

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, self.prompt_len :].sum(-1) >= self.total


def test_custom_stopping_criteria_do_not_overshoot(target, prompts, oracle):
    ids, mask = prompts
    criteria = StoppingCriteriaList([StopAtSum(ids.shape[1], 250)])
    eos = padding_eos(greedy(target, ids, mask))
    plain = greedy(target, ids, mask, stopping_criteria=criteria, eos_token_id=eos)
    oracle(correct_upto=None)
    fast = greedy(target, ids, mask, make_drafter(target, block_size=8), stopping_criteria=criteria, eos_token_id=eos)
    assert torch.equal(fast, plain)
    assert fast.shape[1] < ids.shape[1] + NEW  # every row stopped early
    for row in new_tokens(fast, ids):
        first = int((row.cumsum(0) >= 250).nonzero()[0])  # where the criterion first held
        assert first % 8 != 0  # inside a block of 8 (the prefill's token is 0, blocks start at 1, 9, ...)
        assert (row[first + 1 :] == 0).all()  # nothing committed after it: padding only


def test_eos_as_a_list(target, prompts, oracle):
    ids, mask = prompts
    unbounded = new_tokens(greedy(target, ids, mask), ids)
    eos = [int(unbounded[0, 3]), int(unbounded[1, 6])]
    assert eos[0] != eos[1]
    plain = greedy(target, ids, mask, eos_token_id=eos)
    oracle(correct_upto="random", seed=2)
    fast = greedy(target, ids, mask, make_drafter(target, block_size=6), eos_token_id=eos)
    assert torch.equal(fast, plain)
    generated = new_tokens(fast, ids)
    assert int(generated[0, 3]) == eos[0] and (generated[0, 4:] == 0).all()  # stopped, then padded


def test_max_length_from_the_generation_config(target, prompts, oracle):
    ids, mask = prompts
    config = GenerationConfig(max_length=ids.shape[1] + 11, do_sample=False)
    plain = target.generate(ids, attention_mask=mask, generation_config=config)
    oracle(correct_upto=None)
    fast = target.generate(ids, attention_mask=mask, generation_config=config, assistant_model=make_drafter(target))
    assert fast.shape == (3, ids.shape[1] + 11)
    assert torch.equal(fast, plain)


# --- streamers -----------------------------------------------------------------------------------------------


def test_streamer_gets_one_chunk_per_committed_block(target, oracle):
    ids, _ = left_padded(1)
    unbounded = new_tokens(greedy(target, ids), ids)[0].tolist()
    stop = next(i for i in range(9, NEW) if unbounded[i] not in unbounded[:i])  # a first occurrence, 3rd block on
    eos = unbounded[stop]
    oracle(correct_upto=None)
    streamer = Recorder()
    counter = ForwardCounter(target)
    try:
        out = greedy(target, ids, drafter=make_drafter(target, block_size=4), streamer=streamer, eos_token_id=eos)
    finally:
        counter.remove()  # the target is shared by the module's tests
    assert torch.equal(streamer.chunks[0].view(-1), ids.view(-1))  # generate itself puts the prompt first
    assert torch.equal(torch.cat([c.view(-1) for c in streamer.chunks[1:]]), out[0, ids.shape[1] :])
    # the prefill's token, then one chunk per verification: full blocks of 4 and the one cut at the EOS
    assert [c.numel() for c in streamer.chunks[1:]] == [1] + [4] * ((stop - 1) // 4) + [(stop - 1) % 4 + 1]
    assert len(streamer.chunks) - 1 == counter.calls
    assert streamer.ends == 1


def test_text_streamer_prints_what_plain_generate_prints(target, tokenizer, capsys, oracle):
    ids, _ = left_padded(1)
    greedy(target, ids, streamer=TextStreamer(tokenizer))
    plain = capsys.readouterr().out
    oracle(correct_upto=None)
    out = greedy(target, ids, drafter=make_drafter(target), streamer=TextStreamer(tokenizer))
    assert capsys.readouterr().out == plain == tokenizer.decode(out[0]) + "\n"


def test_text_iterator_streamer(target, tokenizer, oracle):
    ids, _ = left_padded(1)
    oracle(correct_upto=None)
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, timeout=60)
    result = {}
    thread = threading.Thread(
        target=lambda: result.update(out=greedy(target, ids, drafter=make_drafter(target), streamer=streamer))
    )
    thread.start()
    text = "".join(streamer)
    thread.join()
    assert text == tokenizer.decode(result["out"][0, ids.shape[1] :])
    assert text == tokenizer.decode(new_tokens(greedy(target, ids), ids)[0])


# --- dict outputs --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 2])
def test_scores_and_logits_match_plain_generate(target, oracle, batch):
    ids, mask = left_padded(batch)
    kwargs = dict(return_dict_in_generate=True, output_scores=True, output_logits=True, repetition_penalty=1.3)
    plain = greedy(target, ids, mask, max_new_tokens=12, **kwargs)
    oracle(correct_upto="random", seed=4)
    fast = greedy(target, ids, mask, make_drafter(target, block_size=4), max_new_tokens=12, **kwargs)
    assert torch.equal(fast.sequences, plain.sequences)
    assert len(fast.scores) == len(fast.logits) == len(plain.scores) == 12
    for mine, theirs in zip(fast.scores, plain.scores):
        torch.testing.assert_close(mine, theirs)
    for mine, theirs in zip(fast.logits, plain.logits):
        torch.testing.assert_close(mine, theirs)
    assert not torch.allclose(fast.scores[3], fast.logits[3])  # scores are processed (repetition penalty)


def test_acceptance_lengths(target, prompts, oracle):
    ids, mask = prompts
    unbounded = new_tokens(greedy(target, ids, mask), ids)
    eos = int(unbounded[1, 7])
    oracle(correct_upto="random", seed=5)
    out = greedy(
        target, ids, mask, make_drafter(target, block_size=5), eos_token_id=eos, return_dict_in_generate=True
    )
    generated = new_tokens(out.sequences, ids)
    assert len(out.acceptance_lengths) == 3
    for row, lengths in enumerate(out.acceptance_lengths):
        hits = (generated[row] == eos).nonzero()
        produced = int(hits[0]) + 1 if hits.numel() else NEW
        assert sum(lengths) == produced - 1  # everything after the prefill's token
        assert all(1 <= n <= 5 for n in lengths)
        drafts = out.draft_lengths[row]  # 4 per step, fewer once max_length leaves the batch less room
        assert len(drafts) == len(lengths) and all(n <= d + 1 for n, d in zip(lengths, drafts))
        assert drafts[0] == 4 and all(a >= b for a, b in zip(drafts, drafts[1:]))
    assert max(max(lengths) for lengths in out.acceptance_lengths) > 1


# --- batching modes and APIs ---------------------------------------------------------------------------------


def test_num_return_sequences_with_sampling(target, prompts):
    ids, mask = prompts
    drafter = make_drafter(target)
    torch.manual_seed(0)
    out = target.generate(
        ids, attention_mask=mask, do_sample=True, temperature=1.5, num_return_sequences=3, max_new_tokens=8,
        assistant_model=drafter,
    )
    assert out.shape == (9, ids.shape[1] + 8)
    assert torch.equal(out[:, : ids.shape[1]], ids.repeat_interleave(3, dim=0))
    for row in range(3):
        assert len({tuple(r) for r in out[3 * row : 3 * row + 3, ids.shape[1] :].tolist()}) > 1
    # top_k=1 sampling is greedy: every copy equals its prompt's greedy continuation (rows stay with their prompt)
    copies = target.generate(
        ids, attention_mask=mask, do_sample=True, top_k=1, num_return_sequences=2, max_new_tokens=8,
        assistant_model=drafter,
    )
    assert torch.equal(copies, greedy(target, ids, mask, max_new_tokens=8).repeat_interleave(2, dim=0))


def test_explicit_api_without_hooks(target, prompts, oracle):
    ids, mask = prompts
    plain = greedy(target, ids, mask)
    oracle(correct_upto=None)
    hf_dflash.uninstall_hooks()
    try:
        out = hf_dflash.generate(
            target, make_drafter(target, block_size=4), ids, attention_mask=mask, do_sample=False,
            max_new_tokens=NEW, return_dict_in_generate=True,
        )
    finally:
        hf_dflash.install_hooks()
    assert torch.equal(out.sequences, plain)
    assert all(sum(n) / len(n) > 3 for n in out.acceptance_lengths)  # the DFlash loop ran, drafts accepted
    # reinstalled: the hook routes assistant_model=drafter to the DFlash loop again
    assert greedy(target, ids, mask, make_drafter(target), return_dict_in_generate=True).acceptance_lengths


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 9, 11, 17])
@pytest.mark.parametrize("correct_upto", [None, "random"])
def test_drafts_capped_to_the_tokens_left(max_new_tokens, correct_upto, oracle):
    """No verification reads more tokens than can still be committed: with `left` tokens to go it reads
    min(block_size, left) (the newest token plus that many - 1 drafts)."""
    target = make_target("qwen3")
    ids, _ = left_padded(1)
    oracle(correct_upto=correct_upto, seed=max_new_tokens)
    counter = ForwardCounter(target)
    out = greedy(
        target, ids, drafter=make_drafter(target, block_size=8), max_new_tokens=max_new_tokens,
        return_dict_in_generate=True,
    )
    assert out.sequences.shape[1] == ids.shape[1] + max_new_tokens
    reads, committed = counter.tokens[1:], out.acceptance_lengths[0]
    assert counter.tokens[0] == ids.shape[1] and len(reads) == len(committed)
    left = max_new_tokens - 1  # after the prefill's token
    for read, n in zip(reads, committed):
        assert read == min(8, left)
        left -= n
    assert left == 0
