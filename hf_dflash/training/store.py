"""A feature store: the target's features of prepared samples on disk, captured while the target regenerated them.

Layout of a store folder:

    store.json          what the features are: target, target_layer_ids, hidden_size, dtype, target_topk
    index.jsonl         one line per sample: id, shard, first row, rows, num_tokens, crc32 of its input_ids
    shard-000000.safetensors ...   one per written batch: "features" [rows, len(ids) * H] (bf16), and with
                        target_topk K, "topk_ids" [rows, K] (int32, -1 where not captured) and "topk_probs" [rows, K]

A sample of n tokens has n - 1 rows: the features of positions 0..n-2 (the last token is never fed to the target, and
never context of an anchor: a block at anchor a sees positions < a <= n - 2). Row t of "topk_*" is the target's
next-token distribution at position t (it predicts token t + 1), kept for the response positions.

Writing is crash-safe: a shard is written to a temporary name and renamed, then its index lines are appended and
flushed. A kill leaves at most an unreferenced shard or a cut-off index line, which `open_for_append` removes.
Reading is lazy: safetensors maps the shards, so a dataset far larger than RAM trains fine.
"""

import json
import os
import zlib
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

META, INDEX = "store.json", "index.jsonl"
FORMAT = "hf-dflash-features"


class StoreMismatch(ValueError):
    """A store that does not belong to this data or drafter; the message names the difference and the fix."""


def ids_checksum(input_ids) -> int:
    return zlib.crc32(torch.as_tensor(input_ids, dtype=torch.int64).numpy().tobytes())


class FeatureStore:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not (self.path / META).is_file():
            raise FileNotFoundError(
                f"{self.path} is not a feature store (no {META}). Write one with "
                "`hf-dflash prepare-data ... --save-features DIR`."
            )
        self.meta = json.loads((self.path / META).read_text())
        self.entries = {entry["id"]: entry for entry in _read_index(self.path / INDEX)}
        self._open = {}

    # --- writing --------------------------------------------------------------------------------------------
    @classmethod
    def open_for_append(cls, path, meta: dict) -> "FeatureStore":
        """Create the store, or reopen it after checking that `meta` matches what it holds; remove what a kill left
        behind (a cut-off index line, shards no index line names)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        meta = {"format": FORMAT, "version": 1, **meta}
        if (path / META).is_file():
            old = json.loads((path / META).read_text())
            diff = {k: (old.get(k), v) for k, v in meta.items() if old.get(k) != v and k != "target"}
            if diff:
                raise StoreMismatch(
                    f"{path} holds features made with other settings ({diff}, as (stored, asked)). Use a new "
                    "--save-features folder, or the settings it was made with."
                )
        else:
            _write_atomic(path / META, json.dumps(meta, indent=2))
        _truncate_partial_line(path / INDEX)
        named = {e["shard"] for e in _read_index(path / INDEX)}
        for shard in path.glob("*shard-*.safetensors"):
            if shard.name not in named:
                shard.unlink()
        return cls(path)

    def append(self, samples: list[dict]) -> None:
        """Write samples `{"id", "input_ids", "features" [n-1, F], "topk_ids"?, "topk_probs"?}` as one shard."""
        if not samples:
            return
        number = len(list(self.path.glob("shard-*.safetensors")))
        name = f"shard-{number:06d}.safetensors"
        while (self.path / name).exists():
            number += 1
            name = f"shard-{number:06d}.safetensors"
        tensors = {"features": torch.cat([s["features"] for s in samples]).to(torch.bfloat16).contiguous()}
        if self.meta.get("target_topk"):
            tensors["topk_ids"] = torch.cat([s["topk_ids"] for s in samples]).to(torch.int32).contiguous()
            tensors["topk_probs"] = torch.cat([s["topk_probs"] for s in samples]).to(torch.bfloat16).contiguous()
        tmp = self.path / f".tmp-{name}"
        save_file(tensors, str(tmp))
        os.replace(tmp, self.path / name)
        lines, row = [], 0
        for s in samples:
            rows = s["features"].shape[0]
            entry = {"id": s["id"], "shard": name, "row": row, "rows": rows, "num_tokens": len(s["input_ids"]),
                     "crc32": ids_checksum(s["input_ids"])}
            row += rows
            lines.append(json.dumps(entry) + "\n")
            self.entries[s["id"]] = entry
        with open(self.path / INDEX, "a", encoding="utf-8") as f:
            f.write("".join(lines))
            f.flush()
            os.fsync(f.fileno())

    def drop_after(self, keep: set[str]) -> None:
        """Forget the index entries (and shards) of samples not in `keep`, e.g. written to the store but not to the
        JSONL before a kill. Entries are in writing order, so whole trailing shards go."""
        entries = list(_read_index(self.path / INDEX))
        kept = [e for e in entries if e["id"] in keep]
        if len(kept) == len(entries):
            return
        shards = {e["shard"] for e in kept}
        _write_atomic(self.path / INDEX, "".join(json.dumps(e) + "\n" for e in kept))
        for e in entries:
            if e["shard"] not in shards and (self.path / e["shard"]).exists():
                (self.path / e["shard"]).unlink()
        self.entries = {e["id"]: e for e in kept}

    # --- reading --------------------------------------------------------------------------------------------
    @property
    def target_layer_ids(self) -> list[int]:
        return self.meta["target_layer_ids"]

    @property
    def target_topk(self) -> int:
        return int(self.meta.get("target_topk") or 0)

    def __contains__(self, sample_id: str) -> bool:
        return sample_id in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def check(self, sample_id: str, input_ids) -> None:
        """Raise StoreMismatch unless the store holds features of exactly these tokens for this sample."""
        entry = self.entries.get(sample_id)
        if entry is None:
            raise StoreMismatch(
                f"{self.path} has no features of sample {sample_id!r}. Train on the JSONL the store was written "
                "for, or add them with `hf-dflash store-features` (it skips the samples the store holds)."
            )
        if entry["num_tokens"] != len(input_ids) or entry["crc32"] != ids_checksum(input_ids):
            raise StoreMismatch(
                f"{self.path}: the features of sample {sample_id!r} were computed for other tokens than the JSONL "
                "holds now (the data was regenerated or edited). Rewrite the store with prepare-data --save-features."
            )

    def read(self, sample_id: str, rows: int | None = None) -> dict:
        """The stored tensors of a sample (first `rows` rows), read lazily from its shard."""
        entry = self.entries[sample_id]
        n = entry["rows"] if rows is None else min(rows, entry["rows"])
        handle = self._open.get(entry["shard"])
        if handle is None:
            handle = self._open[entry["shard"]] = safe_open(str(self.path / entry["shard"]), framework="pt")
        start = entry["row"]
        return {k: handle.get_slice(k)[start : start + n] for k in handle.keys()}


class FeatureCapture:
    """Collects the target's features (and top-K next-token probabilities) while `generate` runs, from each forward's
    `hidden_states` and `logits` (a forward hook on the target; pass `generate_kwargs` to generate)."""

    def __init__(self, target, layer_ids: list[int], topk: int = 0):
        self.layer_ids, self.topk = layer_ids, topk
        self.features, self.topk_ids, self.topk_probs = [], [], []
        self.handle = target.register_forward_hook(self._hook)

    @property
    def generate_kwargs(self) -> dict:
        # only these layers' hidden states are kept by the model (the others are None in `hidden_states`)
        return {"output_hidden_states": [i + 1 for i in self.layer_ids]}

    def _hook(self, module, args, out):
        hidden = out.hidden_states  # hidden_states[0] is the embedding output, i + 1 the output of layer i
        self.features.append(torch.cat([hidden[i + 1] for i in self.layer_ids], dim=-1).to(torch.bfloat16))
        if self.topk:
            probs = out.logits[:, -1:].float().softmax(-1)  # the prefill keeps the last position only
            values, indices = probs.topk(self.topk, dim=-1)
            self.topk_probs.append(values.to(torch.bfloat16))
            self.topk_ids.append(indices.to(torch.int32))

    def remove(self) -> None:
        self.handle.remove()

    def samples(self, width: int, prompt_lens: list[int], response_lens: list[int]) -> list[dict]:
        """Per row: features of its n - 1 = prompt + response - 1 positions, and top-K rows aligned to them."""
        features = torch.cat(self.features, dim=1)  # [b, width + steps, F]: prefill, then one column per step
        topk = (torch.cat(self.topk_ids, 1), torch.cat(self.topk_probs, 1)) if self.topk else None  # [b, steps + 1, K]
        out = []
        for row, (p, r) in enumerate(zip(prompt_lens, response_lens)):
            sample = {"features": features[row, width - p : width + r - 1].cpu()}
            if topk is not None:  # prompt positions but the last one predict nothing we train on: -1 / 0
                ids = torch.full((p + r - 1, self.topk), -1, dtype=torch.int32)
                probs = torch.zeros(p + r - 1, self.topk, dtype=torch.bfloat16)
                ids[p - 1 :], probs[p - 1 :] = topk[0][row, :r].cpu(), topk[1][row, :r].cpu()
                sample.update(topk_ids=ids, topk_probs=probs)
            out.append(sample)
        self.features, self.topk_ids, self.topk_probs = [], [], []
        return out


def _read_index(path: Path):
    if not path.exists():
        return
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.endswith("\n") and line.strip():
                yield json.loads(line)


def _truncate_partial_line(path: Path) -> None:
    if not path.exists():
        return
    with open(path, "rb+") as f:
        data = f.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            f.truncate(end)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
