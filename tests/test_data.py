"""prepare-data: prompt formats, clear errors on bad files, loss masks, resumable writing."""

import json

import pytest
import torch

from hf_dflash.prompts import DataError, read_prompts
from hf_dflash.training.data import load_samples, prepare_data

from conftest import make_target, make_tokenizer


def write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_prompt_formats(tmp_path):
    jsonl = write(tmp_path / "p.jsonl", [
        json.dumps({"prompt": "plain"}),
        json.dumps({"question": "gsm8k style", "answer": "ignored"}),
        json.dumps({"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "chat"},
                                 {"role": "assistant", "content": "old reply, regenerated"}]}),
        json.dumps({"id": "sg", "conversations": [{"from": "human", "value": "sharegpt"},
                                                  {"from": "bing", "value": "x"},
                                                  {"from": "human", "value": "later"}, {"from": "gpt", "value": "y"}]}),
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                                 {"role": "user", "content": "second turn"}]}),
        "",
    ])
    prompts = list(read_prompts(jsonl))
    assert [p.messages[-1]["content"] for p in prompts] == ["plain", "gsm8k style", "chat", "sharegpt", "second turn"]
    assert prompts[2].messages[0] == {"role": "system", "content": "sys"} and len(prompts[2].messages) == 2
    assert prompts[3].id == "sg" and len({p.id for p in prompts}) == 5
    # a conversation ending with a user turn keeps its history: the target answers the last turn
    assert [m["content"] for m in prompts[4].messages] == ["hi", "hello", "second turn"]
    (tmp_path / "a.json").write_text(json.dumps([{"instruction": "alpaca"}, {"prompt": "mbpp", "task_id": 7}]))
    assert [p.id for p in read_prompts(tmp_path / "a.json")][1] == "7"
    write(tmp_path / "t.txt", ["first paragraph", "still first", "", "second"])
    contents = [p.messages[0]["content"] for p in read_prompts(tmp_path / "t.txt")]
    assert contents == ["first paragraph\nstill first", "second"]
    assert len(list(read_prompts(jsonl, limit=2))) == 2


def test_corrupted_line_names_file_and_line(tmp_path):
    bad = write(tmp_path / "bad.jsonl", [json.dumps({"prompt": "ok"}), '{"prompt": "cut', json.dumps({"prompt": "x"})])
    with pytest.raises(DataError, match=r"bad\.jsonl:2: not valid JSON"):
        list(read_prompts(bad))
    odd = write(tmp_path / "odd.jsonl", [json.dumps({"response": "no prompt key"})])
    with pytest.raises(DataError, match=r"odd\.jsonl:1: no prompt found"):
        list(read_prompts(odd))
    broken = write(tmp_path / "data.jsonl", [json.dumps({"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}), "{oops"])
    with pytest.raises(DataError, match=r"data\.jsonl:2: not valid JSON"):
        load_samples(broken)
    unprepared = write(tmp_path / "raw.jsonl", [json.dumps({"prompt": "not regenerated yet"})])
    with pytest.raises(DataError, match=r"raw\.jsonl:1: not a prepared sample"):
        load_samples(unprepared)


@pytest.fixture
def chat_tokenizer():
    tokenizer = make_tokenizer()
    tokenizer.chat_template = (
        "{% for m in messages %}<s>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<s>{% endif %}"
    )
    return tokenizer


def test_prepare_data_masks_only_the_response_and_resumes(tmp_path, chat_tokenizer):
    target = make_target("qwen3", dtype=torch.float32)
    lines = [json.dumps({"prompt": c * (i + 2)}) for i, c in enumerate("abcde")]
    prompts = list(read_prompts(write(tmp_path / "p.jsonl", lines)))
    out = tmp_path / "data.jsonl"
    stats = prepare_data(target, chat_tokenizer, prompts[:3], out, max_new_tokens=6, batch_size=2)
    assert stats.written == 3 and stats.response_tokens == 18
    records = [json.loads(line) for line in out.read_text().splitlines()]
    for record, prompt in zip(records, prompts):
        prompt_ids = chat_tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, return_dict=False)
        assert record["input_ids"][: len(prompt_ids)] == prompt_ids
        assert record["loss_mask"] == [0] * len(prompt_ids) + [1] * 6  # the response only
        plain = target.generate(torch.tensor([prompt_ids]), max_new_tokens=6, do_sample=False)
        assert record["input_ids"] == plain[0].tolist()  # the target's own greedy response
        assert record["messages"][-1]["role"] == "assistant" and record["generation"]["do_sample"] is False
    # A kill mid-write leaves a cut line: the rerun drops it, skips what is done, and writes the rest once.
    with open(out, "a") as f:
        f.write('{"id": "p.jsonl:4", "input_ids": [1, 2')
    stats = prepare_data(target, chat_tokenizer, prompts, out, max_new_tokens=6, batch_size=2)
    assert stats.skipped_done == 3 and stats.written == 2
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == sorted(p.id for p in prompts)
    samples, dropped = load_samples(out, min_supervised_tokens=7)
    assert (len(samples), dropped) == (0, 5)  # 6 supervised tokens each: too few for 7
    samples, dropped = load_samples(out, min_supervised_tokens=6)
    assert (len(samples), dropped) == (5, 0)
