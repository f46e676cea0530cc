"""`hf_dflash.bench.benchmark` and `hf-dflash bench` on a tiny target: consistent numbers, outputs written."""

import copy
import json
import time

import pytest
import torch

from hf_dflash.bench import benchmark, load_prompt_set, write_outputs
from hf_dflash.bench.timing import PHASES, profiled
from hf_dflash.generation.decoder import Decoder
from hf_dflash.prompts import Prompt

from conftest import ForwardCounter, make_drafter, make_target, make_tokenizer
from test_bigram import with_prior


@pytest.fixture(scope="module")
def setup():
    target = make_target("qwen3", dtype=torch.float32)
    drafter = make_drafter(target, block_size=4)
    tokenizer = make_tokenizer()
    tokenizer.chat_template = (
        "{% for m in messages %}<s>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<s>{% endif %}"
    )
    prompts = [Prompt(str(i), [{"role": "user", "content": c * (i + 2)}]) for i, c in enumerate("abc")]
    return target, drafter, tokenizer, prompts


@pytest.fixture(scope="module")
def results(setup):
    target, drafter, tokenizer, prompts = setup
    return benchmark(
        target, drafter, tokenizer, {"toy": prompts}, batch_sizes=(1, 2), modes=("greedy", "sampling"),
        block_sizes=[4, 3], max_new_tokens=10, progress=False,
    )


def test_numbers_are_consistent(results):
    assert len(results["runs"]) == 2 * 2 * 2
    assert results["machine"]["torch_threads"] == results["settings"]["threads"] == 1
    for run in results["runs"]:
        s = run["summary"]
        assert s["tau"] >= 1
        assert s["speedup"] == s["plain_seconds"] / s["dflash_seconds"]
        per_token = s["tokens_per_s_dflash"] / s["tokens_per_s_plain"]
        assert s["speedup_per_token"] == pytest.approx(per_token)
        if s["plain_new_tokens"] == s["dflash_new_tokens"]:
            assert s["speedup_per_token"] == pytest.approx(s["speedup"])
        assert s["plain_seconds"] == sum(r["plain"]["seconds"] for r in run["prompts"])
        steps = sum(len(row) for r in run["prompts"] for row in r["acceptance_lengths"])
        assert sum(s["histogram"]) == s["steps"] == steps
        assert sum(k * c for k, c in enumerate(s["histogram"])) == s["committed"]
        assert s["tau"] == s["committed"] / s["steps"]
        for record in run["prompts"]:
            steps = sum(len(row) for row in record["acceptance_lengths"])
            assert sum(record["histogram"]) == steps
        assert len(run["prompts"]) == -(-3 // run["batch_size"])
        if run["mode"] == "greedy":
            assert s["identical"] is True  # the benchmark compared DFlash with plain greedy itself
            assert all(r["identical"] is True for r in run["prompts"])
            assert s["identical_rows"] == s["rows"] == 3 and s["first_differences"] == []
            assert s["dflash_new_tokens"] == s["plain_new_tokens"]
        else:
            assert s["identical"] is None


@pytest.mark.parametrize("threshold", [0.99, 0.0])
def test_confidence_threshold_reaches_the_dflash_calls(setup, threshold):
    target, drafter, tokenizer, prompts = setup
    counter = ForwardCounter(target)
    results = benchmark(target, drafter, tokenizer, {"toy": prompts[:2]}, max_new_tokens=8, baselines=["plain"],
                        warmup=0, progress=False, assistant_confidence_threshold=threshold)
    counter.remove()
    assert results["settings"]["assistant_confidence_threshold"] == threshold
    summary = results["runs"][0]["summary"]
    assert (summary["steps_without_drafts"] == summary["steps"]) == (threshold > 0)
    # a random drafter is never 99 % sure: then only the prefills (2 per prompt: plain and DFlash) read more than
    # one token; with 0 the DFlash steps verify whole blocks too
    multi_token = sum(n > 1 for n in counter.tokens)
    assert multi_token == 4 if threshold else multi_token > 4


def test_baselines_in_the_same_run(results):
    run = next(r for r in results["runs"] if r["batch_size"] == 1 and r["mode"] == "greedy")
    for name in ("prompt_lookup", "native", "reference"):
        b = run["baselines"][name]
        assert b["identical"] is True, name  # all greedy: token-identical to plain generate
        assert b["new_tokens"] == run["summary"]["plain_new_tokens"]
        assert b["tokens_per_s"] == b["new_tokens"] / b["seconds"]
        assert all(name in record for record in run["prompts"])
    batched = next(r for r in results["runs"] if r["batch_size"] == 2)
    assert "skipped" in batched["baselines"]["native"]


def test_outputs_written(results, tmp_path):
    paths = write_outputs(results, tmp_path / "out")
    saved = json.loads(paths["json"].read_text())
    assert saved["markdown"] == paths["markdown"].read_text() == results["markdown"]
    assert saved["machine"]["cpu_count"] and saved["machine"]["transformers"] and saved["machine"]["date"]
    assert paths["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = results["markdown"].splitlines()
    machine = results["machine"]
    assert lines[0].startswith(f"Measured on {machine['cuda'] or machine['cpu']}") and "1 torch thread(s)" in lines[0]
    assert lines[1] == "" and "target torch.float32" in lines[0]
    lines = lines[2:]
    assert lines[0].startswith("| set | batch | mode | block | tree | tau | drafts/step | tok/s plain | tok/s dflash")
    assert "tok/s native" in lines[0] and lines[2 + len(results["runs"])] == ""
    assert sum(line.startswith("| toy |") for line in lines) == 2 * len(results["runs"])  # results + profile
    for run, line in zip(results["runs"], lines[2:]):  # the table's rows, in the runs' order
        s = run["summary"]
        assert ("per token" in line) == (s["plain_new_tokens"] != s["dflash_new_tokens"]), line


def test_speedup_per_token_where_the_calls_made_different_numbers_of_tokens():
    from hf_dflash.bench.report import _speedup_cell

    # DFlash stopped earlier (a near-tie to an earlier EOS): 2x by time, 1.5x by tokens per second
    summary = {"speedup": 2.0, "speedup_per_token": 1.5, "plain_new_tokens": 400, "dflash_new_tokens": 300}
    assert _speedup_cell(summary) == "2.00x (1.50x per token)"
    assert _speedup_cell({**summary, "dflash_new_tokens": 400, "speedup_per_token": 2.0}) == "2.00x"


@pytest.mark.parametrize("draft_vocab", [False, True])
def test_phase_timer_counts_the_heads_drafts_are_scored_with(draft_vocab):
    """The target's head inside its own forward is the target's time; scoring drafts with it (or the drafter's
    gathered rows of it) is `drafter_head`; the rest between the drafter's layers and the next target forward is
    `drafts`."""
    target = make_target()
    drafter = make_drafter(target)
    if draft_vocab:
        drafter.set_draft_vocab(torch.arange(0, target.config.vocab_size, 2))
    ids, keep_path = torch.tensor([[5, 9, 3, 7, 2]]), Decoder.keep_path
    _, _, plain = profiled(lambda: target.generate(ids, max_new_tokens=6, do_sample=False), target, drafter)
    assert plain["target_forwards"] == 6 and plain["drafter_head"] == plain["drafts"] == 0
    assert "draft_head" not in vars(drafter) and Decoder.keep_path is keep_path  # the timer's wrappers are gone
    slow, calls = 0.005, []

    def draft_head(output_head, original=drafter.draft_head):  # each scoring of drafts sleeps `slow` in the head
        head = original(output_head)
        head[0].register_forward_pre_hook(lambda *_: calls.append(time.sleep(slow)))
        return head

    drafter.draft_head = draft_head
    _, seconds, dflash = profiled(lambda: target.generate(ids, assistant_model=drafter, max_new_tokens=12,
                                                          do_sample=False), target, drafter)
    assert len(calls) >= dflash["target_forwards"] - 2  # a step but the last (no room for drafts) scores drafts
    assert dflash["drafter_head"] >= len(calls) * slow and dflash["drafts"] < len(calls) * slow / 2
    assert all(dflash[k] > 0 for k in PHASES[1:])
    assert sum(dflash[k] for k in PHASES) + dflash["other"] == pytest.approx(seconds)
    assert drafter.draft_head is draft_head  # what was there before the timer is there after


def test_profile_accounts_for_the_measured_time(results):
    for run in results["runs"]:
        for record in run["prompts"]:
            steps = max(len(row) for row in record["acceptance_lengths"])  # the batch steps until its last row ends
            dflash, plain = record["dflash"]["phases"], record["plain"]["phases"]
            assert dflash["target_forwards"] == steps + 1  # prefill + one verification per step
            assert plain["target_forwards"] == 10  # one per new token (max_new_tokens=10, no EOS)
            for method, phases in (("dflash", dflash), ("plain", plain)):
                timed = [phases[k] for k in PHASES]
                assert all(t >= 0 for t in timed) and phases["other"] >= 0
                assert sum(timed) + phases["other"] == pytest.approx(record[method]["seconds"])
            assert plain["drafter_layers"] == plain["drafter_head"] == plain["drafts"] == plain["cache_keep"] == 0
            assert all(dflash[k] > 0 for k in ("drafter_layers", "drafter_head", "drafts", "cache_keep"))
        profile = run["profile"]["dflash"]
        assert profile["split"] and profile["steps"] == sum(r["dflash"]["phases"]["target_forwards"] - 1
                                                            for r in run["prompts"])


def test_prompt_file_set_and_bench_files(tmp_path, setup):
    target, drafter, tokenizer, _ = setup
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": c * 3}) for c in "xyzw") + "\n")
    prompts = load_prompt_set(str(path), num_prompts=2)
    assert [p.messages[0]["content"] for p in prompts] == ["xxx", "yyy"]
    out = benchmark(target, drafter, tokenizer, {"file": prompts}, max_new_tokens=6, baselines=("plain",),
                    warmup=0, progress=False)
    assert out["runs"][0]["summary"]["identical"] is True
    (tmp_path / "gsm8k_test.jsonl").write_text(json.dumps({"question": "q1", "answer": "#### 1"}) + "\n")
    assert load_prompt_set("gsm8k", 5, bench_dir=tmp_path)[0].messages[0]["content"] == "q1"


def test_named_sets_are_found_through_the_environment(tmp_path, monkeypatch):
    (tmp_path / "gsm8k_test.jsonl").write_text(json.dumps({"question": "q1", "answer": "#### 1"}) + "\n")
    monkeypatch.setenv("HF_DFLASH_BENCH_DIR", str(tmp_path))
    assert load_prompt_set("gsm8k", 5)[0].messages[0]["content"] == "q1"
    monkeypatch.delenv("HF_DFLASH_BENCH_DIR")
    with pytest.raises(FileNotFoundError, match=r"not given.*HF_DFLASH_BENCH_DIR"):
        load_prompt_set("gsm8k", 5)


def test_unknown_or_missing_sets_give_clear_errors(tmp_path):
    with pytest.raises(ValueError, match=r"Unknown prompt set 'nope'.*gsm8k.*prompt file"):
        load_prompt_set("nope")
    with pytest.raises(FileNotFoundError, match=r"--bench-dir"):
        load_prompt_set("mbpp", bench_dir=tmp_path)


def test_cli_rejects_unknown_set_before_loading_models():
    from hf_dflash.cli import main

    with pytest.raises(ValueError, match="Unknown prompt set"):
        main(["bench", "--sets", "no-such-set", "--target", "unused"])


def test_first_difference_and_dtype_choice():
    from hf_dflash.bench import first_difference
    from hf_dflash.devices import native_bf16, resolve_dtype

    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2  # one stopped earlier
    assert resolve_dtype("auto") == (torch.bfloat16 if native_bf16() else torch.float32)
    assert resolve_dtype("float64") == torch.float64
    with pytest.raises(ValueError, match="use auto, float32"):
        resolve_dtype("float33")


def test_without_cudnn_attention_is_scoped_to_cuda_and_restores():
    from hf_dflash.devices import without_cudnn_attention

    enabled = torch.backends.cuda.cudnn_sdp_enabled  # a flag even in CPU builds, so this runs without a GPU
    assert enabled()
    with without_cudnn_attention("cpu"):
        assert enabled()  # not CUDA: nothing changes
    with without_cudnn_attention(torch.device("cuda", 0)):
        assert not enabled()
    assert enabled()
    with pytest.raises(KeyError), without_cudnn_attention("cuda"):
        raise KeyError  # restored on an error too
    assert enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)  # the user's own choice is kept
    try:
        with without_cudnn_attention("cuda"):
            assert not enabled()
        assert not enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)


# --- draft trees and the oracle -----------------------------------------------------------------------------------
def test_tree_sizes_are_runs_of_their_own(setup, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DFLASH_CACHE", str(tmp_path))  # "auto" measures forward costs once, kept here
    target, drafter, tokenizer, prompts = setup
    plain_calls = []
    generate = target.generate

    def counting(*args, **kwargs):
        if "assistant_model" not in kwargs and "prompt_lookup_num_tokens" not in kwargs:
            plain_calls.append(1)
        return generate(*args, **kwargs)

    monkeypatch.setattr(target, "generate", counting)
    results = benchmark(target, drafter, tokenizer, {"toy": prompts}, batch_sizes=(1, 2),
                        draft_tree_sizes=[0, 5, "auto"],
                        max_new_tokens=8, baselines=("plain", "prompt_lookup"), warmup=0, progress=False)
    assert results["settings"]["draft_tree_sizes"] == [0, 5, "auto"]
    assert [(r["batch_size"], r["tree_size"]) for r in results["runs"]] == [
        (b, t) for b in (1, 2) for t in (0, 5, "auto")]
    for run in results["runs"]:
        s = run["summary"]
        assert s["identical"] is True  # greedy stays token-identical to plain generate with every tree size
        drafts = [n for r in run["prompts"] for row in r["draft_lengths"] for n in row]
        assert s["draft_lengths"] == {str(n): drafts.count(n) for n in set(drafts)}
        assert s["drafts_per_step"] == sum(drafts) / len(drafts)
        if run["tree_size"] == 5:
            assert max(drafts) == 5  # the tree's nodes, more than the chain's 3
    # the tree sizes take turns against one plain call per prompt batch (batch 1: one per prompt, batch 2: per pair)
    assert len(plain_calls) == len(prompts) + -(-len(prompts) // 2)
    for batch_size in (1, 2):
        shared = [[r["plain"] for r in run["prompts"]] for run in results["runs"] if run["batch_size"] == batch_size]
        assert shared[0] == shared[1] == shared[2]
    first, tree = results["runs"][0], results["runs"][1]
    assert "tokens_per_s" in first["baselines"]["prompt_lookup"]  # baselines: in the first tree size's run only
    assert tree["baselines"]["prompt_lookup"] == {"skipped": "measured in the draft_tree_size=0 run"}
    lines = results["markdown"].splitlines()
    assert "| toy | 1 | greedy | 4 | chain |" in results["markdown"]
    assert "| toy | 2 | greedy | 4 | auto |" in results["markdown"]
    auto = [line for line in lines if line.startswith("- toy, batch")]
    assert len(auto) == 2 and all(": " in line for line in auto)  # what "auto" chose, per run
    with pytest.raises(ValueError, match="each size once"):
        benchmark(target, drafter, tokenizer, {"toy": prompts}, draft_tree_sizes=[0, 0], progress=False)


def _oracle_checks(run, fixed_shape: bool = False):
    """Every draft right: each step but a row's last (cut by max_length) commits the block. `fixed_shape`: the
    fixed-shape path keeps a batch's stopped rows in every step."""
    o, s = run["oracle"], run["summary"]
    for record in run["prompts"]:
        for row in record["acceptance_lengths"]:
            assert all(n == run["block_size"] for n in row[:-1]), row
    assert o["speedup"] == s["speedup"] and o["ratio_with_prefill"] == pytest.approx(o["speedup"] / o["ceiling"])
    prefill = {m: sum(r[m]["phases"]["target_prefill"] for r in run["prompts"]) for m in ("plain", "dflash")}
    decode = (s["plain_seconds"] - prefill["plain"]) / (s["dflash_seconds"] - prefill["dflash"])
    assert o["decode_speedup"] == pytest.approx(decode) and o["ratio"] == pytest.approx(decode / o["ceiling"])
    static = run["baselines"].get("static", {}).get("seconds")
    best = s["plain_seconds"] if static is None else min(s["plain_seconds"], static)
    best_decode = (best - prefill["plain"]) / (s["dflash_seconds"] - prefill["dflash"])
    assert o["best_plain_ratio"] == pytest.approx(best_decode / o["ceiling"])
    verified = run["block_size"] if run["tree_size"] == 0 else run["tree_size"] + 1
    # the forwards timed after each step, on its cache: t(1), t(what it verified), t(a full step)
    limit, own = [0, 0], [0, 0]
    for record in run["prompts"]:
        steps = record["oracle"]["steps"]
        # the batch's own steps: each row's last step is cut by max_new_tokens, so it verifies and commits less; a
        # step verifies its widest row and commits all its rows' tokens
        expected = {}
        for ds, acc in zip(record["draft_lengths"], record["acceptance_lengths"]):
            for j, (d, a) in enumerate(zip(ds, acc)):
                v, c, rows = expected.get(j, (0, 0, 0))
                expected[j] = max(v, d + 1), c + a, len(record["prompt_ids"]) if fixed_shape else rows + 1
        assert [(s["verified"], s["committed"], s["rows"]) for s in steps] == list(expected.values())
        for step in steps:
            t = step["seconds"]
            assert step["full"] == verified and set(t) == {"1", str(verified), str(step["verified"])}
            assert all(v > 0 for v in t.values())
            limit[0] += min(run["block_size"], verified) * t["1"]
            limit[1] += t[str(verified)]
            own[0] += step["committed"] / step["rows"] * t["1"]
            own[1] += t[str(step["verified"])]
    assert o["ceiling"] == pytest.approx(limit[0] / limit[1])
    assert o["steps_ceiling"] == pytest.approx(own[0] / own[1])
    assert o["steps_ratio"] == pytest.approx(decode / o["steps_ceiling"])
    # no timed forward: the calls' own target forwards after the prefill (compiled ones run no timing hooks)
    forwards = [sum(r[m]["phases"]["target_steps"] for r in run["prompts"]) for m in ("plain", "dflash")]
    if fixed_shape:
        assert forwards[1] == 0 and o["calls_ratio"] is None
    else:
        assert o["calls_ratio"] == pytest.approx(decode * forwards[1] / forwards[0])


@pytest.mark.parametrize("prior", [False, True])
def test_oracle_drafts_are_all_right(setup, prior):
    target, drafter, tokenizer, prompts = setup
    if prior:  # a bigram prior would rerank the oracle's drafts: the oracle leaves it out
        drafter = with_prior(copy.deepcopy(drafter), target.config.vocab_size)
    results = benchmark(target, drafter, tokenizer, {"toy": prompts}, batch_sizes=(1, 2), block_sizes=[4, 3],
                        draft_tree_sizes=[0, 6], max_new_tokens=10, baselines=("plain",), warmup=0, progress=False,
                        oracle=True)
    assert results["settings"]["oracle"] is True and len(results["runs"]) == 8
    for run in results["runs"]:
        assert run["oracle"]["wrong_steps"] == run["oracle"]["resyncs"] == 0
        assert run["summary"]["identical"] is True
        _oracle_checks(run)
        for record in run["prompts"]:  # the oracle's own work (placing its drafts, counting wrong ones) is untimed
            assert record["oracle"]["resync_seconds"] == 0
            assert record["dflash"]["phases"]["paused"] >= record["oracle"]["untimed_seconds"] > 0
    lines = results["markdown"].splitlines()
    at = lines.index("| set | batch | block | tree | tau | wrong drafts | resyncs | t(1) ms | t(verified) ms | speedup "
                     "| decode speedup | ceiling | decode speedup / ceiling | ceiling of its steps "
                     "| decode speedup / that | / the calls' forwards "
                     "| vs plain at its best: decode speedup / ceiling |")
    assert all(line.startswith("| toy |") for line in lines[at + 2 : at + 10])
    with pytest.raises(ValueError, match="greedy"):
        benchmark(target, drafter, tokenizer, {"toy": prompts}, modes=("sampling",), oracle=True, progress=False)


@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
def test_oracle_timed_forwards_leave_sliding_caches_as_they_were(setup, arch):
    """The ceiling's forwards run on the step's own cache and are dropped again: with sliding-window layers
    (windows of 5-6 slots, 14 new tokens) every oracle draft stays right and the output stays plain's."""
    _, _, tokenizer, prompts = setup
    target = make_target(arch, dtype=torch.float32)
    results = benchmark(target, make_drafter(target, block_size=4), tokenizer, {"toy": prompts}, batch_sizes=(1, 2),
                        block_sizes=[4], draft_tree_sizes=[0, 5], max_new_tokens=14, baselines=("plain",), warmup=0,
                        progress=False, oracle=True)
    for run in results["runs"]:
        assert run["summary"]["identical"] is True and run["oracle"]["wrong_steps"] == 0
        _oracle_checks(run)


def test_oracle_times_one_token_as_plain_generate_runs_it(setup, monkeypatch):
    """The loop verifies in inference mode, plain `generate` decodes under no_grad: the ceiling's t(1) is timed as
    plain runs it, its larger forwards as the loop runs them."""
    from hf_dflash.bench.oracle import OracleDecoder

    target, drafter, tokenizer, prompts = setup
    seen, forward = [], OracleDecoder.target_forward

    def recording(self, input_ids, *args, **kwargs):
        seen.append((input_ids.shape[1], torch.is_inference_mode_enabled(), self._in_ceiling))
        return forward(self, input_ids, *args, **kwargs)

    time_ceiling = OracleDecoder.time_ceiling

    def flagged(self):
        self._in_ceiling = True
        time_ceiling(self)
        self._in_ceiling = False

    monkeypatch.setattr(OracleDecoder, "_in_ceiling", False, raising=False)
    monkeypatch.setattr(OracleDecoder, "target_forward", recording)
    monkeypatch.setattr(OracleDecoder, "time_ceiling", flagged)
    benchmark(target, drafter, tokenizer, {"toy": prompts[:1]}, block_sizes=[4], draft_tree_sizes=[0],
              max_new_tokens=10, baselines=("plain",), warmup=0, progress=False, oracle=True)
    ceiling = [(k, inference) for k, inference, timed in seen if timed]
    assert {k for k, _ in ceiling} == {1, 4} and all(inference == (k > 1) for k, inference in ceiling)
    assert all(inference for _, inference, timed in seen if not timed)  # the loop's prefill and verifications


def test_oracle_work_stays_out_of_auto_s_step_costs(setup, monkeypatch):
    """The ceiling's forwards run between a step's verification and the next step, untimed: "auto" must not count
    them as the step's (`LoopCosts.overhead`), or it would verify trees that pay only against that cost."""
    from hf_dflash.bench.oracle import OracleDecoder
    from hf_dflash.generation.forward_costs import ForwardCosts, LoopCosts

    target, drafter, tokenizer, prompts = setup
    made = []
    monkeypatch.setattr("hf_dflash.generation.proposer.LoopCosts",
                        lambda curve: made.append(LoopCosts(curve)) or made[-1])
    monkeypatch.setattr("hf_dflash.generation.proposer.load_forward_costs",
                        lambda target, batch_size: ForwardCosts((1, 32), (0.001, 0.001)))
    time_ceiling = OracleDecoder.time_ceiling
    monkeypatch.setattr(OracleDecoder, "time_ceiling", lambda self: time_ceiling(self) or time.sleep(0.2))
    benchmark(target, drafter, tokenizer, {"toy": prompts[:1]}, block_sizes=[4], draft_tree_sizes=["auto"],
              max_new_tokens=10, baselines=("plain",), warmup=0, progress=False, oracle=True)
    assert made and all(costs.sums[0] > 0 and costs.overhead < 0.1 for costs in made)


@pytest.mark.parametrize("max_new_tokens, lengths", [(10, [4, 1, 4]), (22, [4, 1, 4, 4, 4, 4])])
def test_oracle_recomputes_the_continuation_where_the_text_left_it(setup, monkeypatch, max_new_tokens, lengths):
    """As a bfloat16 near-tie would: the precomputed continuation of row 0 is wrong at new token 5, so that draft is
    rejected, the committed text leaves the continuation, and the oracle recomputes it (untimed) from there, two
    blocks' drafts ahead, then further as the drafts reach its end (22 tokens: not counted as resyncs)."""
    from hf_dflash.bench.oracle import OracleDrafts

    from_plain = OracleDrafts.from_plain.__func__

    def diverging(cls, *args, **kwargs):
        drafts = from_plain(cls, *args, **kwargs)
        drafts.continuation[0, 5] = (drafts.continuation[0, 5] + 1) % (target.config.vocab_size - 1)
        return drafts

    target, drafter, tokenizer, prompts = setup
    monkeypatch.setattr(OracleDrafts, "from_plain", classmethod(diverging))
    results = benchmark(target, drafter, tokenizer, {"toy": prompts}, batch_sizes=(2,), block_sizes=[4],
                        max_new_tokens=max_new_tokens, baselines=("plain",), warmup=0, progress=False, oracle=True)
    run = results["runs"][0]
    assert run["summary"]["identical"] is True  # the target still decides: output unchanged
    assert run["oracle"]["wrong_steps"] == run["oracle"]["resyncs"] == 2  # row 0 of both batches
    for record in run["prompts"]:
        assert record["oracle"]["resyncs"] == [6]  # 1 (prefill) + 4 (block) + 1 (the rejected draft)
        assert record["acceptance_lengths"][0] == lengths  # all right again after the recomputation
        phases = record["dflash"]["phases"]
        assert phases["paused"] >= record["oracle"]["resync_seconds"] > 0
        # the recomputation's forwards are not the loop's: prefill + one verification per step
        assert phases["target_forwards"] == 1 + max(map(len, record["acceptance_lengths"]))


def test_oracle_drafts_end_at_a_stop_token(setup, monkeypatch):
    """Past a row's stop token its continuation is padding, no drafts: the target's tokens there are never
    committed, and no draft counts as wrong."""
    target, drafter, tokenizer, prompts = setup
    encoded = tokenizer.apply_chat_template(prompts[0].messages, add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True)
    new = target.generate(**encoded, max_new_tokens=3, do_sample=False)[0, -3:].tolist()
    assert new[2] not in new[:2]  # the stop lands inside the first verified block of 4
    monkeypatch.setattr(target.generation_config, "eos_token_id", new[2])
    results = benchmark(target, drafter, tokenizer, {"toy": prompts}, batch_sizes=(1, 2), block_sizes=[4],
                        max_new_tokens=10, baselines=("plain",), warmup=0, progress=False, oracle=True)
    for run in results["runs"]:
        assert run["summary"]["identical"] is True and run["oracle"]["wrong_steps"] == 0
    # the prefill's token, then one step: the second new token and the third, the stop
    assert results["runs"][0]["prompts"][0]["acceptance_lengths"] == [[2]]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_oracle_on_the_fixed_shape_path(setup, arch, monkeypatch):
    """`cache_implementation="static"` runs the oracle on the fixed-shape path, compiled: every draft stays right
    and the output plain's (the ceiling's forwards write only slots the next verification writes over first, with
    sliding-window layers too), and its ceiling is timed with the path's own compiled forwards, each width compiled
    before it is timed."""
    from hf_dflash import compile_everywhere
    from hf_dflash.bench import oracle as oracle_module
    from hf_dflash.generation import loop

    _, _, tokenizer, prompts = setup
    target = make_target(arch, dtype=torch.float32)
    fixed = []
    real = loop.speculative_loop
    monkeypatch.setattr(loop, "speculative_loop", lambda *a: fixed.append(type(a[1]).__name__) or real(*a))
    timed = []  # the widths of the ceiling's forwards, in the order they ran
    forward_at = oracle_module.FixedShapeOracleDecoder.forward_at
    monkeypatch.setattr(oracle_module.FixedShapeOracleDecoder, "forward_at",
                        lambda self, tokens, slots: timed.append((
                            tokens.shape[1], self.verify_call(tokens.shape[1]) is self.target.__call__,
                        )) or forward_at(self, tokens, slots))
    compile_config = compile_everywhere(backend="eager", mode=None)
    results = benchmark(target, make_drafter(target, block_size=4), tokenizer, {"toy": prompts}, batch_sizes=(1, 2),
                        block_sizes=[4], draft_tree_sizes=[0], max_new_tokens=14, baselines=("plain", "static"),
                        warmup=0, progress=False, oracle=True, cache_implementation="static",
                        compile_config=compile_config)
    assert set(fixed) == {"FixedShapeOracleDecoder"}
    for run in results["runs"]:
        assert run["summary"]["identical"] is True
        assert run["oracle"]["wrong_steps"] == run["oracle"]["resyncs"] == 0
        _oracle_checks(run, fixed_shape=True)
    # every forward (the verifications' too) through the compiled call; each width's first run not timed
    assert {width for width, _ in timed} == {1, 4} and not any(eager for _, eager in timed)


def test_ceilings():
    from hf_dflash.bench.oracle import ceilings

    def step(verified, committed, t, rows=1, full=None):
        return {"rows": rows, "verified": verified, "committed": committed, "full": full or verified,
                "seconds": {str(k): v for k, v in t.items()}}

    assert ceilings([step(4, 4, {1: 1.0, 4: 2.0})], 4) == (2.0, 2.0)  # B x t(1) / t(B)
    # a tree of 8: the block's right chain commits 4, 9 tokens verified
    assert ceilings([step(9, 4, {1: 1.0, 9: 3.0})], 4) == (4 / 3, 4 / 3)
    assert ceilings([step(1, 1, {1: 1.0}), step(3, 3, {1: 1.0, 3: 2.0})], 8) == (4 / 3, 4 / 3)  # "auto"'s sizes
    # a full block of 4, then a last step verifying 3 that commits 2 (its full step: 4); each step its own t(1)
    steps = [step(4, 4, {1: 1.0, 4: 2.0}), step(3, 2, {1: 2.0, 3: 3.0, 4: 4.0}, full=4)]
    assert ceilings(steps, 4) == ((4 * 1.0 + 4 * 2.0) / (2.0 + 4.0), (4 * 1.0 + 2 * 2.0) / (2.0 + 3.0))
    # two rows: 4 + 3 tokens committed in one step of 4, against plain's two rows per t(1)
    assert ceilings([step(4, 7, {1: 1.0, 4: 2.0}, rows=2)], 4) == (2.0, 7 / 4)


def test_random_target_oracle_from_the_command_line(tmp_path):
    import os
    import subprocess
    import sys

    config = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100}
    (tmp_path / "tiny.json").write_text(json.dumps(config))
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_DFLASH_CACHE=str(tmp_path / "cache"))
    done = subprocess.run(
        [sys.executable, "-m", "hf_dflash", "bench", "--random-target", str(tmp_path / "tiny.json"), "--oracle",
         "--num-prompts", "1", "--max-new-tokens", "8", "--block-sizes", "4", "--draft-tree-sizes", "0", "5",
         "--prompt-tokens", "12", "--dtype", "float32", "--device", "cpu", "--baselines", "plain", "--no-plot",
         "--output-dir", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "bench_results.json").read_text())
    assert results["target"] == f"random {tmp_path / 'tiny.json'}" and results["settings"]["device"] == "cpu"
    assert [r["tree_size"] for r in results["runs"]] == [0, 5]
    for run in results["runs"]:
        assert run["set"] == "random" and run["prompts"][0]["prompt_tokens"] == 12
        assert run["oracle"]["wrong_steps"] == 0
        _oracle_checks(run)
    assert "decode speedup / ceiling" in (tmp_path / "out" / "bench.md").read_text()


def _fixed_shape_calls(monkeypatch) -> tuple:
    """A list that gets an entry for each call of the fixed-shape loop, and a compile config for any device with the
    eager backend (quick; the path is the compiled one's)."""
    from hf_dflash import compile_everywhere
    from hf_dflash.generation import loop
    from hf_dflash.generation.fixed_shape import FixedShapeDecoder

    fixed = []
    real = loop.speculative_loop
    monkeypatch.setattr(loop, "speculative_loop",
                        lambda *a: (fixed.append(1) if isinstance(a[1], FixedShapeDecoder) else None) or real(*a))
    compile_config = compile_everywhere(backend="eager", mode=None)
    return fixed, compile_config


@pytest.mark.slow
def test_plain_at_its_best_and_the_fixed_shape_path(setup, monkeypatch, tmp_path):
    """The static baseline runs at every batch size and mode; each run's speedup is also reported against the faster
    plain call; `cache_implementation="static"` sends the DFlash calls down the fixed-shape path; a call of a new
    shape runs once untimed when compiling."""
    target, drafter, tokenizer, prompts = setup
    fixed, compile_config = _fixed_shape_calls(monkeypatch)
    calls = []
    generate = type(target).generate
    monkeypatch.setattr(type(target), "generate", lambda self, *a, **k: calls.append(k.get("cache")) or generate(
        self, *a, **k))
    out = benchmark(target, drafter, tokenizer, {"toy": prompts}, block_sizes=[4], batch_sizes=[1, 2],
                    modes=("greedy", "sampling"), draft_tree_sizes=[0, 2], max_new_tokens=6,
                    baselines=("plain", "static"),
                    warmup=0, progress=False, cache_implementation="static", compile_config=compile_config)
    assert fixed  # tree size 0 ran on the fixed-shape path (2 falls back to the general loop)
    for run in out["runs"]:
        s, static = run["summary"], run["baselines"]["static"]
        assert static["speedup"] == pytest.approx(s["plain_seconds"] / static["seconds"])
        best_plain = min(s["plain_seconds"], static["seconds"])
        assert s["speedup_best_plain"] == pytest.approx(best_plain / s["dflash_seconds"])
        if run["mode"] == "greedy":
            assert static["identical"] and s["identical"]
    for run in out["runs"]:  # split into phases or not (compiled forwards run no hooks), a step's time adds up
        p = run["profile"]["dflash"]
        step = sum(p[f"{k}_ms"] or 0.0 for k in (*PHASES[1:], "other"))
        assert p["prefill_seconds"] + p["steps"] * step / 1000 == pytest.approx(run["summary"]["dflash_seconds"])
    static_calls = [c for c in calls if c is not None]
    assert static_calls and all(layer.max_cache_len % 256 == 0 for c in static_calls for layer in c.layers)
    assert "speedup vs best plain" in out["markdown"]
    assert write_outputs(out, tmp_path)["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # with both speedups


def test_demo_times_dflash_at_its_best(setup, monkeypatch):
    """`hf-dflash demo --compile`'s DFlash timer: the fixed-shape path, compiled with the config given, the output
    plain greedy `generate`'s; a call of a new shape runs once untimed first, a call of a shape seen runs once."""
    from hf_dflash.bench.static import dflash_static_timer
    from hf_dflash.prompts import chat_inputs

    target, drafter, tokenizer, prompts = setup
    fixed, compile_config = _fixed_shape_calls(monkeypatch)
    timer = dflash_static_timer(target, drafter, 6, compile_config)
    for prompt, runs in zip(prompts[:2], (2, 1)):  # the second prompt's length falls in the first one's cache length
        inputs = chat_inputs(tokenizer, prompt.messages)
        plain = target.generate(**inputs, max_new_tokens=6, do_sample=False)
        fixed.clear()
        seconds, out = timer(inputs)
        assert len(fixed) == runs and seconds > 0
        assert torch.equal(out.sequences, plain) and out.acceptance_lengths


@pytest.mark.slow
def test_the_gpu_script_runs_on_a_cpu(tmp_path):
    """examples/fixed_shape_cuda.py end to end on a tiny random shape: the same code path as on a GPU (its CUDA-only
    synchronisation count skipped), compiled with the eager backend to stay quick; the oracle's run compares with
    plain at its best."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "examples" / "fixed_shape_cuda.py"
    done = subprocess.run(
        [sys.executable, str(script), "--shape", "tiny", "--device", "cpu", "--dtype", "float32", "--backend", "eager",
         "--num-prompts", "1", "--max-new-tokens", "20", "--output-dir", str(tmp_path), "--auto"],
        capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("general", "fixed", "oracle", "fixed-auto"):
        results = json.loads((tmp_path / name / "bench_results.json").read_text())
        assert results["settings"]["compile_config"]["backend"] == "eager"
        assert {run["batch_size"] for run in results["runs"]} == ({1, 8} if name in ("general", "fixed") else {1})
        assert all("static" in run["baselines"] for run in results["runs"])
    oracle = json.loads((tmp_path / "oracle" / "bench_results.json").read_text())["runs"][0]["oracle"]
    assert oracle["wrong_steps"] == 0 and oracle["best_plain_ratio"] > 0
    auto = json.loads((tmp_path / "fixed-auto" / "bench_results.json").read_text())["runs"]
    assert [run["tree_size"] for run in auto] == ["auto"] and auto[0]["summary"]["identical"]
    assert "vs plain at its best" in done.stdout


@pytest.mark.slow
def test_the_gpu_script_with_real_weights_runs_on_a_cpu(tmp_path):
    """examples/fixed_shape_cuda.py's real-weights mode, both stages, on tiny saved folders and a prompt file: every
    run reported, float32 identical to plain greedy (the script asserts it)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    target = make_target("qwen3", dtype=torch.float32)
    tokenizer = make_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    target.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    make_drafter(target, block_size=4).save_pretrained(tmp_path / "drafter")
    (tmp_path / "prompts.txt").write_text("abc def\n\nxyz!!\n\nQ?\n")
    script = Path(__file__).resolve().parents[1] / "examples" / "fixed_shape_cuda.py"
    done = subprocess.run(
        [sys.executable, str(script), "--target", str(tmp_path / "target"), "--drafter", str(tmp_path / "drafter"),
         "--prompts", str(tmp_path / "prompts.txt"), "--stage", "2", "--tree-size", "5", "--device", "cpu",
         "--dtype", "float32", "--backend", "eager", "--max-new-tokens", "12", "--output-dir", str(tmp_path / "out")],
        capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads((tmp_path / "out" / "real.json").read_text())["runs"]
    assert [(r["run"], r["batch_size"]) for r in runs] == [
        (name, batch) for batch in (1, 8) for name in ("plain", "chain", "tree", "auto")]
    assert all(r["decode_tokens_per_second"] > 0 for r in runs)
    assert all(r["identical_rows"] == r["rows"] == 3 for r in runs if r["run"] != "plain")
