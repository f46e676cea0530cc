"""vLLM beside hf-dflash: the benchmark's vLLM baseline through its worker process (here a stand-in `vllm` package,
so the pipe, the counters and the report are tested everywhere), and, where a vLLM virtualenv exists
(`HF_DFLASH_VLLM_PYTHON`; `examples/make_vllm_env.sh`), vLLM itself serving the drafters hf-dflash saves."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel, AutoModelForCausalLM

import hf_dflash.engines
from hf_dflash.bench import benchmark
from hf_dflash.engines import VLLM_ARGS, VLLM_PYTHON, VLLMEngine, vllm_python
from hf_dflash.packaged import packaged_model_path

from conftest import make_drafter, make_target
from test_data import chat_tokenizer  # noqa: F401 (a fixture)
from test_dflash2 import make_dflash2
from test_real_model import SHIPPED

# A stand-in for vLLM's `LLM`: each prompt's continuation is its last token + 1, + 2, ...; every call counts one
# speculative step per prompt with 2 accepted drafts when a drafter is given; it checks the drafter folder is a saved
# one and refuses an empty prompt, as a failing request
STAND_IN = '''
import json, types
from pathlib import Path


class SamplingParams:
    def __init__(self, max_tokens, temperature, top_p=1.0, seed=None):
        self.max_tokens = max_tokens

class LLM:
    def __init__(self, model, speculative_config=None, **settings):
        if model == "missing":
            raise OSError("no such model")
        self.speculative, self.steps = speculative_config, 0
        if speculative_config:
            json.loads((Path(speculative_config["model"]) / "config.json").read_text())

    def generate(self, prompts, params, use_tqdm=False):
        outputs = []
        for prompt in prompts:
            ids = prompt["prompt_token_ids"]
            if not ids:
                raise ValueError("empty prompt")
            tokens = [ids[-1] + k + 1 for k in range(params.max_tokens)]
            outputs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=tokens)]))
        self.steps += len(prompts) if self.speculative else 0
        return outputs

    def get_metrics(self):
        return [types.SimpleNamespace(name="vllm:spec_decode_num_drafts", value=self.steps),
                types.SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens", value=2 * self.steps)]
'''


@pytest.fixture
def stand_in(tmp_path, monkeypatch) -> str:
    """This python, with the stand-in `vllm` first on its path: the worker's "vLLM virtualenv"."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text(textwrap.dedent(STAND_IN))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return sys.executable


def test_the_worker_answers_and_says_what_failed(stand_in, tmp_path):
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text("{}")
    with VLLMEngine(stand_in, "target", drafter, 3) as engine:
        out = engine.generate([[5, 6], [9]], 3)
        assert out["sequences"] == [[7, 8, 9], [10, 11, 12]] and out["seconds"] > 0
        assert (out["drafts"], out["accepted"]) == (2, 4)  # this call's, not the engine's running totals
        assert engine.generate([[5]], 1)["drafts"] == 1
        with pytest.raises(RuntimeError, match="vLLM: ValueError: empty prompt"):
            engine.generate([[]], 3)
        assert engine.generate([[1]], 1)["sequences"] == [[2]]  # still serving after a failed request
    with pytest.raises(RuntimeError, match="(?s)The vLLM worker exited .* its log is .*no such model"):
        VLLMEngine(stand_in, "missing")
    with pytest.raises(FileNotFoundError, match="make_vllm_env.sh"):
        vllm_python(str(tmp_path / "nowhere" / "python"))


def test_the_benchmark_runs_vllm_beside_the_others(stand_in, tmp_path):
    """`baselines=("plain", "vllm")`: vLLM plain and with the drafter, which it loads as `save_pretrained` wrote it;
    tokens per second, identity with plain, tau from vLLM's counters; greedy only; a target without a folder skips
    it with the reason."""
    target = make_target("qwen3", dtype=torch.float32)
    target.save_pretrained(tmp_path / "target")
    target.name_or_path = str(tmp_path / "target")
    drafter = make_drafter(target, block_size=4)
    prompts = {"ids": [[3, 4, 5], [6, 7]]}
    results = benchmark(target, drafter, None, prompts, baselines=("plain", "vllm"), modes=("greedy", "sampling"),
                        max_new_tokens=6, progress=False, warmup=0, vllm=stand_in)
    greedy, sampling = results["runs"]
    plain_vllm, with_drafter = greedy["baselines"]["vllm"], greedy["baselines"]["vllm_dflash"]
    assert plain_vllm["new_tokens"] == with_drafter["new_tokens"] == 2 * 6 and plain_vllm["tokens_per_s"] > 0
    assert plain_vllm.get("tau") is None and with_drafter["tau"] == 3.0  # 1 + 2 accepted per step
    assert plain_vllm["identical"] is False  # the stand-in's tokens are not the target's
    assert sampling["baselines"]["vllm"] == {"skipped": "greedy only"}
    assert "tok/s vllm_dflash" in results["markdown"] and "(tau 3.00)" in results["markdown"]
    target.name_or_path = ""
    results = benchmark(target, drafter, None, prompts, baselines=("plain", "vllm"), max_new_tokens=4,
                        progress=False, warmup=0, vllm=stand_in)
    assert "random target" in results["runs"][0]["baselines"]["vllm"]["skipped"]


VLLM = os.environ.get(VLLM_PYTHON)
needs_vllm = pytest.mark.skipif(not VLLM, reason=f"no vLLM virtualenv: {VLLM_PYTHON} unset "
                                                 "(examples/make_vllm_env.sh builds one)")


@needs_vllm
@pytest.mark.slow
def test_vllm_serves_what_hf_dflash_saves(tmp_path, monkeypatch):
    """The shipped drafter folder and the same drafter saved again by `save_pretrained` load in vLLM as DFlash
    speculators of the packaged SmolLM2, accept drafts, and vLLM's greedy output with them is its plain output
    (float32); a DFlash2 drafter saved by hf-dflash is read as one (vLLM's CPU build then refuses to run it)."""
    monkeypatch.setenv(VLLM_ARGS, '{"enforce_eager": true}')  # no compiling: minutes per engine on a CPU
    smollm2 = packaged_model_path()
    AutoModel.from_pretrained(SHIPPED).save_pretrained(tmp_path / "saved")
    make_dflash2(make_target("llama"), block_size=8).save_pretrained(tmp_path / "dflash2")
    prompt = [[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 2, 198, 1, 4093, 198, 1780, 314, 216, 34, 1232, 216,
               34, 47, 2, 198, 1, 520, 9531, 198]]
    with VLLMEngine(VLLM, smollm2, dtype="float32") as engine:
        plain = engine.generate(prompt, 48)["sequences"]
    for folder in (SHIPPED, tmp_path / "saved"):
        with VLLMEngine(VLLM, smollm2, folder, 7, dtype="float32") as engine:
            out = engine.generate(prompt, 48)
        assert out["sequences"] == plain and out["drafts"] > 0 and 1 + out["accepted"] / out["drafts"] > 1.5
    try:
        with VLLMEngine(VLLM, smollm2, tmp_path / "dflash2", 7, dtype="float32") as engine:
            assert engine.generate(prompt, 8)["drafts"] > 0
    except RuntimeError as error:  # vLLM 0.32 runs a DFlash2 selector on its GPU (V2) model runner only; this says
        assert "DFlash candidate-head drafts" in str(error)  # it read the folder as one, refusing it on a CPU


@needs_vllm
@pytest.mark.slow
def test_vllm_loads_a_dflash2_drafter_hf_dflash_saves(tmp_path):
    """vLLM's loader builds its DFlash2 draft model (`DFlash2Qwen3ForCausalLM`) from a folder hf-dflash saved, with
    its extensions beside it, holding the saved values; the loader is strict (a missing or unknown tensor fails). vLLM's
    CPU build refuses to run a DFlash2 draft (its selector runs on the V2 GPU runner only): `engines/vllm_load_check.py`
    lifts that one check to build the model as vLLM's GPU build would."""
    smollm2 = packaged_model_path()
    drafter = make_dflash2(AutoModelForCausalLM.from_pretrained(smollm2), block_size=8)
    drafter.set_draft_vocab(list(range(2, 400)))
    drafter.save_pretrained(tmp_path)
    script = Path(hf_dflash.engines.__file__).with_name("vllm_load_check.py")
    out = subprocess.run([VLLM, str(script), str(smollm2), str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded["class"] == "DFlash2Qwen3ForCausalLM"
    saved = {name: float(t.double().sum()) for name, t in load_file(tmp_path / "model.safetensors").items()}
    # vLLM adds the target's embeddings and head (shared at serving time) and its mask embedding, and stacks q/k/v and
    # gate/up: every other tensor is a saved one, with its value, and the stacked ones hold the rest
    own = {name[len("model."):]: value for name, value in loaded["tensors"].items()
           if name not in ("lm_head.weight", "model.embed_tokens.weight", "model.mask_embedding")}
    assert {"candidate_selector.hidden_projection.weight", "layers.0.mlp_conv.base_kernel"} <= set(own) & set(saved)
    assert all(own[name] == pytest.approx(saved[name]) for name in set(own) & set(saved))
    assert sum(own.values()) == pytest.approx(sum(saved.values()))


def test_prepare_data_through_vllm(stand_in, tmp_path, chat_tokenizer):
    """`prepare-data --engine vllm`: the same chat-templated prompts go to vLLM (padding stripped), its responses are
    cut at the target's EOS and written as the transformers engine writes them, resumably, the engine recorded; it
    passes the sampling settings and a seed per batch; features it cannot give are refused by name."""
    from transformers import GenerationConfig

    from hf_dflash.engines import VLLMGenerator
    from hf_dflash.prompts import Prompt
    from hf_dflash.training.data import prepare_data

    prompts = [Prompt(str(i), [{"role": "user", "content": c * (i + 2)}]) for i, c in enumerate("abcd")]
    engine = VLLMEngine(stand_in, "target")
    sent = []
    real = engine.generate
    engine.generate = lambda *args: sent.append(args) or real(*args)
    target = VLLMGenerator(engine, "target", GenerationConfig(eos_token_id=9))
    out = tmp_path / "data.jsonl"
    stats = prepare_data(target, chat_tokenizer, prompts[:3], out, max_new_tokens=5, batch_size=2, do_sample=True,
                         temperature=0.7, top_p=0.9)
    assert stats.written == 3
    for record, prompt in zip(map(json.loads, out.read_text().splitlines()), prompts):
        ids = chat_tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, return_dict=False)
        response = [t for t in range(ids[-1] + 1, ids[-1] + 6)]
        response = response[: response.index(9) + 1] if 9 in response else response  # cut after the EOS
        assert record["input_ids"] == ids + response and record["loss_mask"] == [0] * len(ids) + [1] * len(response)
        assert record["generation"]["engine"] == "vllm"
    assert [(len(p), n, t, top_p) for p, n, t, top_p, _ in sent] == [(2, 5, 0.7, 0.9), (1, 5, 0.7, 0.9)]
    assert len({seed for *_, seed in sent}) == 2  # each batch draws anew
    assert prepare_data(target, chat_tokenizer, prompts, out, max_new_tokens=5, batch_size=2).written == 1
    with pytest.raises(ValueError, match="cannot pass"):
        target.generate(torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2), 4, output_hidden_states=True)
    engine.close()


@pytest.mark.parametrize("kind", ["shipped", "dflash2"])
def test_saved_folders_hold_what_the_engines_read(kind, tmp_path):
    """What vLLM's (0.32, `qwen3_dflash.py`, `qwen3_dflash2.py`) and SGLang's (0.5.23, `dflash_utils.
    parse_dflash_draft_config`, `models/dflash.py`) DFlash loaders read, read from the folders hf-dflash writes: the
    architecture they dispatch on, the required config fields, the target layers and mask token (top level or in
    `dflash_config`), and an index naming `model.safetensors` alone, since both engines otherwise load every
    `*.safetensors` of the folder and vLLM refuses names it does not know (the extensions file's)."""
    if kind == "shipped":
        folder = SHIPPED
    else:
        folder = tmp_path / "dflash2"
        drafter = make_dflash2(make_target("llama"), block_size=8)
        drafter.set_draft_vocab(list(range(2, 40)))  # an extension: the index must leave its file out
        drafter.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    dflash = config["dflash_config"]
    assert config["architectures"] == ["DFlash2DraftModel" if kind == "dflash2" else "DFlashDraftModel"]
    assert config["model_type"] == "qwen3" and config["hidden_act"] == "silu" and config["intermediate_size"] > 0
    assert all(config[k] > 0 for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"))
    assert config["block_size"] == dflash["block_size"] == 8
    assert len(dflash["target_layer_ids"]) * config["hidden_size"] == _fc_inputs(folder)
    assert isinstance(dflash["mask_token_id"], int)
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(index.values()) == {"model.safetensors"} and len(list(folder.glob("*.safetensors"))) == 2
    if kind == "dflash2":  # the names of vLLM's DFlash2 modules (its grouped convolutions, the selector)
        assert {"candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook",
                "candidate_selector.hidden_projection.weight", "layers.0.attention_conv.base_kernel",
                "layers.0.attention_conv.kernel_projection.weight", "layers.0.mlp_conv.base_kernel",
                "layers.0.mlp_conv.kernel_projection.weight"} <= set(index)


def _fc_inputs(folder) -> int:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return f.get_slice("fc.weight").get_shape()[1]
