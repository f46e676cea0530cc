"""Speculative decoding with a DFlash drafter inside `target.generate()`.

`generate()` lets transformers prepare everything a user configured (generation config, logits processors, stopping
criteria, attention mask, max length) and hands the decoding loop to `dflash_decode` through `custom_generate`. The
loop itself, `speculative_loop`, reads top to bottom: prefill, then propose / verify / accept until every row has
stopped. The drafter's side of it is a proposer (`hf_dflash.generation.proposer`), the target's a decoder
(`hf_dflash.generation.decoder`, or the fixed-shape path's `fixed_shape.FixedShapeDecoder`: the same interface);
they meet only here. `DFlashCall` resolves one call's settings, chooses its path and builds its sides.
"""

import copy
import functools

import torch
from transformers import GenerationMixin
from transformers.generation import StoppingCriteriaList, StopStringCriteria
from transformers.utils import logging

from ..cpu_ops import packed_linears
from ..devices import without_cudnn_attention
from ..modeling import DFlashDraftModel
from ..native import as_dflash_drafter, is_native_drafter
from .decoder import Decoder, prompt_positions
from .fixed_shape import FixedShapeDecoder, RowDrafterCache, unsupported_reason, wants_fixed_shape
from .kv_cache import warn_unused_cache
from .proposer import DFlashProposer, DynamicDrafterCache, draft_settings, with_auto

logger = logging.get_logger(__name__)


def unhooked(function):
    """`function` without hf_dflash's hook around it (`hf_dflash.generation.hooks`), if it has one."""
    return function.__wrapped__ if getattr(function, "_hf_dflash_hook", False) else function


# transformers' own `GenerationMixin.generate`, whether or not the hooks are installed when this module loads
original_generate = unhooked(GenerationMixin.generate)


def generate(target, drafter: DFlashDraftModel, inputs=None, **kwargs):
    """`target.generate(inputs, **kwargs)` with DFlash drafts; works without the `assistant_model` hook.

    Everything `generate` accepts is accepted, except beam search (`num_beams > 1`). Two settings of assisted
    generation (a `generate` argument, or set in the generation config) shape the drafts, for hardware where verifying
    a block costs much more than a one-token step (CPUs): `num_assistant_tokens` drafts fewer tokens per step than
    the drafter's block holds; `assistant_confidence_threshold` makes a step verify no drafts when the drafter's
    probability for its first draft is below it, in every row (default: the drafter config's
    `dflash_config["assistant_confidence_threshold"]`, else 0, never skipping).

    `draft_tree_size=N` (an argument, a generation config attribute, else the drafter config's
    `dflash_config["draft_tree_size"]`, else 0) verifies a tree of at most N drafts per step, built best-first from
    the drafter's distributions (`hf_dflash.generation.tree`); 0 verifies the chain of argmax drafts. `"auto"`
    chooses the tree size per step from the target's measured forward costs (`hf_dflash.generation.auto_size`); then
    only an explicit `assistant_confidence_threshold` applies, not the drafter's default.

    `drafter`: a `DFlashDraftModel` or `DFlash2DraftModel`, or one of transformers' own DFlash drafters
    (`muse_glimmer_assistant`, through `hf_dflash.native`).
    """
    if is_native_drafter(drafter):
        drafter = as_dflash_drafter(drafter, target.get_output_embeddings().weight.shape[0])
    generation_config = kwargs.pop("generation_config", None)
    config = generation_config if generation_config is not None else target.generation_config
    if (kwargs.get("num_beams") or config.num_beams or 1) > 1:
        raise ValueError("DFlash speculative decoding does not support beam search: use num_beams=1.")
    num_drafts = kwargs.pop("num_assistant_tokens", None)
    num_drafts = config.num_assistant_tokens if num_drafts is None else num_drafts
    threshold = kwargs.pop("assistant_confidence_threshold", None)
    threshold = config.assistant_confidence_threshold if threshold is None else threshold
    tree_size = kwargs.pop("draft_tree_size", None)
    tree_size = getattr(config, "draft_tree_size", None) if tree_size is None else tree_size
    # transformers drops `tokenizer` and `streamer` before a `custom_generate` callable runs: stop strings become a
    # stopping criterion here, and the streamer goes to the loop directly.
    tokenizer = kwargs.pop("tokenizer", None)
    stop_strings = kwargs.pop("stop_strings", None)
    if stop_strings is None and config.stop_strings:
        stop_strings = config.stop_strings
        generation_config = copy.deepcopy(config)
        generation_config.stop_strings = None
    if stop_strings:
        if tokenizer is None:
            raise ValueError("stop_strings need the tokenizer: pass tokenizer=... to generate().")
        criteria = StoppingCriteriaList(kwargs.pop("stopping_criteria", None) or [])
        criteria.append(StopStringCriteria(tokenizer, stop_strings))
        kwargs["stopping_criteria"] = criteria
    decode = functools.partial(
        dflash_decode, drafter=drafter, num_assistant_tokens=num_drafts, assistant_confidence_threshold=threshold,
        draft_tree_size=tree_size, streamer=kwargs.get("streamer"),
    )
    return original_generate(target, inputs, generation_config=generation_config, custom_generate=decode, **kwargs)


@torch.no_grad()
def dflash_decode(
    model,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    drafter: DFlashDraftModel = None,
    num_assistant_tokens: int | None = None,
    assistant_confidence_threshold: float | None = None,
    draft_tree_size: int | str | None = None,
    streamer=None,
    **model_kwargs,
):
    """The decoding loop, called by `GenerationMixin.generate` as a `custom_generate` callable.

    Each step: draft `block_size - 1` tokens in one drafter forward, verify them in one target forward, commit the
    longest prefix the target agrees with plus the target's own next token, checking every stopping criterion at
    every committed position. With `draft_tree_size`, a tree of drafts instead of a chain. `num_assistant_tokens`,
    `assistant_confidence_threshold` and `draft_tree_size`: see `generate`.
    """
    call = DFlashCall(model, drafter, input_ids, logits_processor, stopping_criteria, generation_config, streamer,
                      model_kwargs, num_assistant_tokens=num_assistant_tokens, draft_tree_size=draft_tree_size,
                      assistant_confidence_threshold=assistant_confidence_threshold)
    return call.run()


class DFlashCall:
    """One `dflash_decode` call: its inputs checked, its drafting settings resolved (`proposer.draft_settings`), its
    path chosen (the fixed-shape one for a static cache where it can serve the call, said once where it cannot), and
    its two sides built. `run(proposer_class)` runs the loop with another proposer (a `DFlashProposer` subclass: the
    oracle benchmark's, another way of drafting) on whichever path the call takes."""

    def __init__(self, target, drafter, input_ids, logits_processor, stopping_criteria, generation_config, streamer,
                 model_kwargs: dict, **settings):
        if "inputs_embeds" in model_kwargs or input_ids.shape[1] == 0:
            raise ValueError("DFlash generation needs input_ids (prompts given as inputs_embeds are not supported).")
        _warn_ignored(generation_config)
        self.target, self.drafter, self.input_ids = target, drafter, input_ids
        self.processors, self.criteria, self.config = logits_processor, stopping_criteria, generation_config
        self.streamer = streamer
        self.attention_mask = model_kwargs.get("attention_mask")  # None when generate found no padding
        self.prompt_mask = torch.ones_like(input_ids, dtype=torch.bool) if self.attention_mask is None else \
            self.attention_mask.bool()
        self.positions = prompt_positions(self.prompt_mask, model_kwargs.get("position_ids"))
        # sampling: a chain's drafts are drawn at the target's temperature, and the rejection step reads them
        temperature = (generation_config.temperature or 1.0) if generation_config.do_sample else None
        settings = draft_settings(target, drafter, temperature=temperature, **settings)
        self.fixed_shape = False
        if wants_fixed_shape(generation_config, model_kwargs.get("cache")):
            reason = unsupported_reason(target, settings, generation_config, logits_processor, stopping_criteria,
                                        streamer)
            self.fixed_shape = reason is None
            if reason is not None:
                logger.warning_once(
                    f"cache_implementation='static': this call runs on the general loop, because of {reason}."
                )
        else:
            warn_unused_cache(model_kwargs.get("cache"))
        with without_cudnn_attention(input_ids.device):  # "auto" may time the target's forwards, as the loop runs
            self.settings = with_auto(settings, target, len(input_ids), self.fixed_shape)

    def decoder(self, decoder_class=None):
        """The call's target side: a `Decoder`, or on the fixed-shape path a `FixedShapeDecoder` (or `decoder_class`,
        taking the same arguments)."""
        if self.fixed_shape:
            return (decoder_class or FixedShapeDecoder)(self.target, self.config, self.processors, self.criteria,
                                                        self.input_ids, self.prompt_mask, self.positions, self.settings)
        auto = self.settings.auto
        return (decoder_class or Decoder)(
            self.target, self.config, self.processors, self.criteria, self.streamer, self.input_ids,
            self.attention_mask, self.positions, trees=bool(self.settings.tree_size),
            costs=None if auto is None else auto.costs)

    def proposer(self, decoder, proposer_class=DFlashProposer):
        """The call's drafter side for `decoder`, its context kept as the path keeps it."""
        if self.fixed_shape:
            cache = RowDrafterCache(self.drafter, decoder)
        else:
            cache = DynamicDrafterCache(len(self.input_ids), self.drafter.device)
        return proposer_class(self.target, self.drafter, self.settings, cache)

    @classmethod
    def custom_generate(cls, drafter, proposer_class=DFlashProposer, decoder_classes: dict | None = None,
                        **settings):
        """A `custom_generate` callable for `generate` that runs `proposer_class` (and, per path, `decoder_classes`
        {"general": ..., "fixed_shape": ...}) through this loop; `settings`: `num_assistant_tokens`,
        `assistant_confidence_threshold`, `draft_tree_size`."""

        def decode(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
            call = cls(model, drafter, input_ids, logits_processor, stopping_criteria, generation_config, None,
                       model_kwargs, **settings)
            decoder_class = (decoder_classes or {}).get("fixed_shape" if call.fixed_shape else "general")
            return call.run(proposer_class, decoder_class)

        return decode

    def run(self, proposer_class=DFlashProposer, decoder_class=None):
        """Generate: returns what `generate` returns (`Decoder.result`)."""
        # built outside inference mode: their tensors stay ordinary ones (`sequences` is returned; the drafter's
        # gathered head is kept across calls by version counters, which inference tensors lack)
        decoder = self.decoder(decoder_class)
        proposer = self.proposer(decoder, proposer_class)
        # cuDNN attention builds a graph per new key length: a new one every step on the general loop, and at the
        # prefill on either (`without_cudnn_attention`). Inference mode rather than `generate`'s no_grad: less
        # bookkeeping per operation (docs/design.md); what the loop makes in it stays inside.
        with (without_cudnn_attention(self.input_ids.device), packed_linears(self.drafter),
              packed_linears(self.target, memory_bound=True), torch.inference_mode()):
            speculative_loop(proposer, decoder, self.input_ids)
        return decoder.result()


def speculative_loop(proposer, decoder, input_ids) -> None:
    """Prefill, then propose / verify / accept until every row has stopped; the tokens accumulate in `decoder`."""
    # Prefill: the target reads the prompts and picks the first token; its features become the drafter's context.
    out = decoder.prefill(input_ids)
    proposer.extend_context(decoder.prompt_context(proposer.features(out.hidden_states)))
    _drop_finished(proposer, decoder)

    while not decoder.done():
        tree = proposer.propose(decoder, decoder.room(proposer.block_size))  # [rows, T]: newest + drafts
        out = decoder.verify_forward(tree)
        # copied before the next compiled call: under CUDA graphs that call may reuse this output's memory
        features = proposer.features(out.hidden_states)  # [rows, T, F]
        context, path, kept = decoder.accept(out.logits, tree, features)  # kept: accepted drafts + the target's
        proposer.accepted(tree, path, kept - 1)
        proposer.extend_context(context)
        _drop_finished(proposer, decoder)


def _drop_finished(proposer, decoder) -> None:
    live = decoder.drop_finished()
    if live is not None:
        proposer.select_rows(live)


def _warn_ignored(generation_config) -> None:
    """Settings of other decoding methods that the DFlash loop does not apply: said once, the output is unaffected."""
    ignored = ("output_attentions", "output_hidden_states", "prompt_lookup_num_tokens", "assistant_early_exit")
    for name, value in ((name, getattr(generation_config, name, None)) for name in ignored):
        if value:
            logger.warning_once(f"{name}={value!r} is ignored by DFlash generation (the drafter drafts).")
    if getattr(generation_config, "num_assistant_tokens_schedule", None) not in (None, "constant"):
        logger.warning_once(
            f"num_assistant_tokens_schedule={generation_config.num_assistant_tokens_schedule!r} is ignored by DFlash "
            "generation: it drafts num_assistant_tokens (default: the drafter's block) every step; "
            "draft_tree_size='auto' sizes each step's drafts from measured costs."
        )
