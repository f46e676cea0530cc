"""Publishing and loading: model cards, remote code for plain transformers, Hub ids from a local Hub cache."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from hf_dflash import DFlash2DraftModel, DFlashDraftModel
from hf_dflash.hub import push_drafter, write_model_card

from conftest import left_padded, make_drafter, make_target


def card_metadata(path: Path) -> dict:
    text = path.read_text()
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def test_save_pretrained_writes_a_hub_ready_folder(tmp_path):
    drafter = make_drafter(make_target("qwen3"))
    drafter.save_pretrained(tmp_path)
    names = {p.name for p in tmp_path.iterdir()}
    assert {"config.json", "model.safetensors", "configuration_dflash.py", "modeling_dflash.py", "README.md"} <= names
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"] == {
        "AutoConfig": "configuration_dflash.DFlashConfig", "AutoModel": "modeling_dflash.DFlashDraftModel"
    }
    card = (tmp_path / "README.md").read_text()
    assert "{{" not in card and "{%" not in card
    meta = card_metadata(tmp_path / "README.md")
    assert {"dflash", "speculative-decoding"} <= set(meta["tags"])
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "text-generation" and meta["license"]


def test_card_records_target_training_and_results(tmp_path):
    drafter = make_drafter(make_target("qwen3"))
    drafter.set_bigram_prior(torch.tensor([3, 7]), torch.tensor([2.0, 5.0]))
    drafter.save_pretrained(tmp_path)
    (tmp_path / "training_args.json").write_text(json.dumps({"target": "org/base-model", "block_size": 4, "steps": 9}))
    results = tmp_path / "bench.json"
    results.write_text(json.dumps({"markdown": "| set | tau |\n|---|---|\n| gsm8k | 3.10 |"}))
    write_model_card(tmp_path, "me/my-drafter", str(results))
    card = (tmp_path / "README.md").read_text()
    assert card_metadata(tmp_path / "README.md")["base_model"] == "org/base-model"
    assert "me/my-drafter" in card and "| gsm8k | 3.10 |" in card and "| steps | `9` |" in card
    assert "| bigram prior | 2 token pairs" in card
    assert "{{" not in card


def test_a_dflash2_card_names_its_format_and_why_it_ships(tmp_path):
    drafter = DFlash2DraftModel.from_target(make_target("qwen3"), num_hidden_layers=1, block_size=4, mask_token_id=3,
                                            dflash_config={"conv_group_size": 8, "selector_rank": 8})
    drafter.save_pretrained(tmp_path)
    assert (tmp_path / "modeling_dflash2.py").is_file()
    why = "Chosen over a DFlash drafter trained alike: it accepted more on every set."
    (tmp_path / "training_args.json").write_text(json.dumps({"target": "org/base-model", "selection": why}))
    write_model_card(tmp_path, "me/my-drafter")
    card = (tmp_path / "README.md").read_text()
    assert "DFlash2 format" in card and "| candidate selector | rank 8, 16 candidates per position |" in card
    assert why in card and "| selection |" not in card and "bigram prior" not in card
    assert '"method": "dflash"' not in card  # the DFlash serving commands do not apply
    assert "dflash2" in card_metadata(tmp_path / "README.md")["tags"]
    assert [name for name, _ in push_drafter(tmp_path, "me/my-drafter", dry_run=True)
            if name.endswith(".py")] == ["configuration_dflash.py", "modeling_dflash.py", "modeling_dflash2.py"]


BLOCKED = "import sys; sys.modules['hf_dflash'] = None  # hf-dflash cannot be imported: plain transformers only\n"


def test_remote_code_works_without_hf_dflash(tmp_path):
    target = make_target("qwen3")
    target.save_pretrained(tmp_path / "target")
    make_drafter(target, block_size=4).save_pretrained(tmp_path / "drafter")
    ids, _ = left_padded(1, lengths=[6])
    script = BLOCKED + textwrap.dedent(f"""
        import torch
        from transformers import AutoModel, AutoModelForCausalLM
        target = AutoModelForCausalLM.from_pretrained({str(tmp_path / "target")!r}, dtype=torch.float64)
        drafter = AutoModel.from_pretrained({str(tmp_path / "drafter")!r}, trust_remote_code=True, dtype=torch.float64)
        assert type(drafter).__module__.startswith("transformers_modules"), type(drafter).__module__
        ids = torch.tensor({ids.tolist()})
        plain = target.generate(ids, max_new_tokens=12, do_sample=False)
        fast = target.generate(ids, max_new_tokens=12, do_sample=False, assistant_model=drafter,
                               speculation_type="dflash")
        assert torch.equal(plain, fast), (plain, fast)
        print("REMOTE-OK", type(drafter).__name__)
    """)
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert "REMOTE-OK DFlashDraftModel" in out.stdout, out.stderr[-3000:]


def hub_cache(root: Path, repo_id: str, folder: Path, revision: str = "0" * 40) -> None:
    """Lay `folder` out as huggingface_hub's cache does: models--org--name/{refs/main, snapshots/<hash>/...}."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(folder, repo / "snapshots" / revision)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)


def zlab_folder(drafter: DFlashDraftModel, path: Path) -> None:
    """A checkpoint as z-lab publishes it: block_size top-level, rope_theta, auto_map to their dflash.py."""
    drafter.save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    config["block_size"] = config["dflash_config"].pop("block_size")
    config["rope_theta"] = config.pop("rope_parameters")["rope_theta"]
    config["auto_map"] = {"AutoModel": "dflash.DFlashDraftModel"}
    (path / "config.json").write_text(json.dumps(config))
    for name in ("configuration_dflash.py", "modeling_dflash.py", "README.md"):
        (path / name).unlink()
    (path / "dflash.py").write_text("raise ImportError('z-lab remote code must not run when hf_dflash is installed')\n")


@pytest.mark.parametrize("layout", ["z-lab", "hf-dflash"])
def test_hub_ids_load_offline_from_the_cache(tmp_path, layout):
    target = make_target("qwen3")
    drafter = make_drafter(target, block_size=5)
    folder = tmp_path / "folder"
    zlab_folder(drafter, folder) if layout == "z-lab" else drafter.save_pretrained(folder)
    hub_cache(tmp_path / "hub", "org/tiny-dflash", folder)
    script = textwrap.dedent("""
        import torch, hf_dflash
        from transformers import AutoModel
        for loaded in (AutoModel.from_pretrained("org/tiny-dflash", revision="main"),
                       hf_dflash.DFlashDraftModel.from_pretrained("org/tiny-dflash")):
            assert type(loaded) is hf_dflash.DFlashDraftModel, type(loaded)
            assert loaded.block_size == 5
        print("HUB-OK")
    """)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert "HUB-OK" in out.stdout, out.stderr[-3000:]


def test_push_uploads_the_folder_and_dry_run_uploads_nothing(tmp_path, monkeypatch):
    make_drafter(make_target("qwen3")).save_pretrained(tmp_path)
    (tmp_path / "checkpoints" / "checkpoint-10").mkdir(parents=True)
    (tmp_path / "checkpoints" / "checkpoint-10" / "optimizer.bin").write_bytes(b"x")
    calls = []
    monkeypatch.setattr("hf_dflash.hub.HfApi.create_repo", lambda self, *a, **k: calls.append(("create", a, k)))
    monkeypatch.setattr("hf_dflash.hub.HfApi.upload_folder", lambda self, **k: calls.append(("upload", k)))
    planned = dict(push_drafter(tmp_path, "me/drafter", dry_run=True))
    assert not calls and "model.safetensors" in planned and not any(n.startswith("checkpoints") for n in planned)
    push_drafter(tmp_path, "me/drafter", private=True)
    assert calls[0][0] == "create" and calls[0][1] == ("me/drafter",) and calls[0][2]["private"] is True
    assert calls[1][1]["repo_id"] == "me/drafter" and "checkpoints/**" in calls[1][1]["ignore_patterns"]
    assert "me/drafter" in (tmp_path / "README.md").read_text()
    with pytest.raises(FileNotFoundError, match="not a saved drafter"):
        push_drafter(tmp_path / "checkpoints", "me/drafter", dry_run=True)


def test_model_safetensors_holds_the_zlab_tensors_only(tmp_path):
    """vLLM's and SGLang's loaders refuse tensors they do not know: hf-dflash's extensions (the draft vocabulary and
    the bigram prior) are saved in a file of their own and loaded back from it, and a folder saved before (its
    extensions inside model.safetensors) still loads with them."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModel

    from hf_dflash.modeling.modeling_dflash import EXTRA_TENSORS, EXTRAS_FILE

    from test_bigram import with_prior

    target = make_target()
    drafter = with_prior(make_drafter(target), target.config.vocab_size)
    drafter.set_draft_vocab(list(range(2, 70)))
    drafter.save_pretrained(tmp_path / "new")
    weights = load_file(tmp_path / "new" / "model.safetensors")
    assert not set(weights) & set(EXTRA_TENSORS)
    assert set(weights) == {n for n, _ in drafter.named_parameters()}  # the weights, by their z-lab names
    assert set(load_file(tmp_path / "new" / EXTRAS_FILE)) == set(EXTRA_TENSORS)
    # engines (vLLM, SGLang) read the index where a folder has one, else every *.safetensors: it names the weights'
    index = json.loads((tmp_path / "new" / "model.safetensors.index.json").read_text())["weight_map"]
    assert index == dict.fromkeys(weights, "model.safetensors")
    # the earlier layout: everything in model.safetensors, no extensions file
    (tmp_path / "old").mkdir()
    for name in ("config.json", "configuration_dflash.py", "modeling_dflash.py"):
        (tmp_path / "old" / name).write_bytes((tmp_path / "new" / name).read_bytes())
    save_file({**weights, **load_file(tmp_path / "new" / EXTRAS_FILE)}, tmp_path / "old" / "model.safetensors",
              metadata={"format": "pt"})
    for folder in ("new", "old"):
        loaded = AutoModel.from_pretrained(tmp_path / folder)
        for name in EXTRA_TENSORS:
            assert torch.equal(getattr(loaded, name), getattr(drafter, name)), (folder, name)
    # saved again without extensions: no stale file left behind
    drafter.set_draft_vocab(None)
    drafter.set_bigram_prior(None, None)
    drafter.save_pretrained(tmp_path / "new")
    assert not (tmp_path / "new" / EXTRAS_FILE).exists()
