"""The feature store: features captured while regenerating equal the target's own, resume after a kill loses and
duplicates nothing, lazy reading equals in-memory features, and a store that does not fit is refused clearly."""

import json

import pytest
import torch

from hf_dflash.prompts import DataError, read_prompts
from hf_dflash.training import FeatureStore, StoreMismatch, TrainingConfig, target_features, train
from hf_dflash.training.data import load_samples, prepare_data, store_features
from hf_dflash.training.features import CachedFeatures, StoreFeatures

from conftest import make_hybrid, make_target, make_tokenizer

LAYERS = [0, 2]


# a hybrid target too (Gated DeltaNet layers): regeneration, the store and training read only its forwards' outputs
@pytest.fixture(params=["qwen3", "qwen3_5_text"])
def setup(tmp_path, request):
    target = make_target("qwen3", dtype=torch.float64) if request.param == "qwen3" else make_hybrid(request.param)
    tokenizer = make_tokenizer()
    tokenizer.chat_template = (
        "{% for m in messages %}<s>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<s>{% endif %}"
    )
    lines = [json.dumps({"prompt": c * (i % 4 + 2)}) for i, c in enumerate("abcdefgh")]
    (tmp_path / "p.jsonl").write_text("\n".join(lines) + "\n")
    return target, tokenizer, list(read_prompts(tmp_path / "p.jsonl"))


def regenerate(setup, tmp_path, prompts=None, max_new_tokens=7, **kwargs):
    target, tokenizer, all_prompts = setup
    return prepare_data(
        target, tokenizer, all_prompts if prompts is None else prompts, tmp_path / "data.jsonl",
        max_new_tokens=max_new_tokens,
        batch_size=3, save_features=tmp_path / "store", target_layer_ids=LAYERS, target_topk=4, **kwargs,
    )


def records(tmp_path):
    return [json.loads(line) for line in (tmp_path / "data.jsonl").read_text().splitlines()]


def test_features_captured_while_generating_equal_a_full_forward(setup, tmp_path):
    target = setup[0]
    stats = regenerate(setup, tmp_path)
    assert stats.written == 8
    store = FeatureStore(tmp_path / "store")
    assert store.meta["target_layer_ids"] == LAYERS and store.target_topk == 4 and len(store) == 8
    for record in records(tmp_path):
        ids = torch.tensor([record["input_ids"]])
        stored = store.read(record["id"])
        n = ids.shape[1]
        assert stored["features"].shape == (n - 1, 2 * target.config.hidden_size)  # the last token is never fed
        full = target_features(target, ids, torch.ones_like(ids, dtype=torch.bool), LAYERS)[0, : n - 1]
        torch.testing.assert_close(stored["features"].double(), full.to(torch.bfloat16).double(), atol=0, rtol=0.01)
        # top-K: the target's next-token distribution at each response position (prompt positions but the last: -1)
        logits = target(ids).logits[0, : n - 1].float()
        start = record["loss_mask"].index(1) - 1
        assert (stored["topk_ids"][:start] == -1).all()
        assert torch.equal(stored["topk_ids"][start:, 0].long(), logits[start:].argmax(-1))
        expected = logits.softmax(-1).topk(4).values[start:]
        torch.testing.assert_close(stored["topk_probs"][start:].float(), expected, atol=0.01, rtol=0.01)


def test_store_rebuilt_from_the_data_equals_the_one_captured_while_generating(setup, tmp_path):
    """`store_features`: the store of a prepared JSONL without regenerating (a lost store rebuilt from the text)."""
    target = setup[0]
    regenerate(setup, tmp_path)
    captured = FeatureStore(tmp_path / "store")
    written = store_features(target, tmp_path / "data.jsonl", tmp_path / "rebuilt", target_layer_ids=LAYERS,
                             target_topk=4, batch_size=3)
    rebuilt = FeatureStore(tmp_path / "rebuilt")
    assert written == len(rebuilt) == 8 and rebuilt.meta["target_layer_ids"] == LAYERS and rebuilt.target_topk == 4
    for record in records(tmp_path):
        a, b = captured.read(record["id"]), rebuilt.read(record["id"])
        assert a["features"].shape == b["features"].shape
        torch.testing.assert_close(b["features"].double(), a["features"].double(), atol=0, rtol=0.01)
        assert torch.equal(b["topk_ids"] == -1, a["topk_ids"] == -1)  # the same response rows
        assert torch.equal(b["topk_ids"][:, 0], a["topk_ids"][:, 0])
        torch.testing.assert_close(b["topk_probs"].float(), a["topk_probs"].float(), atol=0.01, rtol=0.01)
    assert store_features(target, tmp_path / "data.jsonl", tmp_path / "rebuilt", target_layer_ids=LAYERS,
                          target_topk=4) == 0  # resumable: nothing left to write
    (tmp_path / "bad.jsonl").write_text(json.dumps({"id": "x", "input_ids": [1, 2]}) + "\n")
    with pytest.raises(DataError, match="bad.jsonl:1: not a prepared sample"):
        store_features(target, tmp_path / "bad.jsonl", tmp_path / "other", target_layer_ids=LAYERS)


def test_resume_after_a_kill_loses_and_duplicates_nothing(setup, tmp_path):
    target, tokenizer, prompts = setup
    regenerate(setup, tmp_path, prompts[:3])
    # a kill after the store's shard and index but before the JSONL line: the store is one sample ahead ...
    data = tmp_path / "data.jsonl"
    lines = data.read_text().splitlines(keepends=True)
    data.write_text("".join(lines[:2]) + lines[2][:10])  # ... and the JSONL's last line is cut off
    (tmp_path / "store" / ".tmp-shard-000009.safetensors").write_bytes(b"half a shard")
    with open(tmp_path / "store" / "index.jsonl", "a") as f:
        f.write('{"id": "cut')
    regenerate(setup, tmp_path)
    ids = [r["id"] for r in records(tmp_path)]
    assert sorted(ids) == sorted(p.id for p in prompts)  # every prompt once
    store = FeatureStore(tmp_path / "store")
    assert sorted(store.entries) == sorted(ids)
    assert not list((tmp_path / "store").glob(".tmp-*"))
    shards = {e["shard"] for e in store.entries.values()}
    assert shards == {p.name for p in (tmp_path / "store").glob("shard-*.safetensors")}  # no orphan shard
    for record in records(tmp_path):
        store.check(record["id"], record["input_ids"])
    # other settings into the same folder: refused, nothing touched
    with pytest.raises(StoreMismatch, match="other settings"):
        prepare_data(target, tokenizer, prompts, tmp_path / "data.jsonl", save_features=tmp_path / "store",
                     target_layer_ids=[1, 2])
    # a JSONL made without features cannot silently get a store with holes
    prepare_data(target, tokenizer, prompts[:2], tmp_path / "plain.jsonl", max_new_tokens=7)
    with pytest.raises(StoreMismatch, match="without features"):
        prepare_data(target, tokenizer, prompts, tmp_path / "plain.jsonl", save_features=tmp_path / "other")


def test_lazy_store_reading_equals_in_memory_features(setup, tmp_path):
    target = setup[0]
    regenerate(setup, tmp_path)
    checks = []
    samples, _ = load_samples(tmp_path / "data.jsonl", checks=checks, max_length=9)  # truncation too
    lazy = StoreFeatures(tmp_path / "store", checks, LAYERS, target.config.hidden_size)
    memory = CachedFeatures(target, samples, LAYERS, "cpu", show_progress=False)
    batch = {"input_ids": torch.zeros(3, 9, dtype=torch.long)}
    a, topk = lazy([0, 5, 7], batch)
    b, _ = memory([0, 5, 7], batch)
    for i, s in enumerate([0, 5, 7]):
        n = len(samples[s][0]) - 1  # the store lacks the last token's features, never used as context
        torch.testing.assert_close(a[i, :n], b[i, :n], atol=0, rtol=0.01)
    assert topk[0].shape == (3, 9, 4) and topk[1].shape == (3, 9, 4)
    # a drafter reading a subset of the stored layers gets those columns
    subset, _ = StoreFeatures(tmp_path / "store", checks, [2], target.config.hidden_size)([0, 5, 7], batch)
    torch.testing.assert_close(subset, a[..., target.config.hidden_size :], atol=0, rtol=0)


def test_store_that_does_not_fit_is_refused(setup, tmp_path):
    target = setup[0]
    regenerate(setup, tmp_path)
    checks = []
    load_samples(tmp_path / "data.jsonl", checks=checks)
    with pytest.raises(StoreMismatch, match="--target-layer-ids 0 2"):
        StoreFeatures(tmp_path / "store", checks, [1, 2], target.config.hidden_size)
    edited = [(i, ids[:-1] + [ids[-1] % 90 + 2]) if k == 0 else (i, ids) for k, (i, ids) in enumerate(checks)]
    with pytest.raises(StoreMismatch, match="other tokens"):
        StoreFeatures(tmp_path / "store", edited, LAYERS, target.config.hidden_size)
    # an unfinished store: every missing sample counted at once, and the command that finishes it named
    unfinished = checks + [("nope", [1, 2]), ("later", [3, 4])]
    expected = rf"no features of 2 of the {len(unfinished)} samples .*first: 'nope'.*store-features"
    with pytest.raises(StoreMismatch, match=expected):
        StoreFeatures(tmp_path / "store", unfinished, LAYERS, target.config.hidden_size)
    with pytest.raises(StoreMismatch, match="no features of sample 'nope'.*store-features"):
        FeatureStore(tmp_path / "store").check("nope", [1, 2])
    with pytest.raises(FileNotFoundError, match="not a feature store"):
        FeatureStore(tmp_path)


def test_training_from_the_store_never_runs_the_target_for_features(setup, tmp_path, monkeypatch):
    target = setup[0].float()
    regenerate((target, *setup[1:]), tmp_path, max_new_tokens=12)
    common = dict(target="tiny", data=str(tmp_path / "data.jsonl"), block_size=4, mask_token_id=95, num_anchors=8,
                  batch_size=2, max_steps=3, logging_steps=1, save_steps=100, bf16=False, target_layer_ids=LAYERS)
    train(TrainingConfig(output=str(tmp_path / "cached"), cache_features=True, **common), target=target)
    calls = []
    target.register_forward_pre_hook(lambda *a: calls.append(1))
    store_config = TrainingConfig(output=str(tmp_path / "stored"), features=str(tmp_path / "store"),
                                  loss="lk", **{**common, "target_layer_ids": None})  # layers from the store
    drafter = train(store_config, target=target)
    assert calls == [] and drafter.config.target_layer_ids == LAYERS
    log = [json.loads(line) for line in (tmp_path / "stored" / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == 3 and all(r["loss"] > 0 for r in log)
    # the same features (bf16 either way) give the same first loss as the in-memory cache, for the same loss
    ce = TrainingConfig(output=str(tmp_path / "stored-ce"), features=str(tmp_path / "store"), **common)
    train(ce, target=target)
    first = [json.loads((tmp_path / d / "train_log.jsonl").read_text().splitlines()[0])["loss"]
             for d in ("cached", "stored-ce")]
    assert abs(first[0] - first[1]) < 1e-3 * first[0], first


def test_lk_loss_needs_a_store_with_the_target_distribution(setup, tmp_path):
    target = make_target("qwen3", dtype=torch.float32)
    regenerate((target, *setup[1:]), tmp_path, max_new_tokens=12)
    config = TrainingConfig(target="tiny", data=str(tmp_path / "data.jsonl"), output=str(tmp_path / "o"), block_size=4,
                            mask_token_id=95, num_anchors=8, max_steps=1, loss="lk", target_layer_ids=LAYERS)
    with pytest.raises(ValueError, match="--target-topk"):
        train(config, target=target)
    with pytest.raises(ValueError, match="choose one of ce, dpace, lk"):
        TrainingConfig(target="t", data="d", output="o", loss="kl")
