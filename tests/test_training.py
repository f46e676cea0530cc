"""Training: masks against a brute-force reference, loss weights, what a step updates, end to end, resume, DDP."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from hf_dflash import DFlashDraftModel
from hf_dflash.bigram import count_bigram_prior
from hf_dflash.modeling.modeling_dflash import EXTRAS_FILE
from hf_dflash.training import (
    TrainingConfig,
    build_batch,
    default_gamma,
    drafter_loss,
    flex_training_mask,
    sample_anchors,
    slot_weights,
    train,
    training_mask,
)

from conftest import MASK, make_drafter, make_target, make_tokenizer


def brute_force_mask(anchors, anchor_valid, valid, B, window):
    b, N = anchors.shape
    T = valid.shape[1]
    out = torch.zeros(b, N * B, T + N * B, dtype=torch.bool)
    for i in range(b):
        for q in range(N * B):
            j, k = divmod(q, B)
            a = int(anchors[i, j])
            for t in range(T):  # context strictly before the anchor, real tokens, windowed by position
                ok = bool(anchor_valid[i, j]) and t < a and bool(valid[i, t])
                out[i, q, t] = ok and (window is None or (a + k) - t < window)
            for kv in range(N * B):  # own block only; causal inside it for a sliding layer
                j2, k2 = divmod(kv, B)
                out[i, q, T + kv] = j2 == j and (window is None or k2 <= k)
    return out[:, None]


@pytest.mark.parametrize("window", [None, 3])
def test_training_mask_matches_brute_force(window):
    g = torch.Generator().manual_seed(0)
    lengths, B = [11, 7, 9], 4
    samples = [([2] * n, [0, 0] + [1] * (n - 2)) for n in lengths]
    anchors = [sample_anchors(torch.tensor(m), n, g) for (_, m), n in zip(samples, [3, 2, 4])]
    batch = build_batch(samples, anchors, B, MASK)
    assert not batch["anchor_valid"].all()  # rows 0 and 1 carry padding blocks
    mask = training_mask(batch["anchors"], batch["anchor_valid"], batch["valid"], B, window)
    expected = brute_force_mask(batch["anchors"], batch["anchor_valid"], batch["valid"], B, window)
    assert torch.equal(mask, expected)
    assert mask.any(-1).all()  # no fully masked row, padding blocks included


@pytest.mark.parametrize("window", [None, 3])
def test_flex_attention_mask_matches_the_dense_mask(window):
    from torch.nn.attention.flex_attention import create_mask

    g = torch.Generator().manual_seed(1)
    samples = [([2] * n, [0] + [1] * (n - 1)) for n in [10, 6]]
    anchors = [sample_anchors(torch.tensor(m), 3, g) for _, m in samples]
    batch = build_batch(samples, anchors, 4, MASK)
    args = (batch["anchors"], batch["anchor_valid"], batch["valid"], 4, window)
    dense = training_mask(*args)
    block_mask = flex_training_mask(*args)  # what CUDA training uses with flex_attention
    flex = create_mask(block_mask.mask_mod, len(samples), None, dense.shape[-2], dense.shape[-1], device="cpu")
    assert torch.equal(flex.expand_as(dense), dense)


def test_anchors_need_supervised_next_token():
    mask = torch.tensor([0, 1, 1, 0, 1, 1, 1, 0])
    anchors = sample_anchors(mask, 100, torch.Generator().manual_seed(0))
    assert anchors.tolist() == [1, 4, 5]  # a with mask[a] = mask[a + 1] = 1
    assert len(sample_anchors(mask, 2, torch.Generator().manual_seed(0))) == 2


def test_labels_are_same_position_not_shifted():
    ids = list(range(10, 30))
    batch = build_batch([(ids, [1] * 20)], [torch.tensor([5])], 4, MASK)
    assert batch["block_ids"][0].tolist() == [15, MASK, MASK, MASK]
    assert batch["labels"][0, 0, 1:].tolist() == [16, 17, 18]  # slot k predicts x_{a+k}
    assert batch["block_pos"][0].tolist() == [5, 6, 7, 8]


def test_slot_weights_follow_the_recipe():
    assert (default_gamma(16), default_gamma(10), default_gamma(8)) == (7.0, 5.0, 4.0)
    w = slot_weights(8)
    assert w[0] == 0 and w[1] == 1
    torch.testing.assert_close(w[2:], torch.exp(-torch.arange(1, 7) / 4.0))
    torch.testing.assert_close(slot_weights(4, gamma=2.0)[3], torch.exp(torch.tensor(-1.0)))


def one_step_inputs(target, drafter, block_size: int = 4):
    """A micro-batch of two random samples (6 anchors each) and the target's features for it."""
    samples = [(torch.randint(2, MASK, (24,)).tolist(), [0] * 4 + [1] * 20) for _ in range(2)]
    g = torch.Generator().manual_seed(0)
    batch = build_batch(samples, [sample_anchors(torch.tensor(m), 6, g) for _, m in samples], block_size, MASK)
    with torch.no_grad():
        out = target(input_ids=batch["input_ids"], attention_mask=batch["valid"].long(), output_hidden_states=True)
    return batch, torch.cat([out.hidden_states[i + 1] for i in drafter.config.target_layer_ids], -1)


def test_one_step_updates_every_trainable_parameter_and_nothing_frozen():
    target = make_target("qwen3", dtype=torch.float32).requires_grad_(False)  # as train() freezes it
    drafter = make_drafter(target, block_size=4, num_hidden_layers=2).float().train()
    frozen = {k: v.clone() for k, v in target.state_dict().items()}
    before = {k: v.clone() for k, v in drafter.named_parameters()}
    batch, features = one_step_inputs(target, drafter)
    config = TrainingConfig(target="", data="", output="", block_size=4)
    loss, metrics = drafter_loss(drafter, target, batch, features, config, slot_weights(4))
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-2)
    loss.backward()
    optimizer.step()
    assert loss.item() > 0 and metrics["slot_count"].sum() > 0
    for name, value in drafter.named_parameters():
        assert not torch.equal(value, before[name]), f"{name} did not change"
    for name, value in target.state_dict().items():
        assert torch.equal(value, frozen[name]), f"frozen {name} changed"


def test_chunked_loss_equals_the_one_shot_loss_and_gradient():
    from hf_dflash.training import chunked_loss

    head = make_target("qwen3").get_output_embeddings()
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(40, head.weight.shape[1], generator=g, dtype=torch.float64)
    labels = torch.randint(0, head.weight.shape[0], (40,), generator=g)
    mask, weights = torch.rand(40, generator=g) > 0.3, torch.rand(40, generator=g, dtype=torch.float64)
    results = []
    for chunk_size in (7, 64):  # several recomputed chunks; one chunk kept for backward
        h = hidden.clone().requires_grad_(True)
        loss, correct = chunked_loss(h, head, labels, mask, weights, chunk_size)
        loss.backward()
        results.append((loss.detach(), correct, h.grad))
    expected = (torch.nn.functional.cross_entropy(head(hidden).float(), labels, reduction="none") * weights)[mask].sum()
    torch.testing.assert_close(results[0][0], expected, check_dtype=False)
    for a, b in zip(*results):
        torch.testing.assert_close(a, b)
    assert results[0][2][~mask].abs().max() == 0 and results[0][2][mask].abs().max() > 0


def tiny_data(target, path, n=48, prompt_len=5, new_tokens=40):
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(2, target.config.vocab_size - 1, (n, prompt_len), generator=g)
    out = target.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens, do_sample=False)
    with open(path, "w") as f:
        for i, row in enumerate(out.tolist()):
            record = {"id": str(i), "input_ids": row, "loss_mask": [0] * prompt_len + [1] * new_tokens}
            f.write(json.dumps(record) + "\n")
    return prompts


def acceptance(target, drafter, prompts):
    out = target.generate(
        prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=30, do_sample=False,
        assistant_model=drafter, return_dict_in_generate=True,
    )
    steps = [n for row in out.acceptance_lengths for n in row]
    return sum(steps) / len(steps)  # tokens committed per target forward


@pytest.mark.slow
def test_training_raises_real_acceptance_length(tmp_path):
    target = make_target("qwen3", dtype=torch.float32, vocab_size=48)
    prompts = tiny_data(target, tmp_path / "data.jsonl")
    tokenizer = make_tokenizer(48)
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["abcde", "xyz!?"]))
    config = TrainingConfig(
        target="tiny", data=str(tmp_path / "data.jsonl"), output=str(tmp_path / "drafter"), block_size=4,
        mask_token_id=47, num_anchors=40, batch_size=8, max_steps=200, learning_rate=3e-3, warmup_ratio=0.02,
        logging_steps=50, save_steps=1000, eval_prompts=str(tmp_path / "eval.jsonl"), eval_steps=100,
        eval_max_new_tokens=16,
    )
    untrained = make_drafter(target, block_size=4, mask_token_id=47)
    drafter = train(config, target=target, tokenizer=tokenizer)
    before, after = acceptance(target, untrained, prompts[:8]), acceptance(target, drafter, prompts[:8])
    assert after > before + 0.5, (before, after)
    log = [json.loads(line) for line in open(tmp_path / "drafter" / "train_log.jsonl")]
    metrics = [r for r in log if "loss" in r]
    assert metrics[-1]["loss"] < metrics[0]["loss"] and metrics[-1]["predicted_tau"] > metrics[0]["predicted_tau"]
    evals = [r for r in log if "eval" in r]  # steps 100, 200 and the final one: real generate() acceptance
    assert [r["step"] for r in evals] == [100, 200, 200] and evals[-1]["eval"]["acceptance_length"] >= 1.0
    saved = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert saved["dflash_config"]["mask_token_id"] == 47 and saved["architectures"] == ["DFlashDraftModel"]
    assert "{{" not in (tmp_path / "drafter" / "README.md").read_text()


def _cli_setup(tmp_path):
    target = make_target("qwen3", dtype=torch.float32, vocab_size=48)
    target.save_pretrained(tmp_path / "target")
    tiny_data(target, tmp_path / "data.jsonl", n=16)
    return ["--target", str(tmp_path / "target"), "--data", str(tmp_path / "data.jsonl"), "--block-size", "4",
            "--mask-token-id", "47", "--num-anchors", "8", "--learning-rate", "3e-3", "--logging-steps", "5"]


ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.mark.slow
def test_resume_after_kill_continues_the_same_run(tmp_path):
    args = _cli_setup(tmp_path) + ["--batch-size", "2", "--max-steps", "160", "--save-steps", "10"]
    train_cmd = [sys.executable, "-m", "hf_dflash", "train"]
    subprocess.run(train_cmd + args + ["--output", str(tmp_path / "straight")], check=True, env=ENV)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(train_cmd + args + ["--output", str(killed)], env=ENV)
    deadline = time.time() + 120
    while not (killed / "checkpoints" / "checkpoint-20").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "model.safetensors").exists()  # it really died mid-run
    done = sorted(p.name for p in (killed / "checkpoints").iterdir() if not p.name.startswith("."))
    assert "checkpoint-10" in done
    subprocess.run(train_cmd + args + ["--output", str(killed), "--resume"], check=True, env=ENV)
    a, b = load_file(tmp_path / "straight" / "model.safetensors"), load_file(killed / "model.safetensors")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_two_process_ddp_matches_single_process(tmp_path):
    # ce: dpace rescales its weights per micro-batch (to the recipe's total), so its split batches differ slightly
    args = _cli_setup(tmp_path) + ["--max-steps", "6", "--save-steps", "100", "--logging-steps", "1", "--loss", "ce"]
    single = [sys.executable, "-m", "hf_dflash", "train", "--batch-size", "4"]
    subprocess.run(single + args + ["--output", str(tmp_path / "one")], check=True, env=ENV)
    # Two CPU processes over gloo: accelerate's torchrun launcher (--multi_gpu) told to stay on the CPU.
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "-m", "hf_dflash", "train", "--batch-size", "2"]
    env = {**ENV, "ACCELERATE_USE_CPU": "true"}
    subprocess.run(launch + args + ["--output", str(tmp_path / "two")], check=True, env=env, timeout=300)
    log = [json.loads(line) for line in open(tmp_path / "two" / "train_log.jsonl")]
    assert log[0]["tokens_per_s"] > 0
    one = [json.loads(line) for line in open(tmp_path / "one" / "train_log.jsonl")]
    assert abs(one[0]["loss"] - log[0]["loss"]) < 1e-5  # the same global batch, anchors and loss normalisation
    a, b = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    torch.manual_seed(0)  # the CLI's initialisation, to measure how far training moved the weights
    saved_target = AutoModelForCausalLM.from_pretrained(tmp_path / "target")
    start = DFlashDraftModel.from_target(saved_target, 1, 4, 47).state_dict()
    weights = [k for k in a if k in start]
    # the bigram prior (in the extensions file), counted alike by both runs
    prior_a, prior_b = (load_file(tmp_path / run / EXTRAS_FILE) for run in ("one", "two"))
    assert all(torch.equal(prior_a[k], prior_b[k]) for k in ("bigram_keys", "bigram_boosts"))
    moved = sum((a[k] - start[k]).norm() ** 2 for k in weights) ** 0.5
    apart = sum((a[k] - b[k]).norm() ** 2 for k in weights) ** 0.5
    # Adam turns float-summation noise in near-zero gradients into +-lr steps, so the runs are close, not equal
    assert apart < 0.05 * moved, (float(apart), float(moved))


class _LaggingRankAccelerator:
    """Rank 0 of two, where rank 1 writes its RNG state into the checkpoint folder only at the next barrier: the
    interleaving that made the two-process run fail when rank 0 renamed the folder first."""

    is_main_process = True

    def __init__(self):
        self.pending = None

    def save_state(self, folder):
        os.makedirs(folder, exist_ok=True)
        (Path(folder) / "random_states_0.pkl").write_bytes(b"0")
        self.pending = Path(folder) / "random_states_1.pkl"

    def wait_for_everyone(self):
        if self.pending is not None:
            self.pending.write_bytes(b"1")  # FileNotFoundError if the folder was renamed under rank 1
            self.pending = None


def test_checkpoint_is_renamed_only_after_every_process_wrote_into_it(tmp_path):
    from hf_dflash.training.loop import _save_checkpoint

    _save_checkpoint(_LaggingRankAccelerator(), tmp_path, 7)
    saved = tmp_path / "checkpoint-7"
    written = sorted(p.name for p in saved.iterdir())
    assert written == ["random_states_0.pkl", "random_states_1.pkl", "trainer_state.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-7"]


def test_draft_vocab_size_saves_the_most_frequent_response_tokens(tmp_path):
    from hf_dflash.training.data import frequent_tokens, load_samples

    target = make_target("qwen3", dtype=torch.float32, vocab_size=48)
    tiny_data(target, tmp_path / "data.jsonl", n=8)
    config = TrainingConfig(
        target="tiny", data=str(tmp_path / "data.jsonl"), output=str(tmp_path / "drafter"), block_size=4,
        mask_token_id=47, num_anchors=8, batch_size=2, max_steps=2, draft_vocab_size=10,
    )
    train(config, target=target, tokenizer=make_tokenizer(48))
    saved = DFlashDraftModel.from_pretrained(tmp_path / "drafter")
    samples, _ = load_samples(tmp_path / "data.jsonl")
    counts = torch.bincount(torch.tensor([t for ids, mask in samples for t, m in zip(ids, mask) if m]), minlength=48)
    assert saved.config.dflash_config["draft_vocab_size"] == 10
    assert sorted(saved.draft_vocab.tolist()) == sorted(frequent_tokens(samples, 10))
    # no token left out is more frequent than a token kept
    left_out = torch.ones(48, dtype=torch.bool)
    left_out[saved.draft_vocab] = False
    assert counts[left_out].max() <= counts[saved.draft_vocab].min()
    # the bigram prior of the same responses, over the draft vocabulary, counted into the saved drafter
    keys, boosts = count_bigram_prior(samples, 48, saved.draft_vocab)
    assert keys.numel() > 0 and torch.equal(saved.bigram_prior[0], keys)
    torch.testing.assert_close(saved.bigram_prior[1], boosts)
    train(TrainingConfig(**{**config.__dict__, "output": str(tmp_path / "bare"), "bigram_prior": False}),
          target=target, tokenizer=make_tokenizer(48))
    assert DFlashDraftModel.from_pretrained(tmp_path / "bare").bigram_prior is None


def test_bigram_prior_command_adds_the_prior_and_keeps_the_folder(tmp_path):
    from hf_dflash.cli import main
    from hf_dflash.training.data import load_samples

    target = make_target("qwen3", dtype=torch.float32, vocab_size=48)
    tiny_data(target, tmp_path / "data.jsonl", n=8)
    make_drafter(target, block_size=4, mask_token_id=47).save_pretrained(tmp_path / "d")
    (tmp_path / "d" / "README.md").write_text("my card")
    weights = (tmp_path / "d" / "model.safetensors").read_bytes()
    assert main(["bigram-prior", str(tmp_path / "d"), "--data", str(tmp_path / "data.jsonl"), "--output",
                 str(tmp_path / "out"), "--min-count", "1"]) == 0
    assert (tmp_path / "d" / "model.safetensors").read_bytes() == weights  # the source is left as it was
    assert DFlashDraftModel.from_pretrained(tmp_path / "d").bigram_prior is None
    samples, _ = load_samples(tmp_path / "data.jsonl")
    keys, _ = count_bigram_prior(samples, 48, min_count=1)
    written = DFlashDraftModel.from_pretrained(tmp_path / "out")
    assert torch.equal(written.bigram_prior[0], keys)
    assert written.config.dflash_config["bigram_prior"]["min_count"] == 1
    assert (tmp_path / "out" / "README.md").read_text() == "my card"
    main(["bigram-prior", str(tmp_path / "d"), "--data", str(tmp_path / "data.jsonl")])  # in place
    assert DFlashDraftModel.from_pretrained(tmp_path / "d").bigram_prior is not None
    assert (tmp_path / "d" / "README.md").read_text() == "my card"


def test_init_from_a_drafter_folder_or_a_checkpoint(tmp_path):
    from hf_dflash.training import load_drafter_weights

    target = make_target("qwen3", dtype=torch.float32, vocab_size=48)
    tiny_data(target, tmp_path / "data.jsonl", n=8)
    config = TrainingConfig(
        target="tiny", data=str(tmp_path / "data.jsonl"), output=str(tmp_path / "first"), block_size=4,
        mask_token_id=47, num_anchors=8, batch_size=2, max_steps=4, save_steps=2, draft_vocab_size=12,
    )
    first = train(config, target=target, tokenizer=make_tokenizer(48))
    for source in (tmp_path / "first", tmp_path / "first" / "checkpoints" / "checkpoint-4"):
        fresh = make_drafter(target, block_size=4, mask_token_id=47, seed=5)
        load_drafter_weights(fresh, str(source))
        for name, tensor in first.state_dict().items():
            if name not in ("draft_vocab", "bigram_keys", "bigram_boosts"):
                torch.testing.assert_close(fresh.state_dict()[name], tensor, msg=f"{name} from {source}")
        assert fresh.draft_vocab is None and fresh.bigram_prior is None  # a run sets its own

    # a second run starts where the first ended: its first logged loss is the first run's level, not random init's
    second = TrainingConfig(**{**config.__dict__, "output": str(tmp_path / "second"),
                               "init_from": str(tmp_path / "first"), "max_steps": 1, "logging_steps": 1,
                               "learning_rate": 1e-9})
    train(second, target=target, tokenizer=make_tokenizer(48))
    start = json.loads((tmp_path / "second" / "train_log.jsonl").read_text().splitlines()[0])["loss"]
    fresh_run = TrainingConfig(**{**second.__dict__, "output": str(tmp_path / "fresh"), "init_from": None})
    train(fresh_run, target=target, tokenizer=make_tokenizer(48))
    random_start = json.loads((tmp_path / "fresh" / "train_log.jsonl").read_text().splitlines()[0])["loss"]
    assert start < random_start

    with pytest.raises(ValueError, match="same num_layers"):
        deeper = make_drafter(target, block_size=4, num_hidden_layers=2, mask_token_id=47)
        load_drafter_weights(deeper, str(tmp_path / "first"))
