"""Where a training step's target features come from: a feature store on disk (read lazily), an in-memory cache
computed once (`--cache-features`), or a target forward per step (online)."""

import torch
from tqdm.auto import tqdm

from .store import FeatureStore, StoreMismatch


def target_features(target, input_ids, valid, layer_ids) -> torch.Tensor:
    with torch.no_grad():
        # logits_to_keep=1: only the hidden states are used; the lm_head over every position would be a large share
        # of this forward for a small target's large vocabulary.
        out = target(input_ids=input_ids, attention_mask=valid.long(), output_hidden_states=True, logits_to_keep=1)
    return torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)


class OnlineFeatures:
    """A target forward per micro-batch (no memory, the slowest)."""

    topk = None

    def __init__(self, target, layer_ids):
        self.target, self.layer_ids = target, layer_ids

    def __call__(self, indices, batch):
        ids, valid = batch["input_ids"].to(self.target.device), batch["valid"].to(self.target.device)
        return target_features(self.target, ids, valid, self.layer_ids), None


class CachedFeatures:
    """Features of every sample computed once and kept in memory (bf16: about len(ids) * F * 2 bytes per token)."""

    topk = None

    def __init__(self, target, samples, layer_ids, device, show_progress: bool = True):
        self.rows = []
        for ids, _ in tqdm(samples, desc="target features", disable=not show_progress):
            x = torch.tensor([ids], device=device)
            valid = torch.ones_like(x, dtype=torch.bool)
            self.rows.append({"features": target_features(target, x, valid, layer_ids)[0].to(torch.bfloat16).cpu()})

    def __call__(self, indices, batch):
        return _padded([self.rows[i] for i in indices], batch["input_ids"].shape[1])


class StoreFeatures:
    """Features read from a `FeatureStore` for each micro-batch: never the target, never all in memory."""

    def __init__(self, path, sample_ids: list[tuple[str, list[int]]], layer_ids: list[int], hidden_size: int):
        self.store = FeatureStore(path)
        meta = self.store.meta
        stored = list(meta["target_layer_ids"])
        if not set(layer_ids) <= set(stored) or hidden_size != meta["hidden_size"]:
            raise StoreMismatch(
                f"{path} holds target layers {stored} of hidden size {meta['hidden_size']}; this drafter reads "
                f"layers {list(layer_ids)} of hidden size {hidden_size}. Train with --target-layer-ids "
                f"{' '.join(map(str, stored))} (the default with a store) or a subset of them, or write a store for "
                "these layers with prepare-data --save-features --target-layer-ids ..."
            )
        # a drafter may read a subset of the stored layers (a store of 5 layers serves drafters of 1-5)
        H = hidden_size
        self.columns = None if list(layer_ids) == stored else torch.cat(
            [torch.arange(stored.index(i) * H, (stored.index(i) + 1) * H) for i in layer_ids]
        )
        missing = [sample_id for sample_id, _ in sample_ids if sample_id not in self.store]
        if missing:  # all of them at once: a store left unfinished lacks thousands, not one
            raise StoreMismatch(
                f"{path} has no features of {len(missing)} of the {len(sample_ids)} samples to train on (first: "
                f"{missing[0]!r}): it was written for other data, or not finished. Finish it with `hf-dflash "
                f"store-features --target TARGET --data DATA --output {path}` (it skips the samples it holds), or "
                "train on a JSONL of the samples it holds (their ids are in its index.jsonl)."
            )
        for sample_id, ids in sample_ids:
            self.store.check(sample_id, ids)
        self.ids = [sample_id for sample_id, _ in sample_ids]
        self.topk = self.store.target_topk or None

    def __call__(self, indices, batch):
        T = batch["input_ids"].shape[1]
        rows = [self.store.read(self.ids[i], rows=T) for i in indices]
        if self.columns is not None:
            rows = [{**r, "features": r["features"][:, self.columns]} for r in rows]
        return _padded(rows, T)


def _padded(rows: list[dict], length: int):
    """Stack per-sample tensors into [b, length, ...] (zeros past each sample's rows; top-K ids -1 there)."""
    features = torch.zeros(len(rows), length, rows[0]["features"].shape[-1])
    for i, r in enumerate(rows):
        features[i, : r["features"].shape[0]] = r["features"].float()
    if "topk_ids" not in rows[0]:
        return features, None
    k = rows[0]["topk_ids"].shape[-1]
    ids = torch.full((len(rows), length, k), -1, dtype=torch.long)
    probs = torch.zeros(len(rows), length, k)
    for i, r in enumerate(rows):
        n = r["topk_ids"].shape[0]
        ids[i, :n], probs[i, :n] = r["topk_ids"].long(), r["topk_probs"].float()
    return features, (ids, probs)
