"""Model cards rendered from `hub_cards/`, and publishing drafters."""

import json
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

TEMPLATE = Path(__file__).resolve().parent.parent / "hub_cards" / "drafter_card.md"


def _template_path() -> Path:
    from importlib.resources import files

    packaged = files("hf_dflash.hub_cards") / "drafter_card.md"
    return Path(str(packaged)) if packaged.is_file() else TEMPLATE


def render_model_card(config, repo_id: str | None = None, training: dict | None = None, results: dict | None = None,
                      num_parameters: int | None = None, license: str = "apache-2.0") -> ModelCard:
    """A model card for a drafter config; `training` (recipe, data) and `results` (a benchmark summary) are
    optional. Raises if anything is left unrendered."""
    base_model = (training or {}).get("target") or getattr(config, "base_model", None) or "unknown"
    card_data = ModelCardData(
        library_name="transformers",
        base_model=base_model if base_model != "unknown" else None,
        tags=["dflash", "speculative-decoding", "hf-dflash", "draft-model"],
        pipeline_tag="text-generation",
        license=license,
    )
    card = ModelCard.from_template(
        card_data,
        template_path=str(_template_path()),
        model_name=repo_id or f"DFlash drafter for {base_model}",
        repo_id=repo_id or "<your-namespace>/<this-drafter>",
        base_model=base_model,
        block_size=int(config.block_size),
        num_hidden_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        target_layer_ids=config.target_layer_ids,
        mask_token_id=config.mask_token_id,
        num_parameters=f"{num_parameters / 1e6:.1f}M" if num_parameters else "see model.safetensors",
        training_text=_training_text(training),
        results_text=_results_text(results),
    )
    if "{{" in card.content or "{%" in card.content:
        raise ValueError("The model card template left a placeholder unrendered.")
    return card


def _training_text(training: dict | None) -> str:
    if not training:
        return "Not recorded."
    lines = ["| setting | value |", "|---|---|"]
    lines += [f"| {k} | `{v}` |" for k, v in training.items() if v not in (None, "", {})]
    return "\n".join(lines)


def _results_text(results: dict | None) -> str:
    if not results:
        return "Not measured yet."
    if isinstance(results, str):
        return results
    return "```json\n" + json.dumps(results, indent=2) + "\n```"


def write_model_card(folder, config, training: dict | None = None, results: dict | None = None) -> Path:
    from safetensors import safe_open

    weights = Path(folder) / "model.safetensors"
    count = None
    if weights.exists():
        with safe_open(str(weights), "pt") as f:
            count = sum(_numel(f.get_slice(k).get_shape()) for k in f.keys())
    card = render_model_card(config, training=training, results=results, num_parameters=count)
    path = Path(folder) / "README.md"
    card.save(str(path))
    return path


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
