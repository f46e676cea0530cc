"""`hf_dflash.bench.benchmark` and `hf-dflash bench` on a tiny target: consistent numbers, outputs written."""

import json

import pytest
import torch

from hf_dflash.bench import benchmark, load_prompt_set, write_outputs
from hf_dflash.data import Prompt

from conftest import ForwardCounter, make_drafter, make_target, make_tokenizer


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
        assert s["plain_seconds"] == sum(r["plain"]["seconds"] for r in run["prompts"])
        assert sum(s["histogram"]) == s["steps"] == sum(len(row) for r in run["prompts"] for row in r["acceptance_lengths"])
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
    assert lines[0].startswith("| set | batch | mode | block | tau | tok/s plain | tok/s dflash | speedup")
    assert "tok/s native" in lines[0] and lines[2 + len(results["runs"])] == ""
    assert sum(line.startswith("| toy |") for line in lines) == 2 * len(results["runs"])  # results + profile


def test_profile_accounts_for_the_measured_time(results):
    for run in results["runs"]:
        for record in run["prompts"]:
            steps = max(len(row) for row in record["acceptance_lengths"])  # the batch steps until its last row ends
            dflash, plain = record["dflash"]["phases"], record["plain"]["phases"]
            assert dflash["target_forwards"] == steps + 1  # prefill + one verification per step
            assert plain["target_forwards"] == 10  # one per new token (max_new_tokens=10, no EOS)
            for method, phases in (("dflash", dflash), ("plain", plain)):
                timed = [phases[k] for k in ("target_prefill", "target_steps", "drafter_layers", "drafter_head")]
                assert all(t >= 0 for t in timed) and phases["other"] >= 0
                assert sum(timed) + phases["other"] == pytest.approx(record[method]["seconds"])
            assert plain["drafter_layers"] == plain["drafter_head"] == 0
            assert dflash["drafter_layers"] > 0 and dflash["drafter_head"] > 0
        profile = run["profile"]["dflash"]
        assert profile["steps"] == sum(r["dflash"]["phases"]["target_forwards"] - 1 for r in run["prompts"])


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
