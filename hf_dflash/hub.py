"""Publishing drafters: model cards rendered from `hub_cards/`, and upload of a saved drafter folder.

A drafter folder (as `save_pretrained` writes it) is a complete Hub repository: config.json + model.safetensors in
the z-lab format (vLLM / SGLang / the reference load it), the remote code (`configuration_dflash.py`,
`modeling_dflash.py`, via `auto_map`) for plain transformers, and README.md. `training_args.json` (written by
`train`) and a benchmark JSON (`hf-dflash bench`) feed the card when present.
"""

import json
from importlib.resources import files
from pathlib import Path

from huggingface_hub import HfApi, ModelCard, ModelCardData

from .modeling import DFlashDraftModel

TRAINING_ARGS = "training_args.json"
RESULTS = "bench_results.json"
REMOTE_CODE = ("configuration_dflash.py", "modeling_dflash.py")  # plus the files a folder's `auto_map` names


def _draft_tree(size) -> str:
    if size == "auto":
        return ('"auto" (hf-dflash extension: a tree of drafts sized per step from the target\'s forward costs '
                "measured on your machine; other readers verify the chain)")
    return f"{size} nodes (hf-dflash extension)" if size else "none: the chain of argmax drafts"


def render_model_card(config: dict, repo_id: str | None = None, training: dict | None = None,
                      results: dict | None = None, num_parameters: int | None = None,
                      license: str = "apache-2.0") -> ModelCard:
    """The card of a drafter from its config.json (as a dict), optional training record and benchmark results.
    Raises ValueError if the template left anything unrendered."""
    block = config.get("dflash_config") or {}
    dflash2 = "DFlash2DraftModel" in (config.get("architectures") or [])
    base_model = (training or {}).get("target") or block.get("target_model") or "unknown target"
    on_hub = "/" in base_model and not base_model.startswith(("/", "."))
    card_data = ModelCardData(
        library_name="transformers",
        base_model=base_model if on_hub else None,
        tags=["dflash", *(["dflash2"] if dflash2 else []), "speculative-decoding", "hf-dflash", "draft-model"],
        pipeline_tag="text-generation",
        license=license,
    )
    card = ModelCard.from_template(
        card_data,
        template_path=str(files("hf_dflash.hub_cards") / "drafter_card.md"),
        model_name=repo_id or f"DFlash drafter for {base_model}",
        repo_id=repo_id or "<namespace>/<this-drafter>",
        base_model=base_model,
        base_model_link=f"[`{base_model}`](https://huggingface.co/{base_model})" if on_hub else f"`{base_model}`",
        block_size=int(block.get("block_size", config.get("block_size", 16))),
        num_hidden_layers=config["num_hidden_layers"],
        hidden_size=config["hidden_size"],
        target_layer_ids=block.get("target_layer_ids"),
        mask_token_id=block.get("mask_token_id"),
        draft_vocab=(f"the {block['draft_vocab_size']:,} most frequent response tokens (hf-dflash extension: "
                     "other readers ignore it and draft over the full vocabulary)") if block.get("draft_vocab_size")
        else f"the full vocabulary ({config.get('vocab_size', '?'):,} tokens)",
        num_parameters=f"{num_parameters:,}" if num_parameters else "see model.safetensors",
        draft_tree=_draft_tree(block.get("draft_tree_size")),
        bigram_prior=(f"{block['bigram_prior']['entries']:,} token pairs of the training responses (hf-dflash "
                      "extension: drafts conditioned on their parent token; other readers ignore it)")
        if block.get("bigram_prior") else "none",
        dflash2=dflash2,
        selector_rank=block.get("selector_rank"),
        selector_top_k=block.get("selector_top_k"),
        selection=(training or {}).get("selection"),  # why this drafter ships, where a comparison chose it
        training_text=_table({k: v for k, v in training.items() if k != "selection"}) if training else "Not recorded.",
        results_text=_results(results) if results else "Not measured yet.",
    )
    if "{{" in card.content or "{%" in card.content:
        raise ValueError("The model card template left a placeholder unrendered.")
    return card


def _table(values: dict) -> str:
    rows = [f"| {key} | `{value}` |" for key, value in values.items() if value not in (None, "", {}, [])]
    return "\n".join(["| setting | value |", "|---|---|", *rows])


def _results(results: dict) -> str:
    """A benchmark summary: its markdown table when it has one, else the JSON."""
    if isinstance(results, dict) and isinstance(results.get("markdown"), str):
        return results["markdown"]
    return "```json\n" + json.dumps(results, indent=2) + "\n```"


def write_model_card(folder, repo_id: str | None = None, results: dict | str | None = None) -> Path:
    """Render README.md in a saved drafter folder from its config.json, training_args.json and results (a dict, a
    path to a benchmark JSON, or the folder's bench_results.json)."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    training = _read_json(folder / TRAINING_ARGS)
    if isinstance(results, (str, Path)):
        results = _read_json(Path(results))
    results = results or _read_json(folder / RESULTS)
    card = render_model_card(config, repo_id, training, results, _num_parameters(folder / "model.safetensors"))
    path = folder / "README.md"
    card.save(str(path))
    return path


def _read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _num_parameters(weights: Path) -> int | None:
    if not weights.is_file():
        return None
    from safetensors import safe_open

    count = 0
    with safe_open(str(weights), "pt") as f:
        for key in f.keys():
            if key in ("draft_vocab", "bigram_keys", "bigram_boosts"):  # the hf-dflash extensions' buffers
                continue
            numel = 1
            for dim in f.get_slice(key).get_shape():
                numel *= dim
            count += numel
    return count


def push_drafter(folder, repo_id: str, *, private: bool = False, token: str | None = None, revision: str | None = None,
                 dry_run: bool = False, commit_message: str = "Upload DFlash drafter") -> list[tuple[str, int]]:
    """Upload a saved drafter folder to `repo_id` (checkpoints/ and logs stay local). The card is rendered for
    `repo_id` first. Returns the uploaded files and sizes; with `dry_run` nothing is uploaded."""
    folder = Path(folder)
    config = _read_json(folder / "config.json") or {}
    # save_pretrained's auto_map names the model file (modeling_dflash2.py for a DFlash2 drafter)
    remote_code = dict.fromkeys([*REMOTE_CODE, *(f"{v.split('.')[0]}.py" for v in config.get("auto_map", {}).values())])
    missing = [name for name in ("config.json", "model.safetensors", *remote_code) if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} is not a saved drafter: missing {missing}. Save it with save_pretrained.")
    if not dry_run:
        write_model_card(folder, repo_id)
    ignore = ["checkpoints/**", ".*", "**/.*"]  # resumable training state and temp files stay local
    uploads = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if path.is_file() and relative.parts[0] != "checkpoints" and not any(p.startswith(".") for p in relative.parts):
            uploads.append((str(relative), path.stat().st_size))
    if dry_run:
        return uploads
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    api.upload_folder(folder_path=str(folder), repo_id=repo_id, revision=revision, ignore_patterns=ignore,
                      commit_message=commit_message)
    return uploads


__all__ = ["push_drafter", "render_model_card", "write_model_card"]


# `save_pretrained` writes a card with it: the modeling code stays free of imports from the rest of hf_dflash
DFlashDraftModel.card_writer = staticmethod(write_model_card)
