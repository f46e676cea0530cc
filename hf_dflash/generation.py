"""Speculative decoding with a DFlash drafter inside `target.generate()`.

`generate()` lets transformers prepare everything a user configured (generation config, logits processors, stopping
criteria, attention mask, max length) and hands the decoding loop to `dflash_decode` through `custom_generate`.

Batching: rows accept different numbers of draft tokens per step. When rows keep different numbers of the verified
slots, each row's rejected slots stay in the target's KV cache as masked holes where every layer is full attention
through an explicit mask (eager, sdpa), and are moved to the row's left end otherwise, so that sliding windows, which
count slots, stay exact (`_keep_verified`): any decoder-only model sees exactly the tokens it would see in plain
`generate`. Finished rows leave the batch.

Draft trees (`draft_tree_size`, `hf_dflash.tree`): a step can verify a tree of candidates instead of one chain; the
loop is the same, with a tree attention mask, and the cache keeps each row's accepted path.
"""

import contextlib
import copy
import functools
from dataclasses import dataclass

import torch
from torch.nn import functional as F
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer
from transformers.generation import (
    EosTokenCriteria,
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    MaxLengthCriteria,
    MinPLogitsWarper,
    StopStringCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
    UnbatchedClassifierFreeGuidanceLogitsProcessor,
)
from transformers.generation.utils import GenerateDecoderOnlyOutput
from transformers.utils import logging

from .bigram import conditional_chain, conditional_probs
from .cpu_ops import argmax, pack_linears
from .cost_model import LoopCosts, NodeCalibration, choose_tree_size, load_forward_costs, now
from .devices import without_cudnn_attention
from .hooks import original_generate  # the unhooked `GenerationMixin.generate`
from .modeling import DFlashDraftModel
from .modeling.modeling_dflash import _stored_weight
from .tree import DraftTree, build_tree, gather_path, greedy_paths, mask_one_token, tree_attention_mask

logger = logging.get_logger(__name__)

# Processors that ignore `input_ids`: applied once to all block positions instead of position by position.
_POSITION_FREE = (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    MinPLogitsWarper,
    TypicalLogitsWarper,
    EpsilonLogitsWarper,
    EtaLogitsWarper,
)


@dataclass
class DFlashGenerateOutput(GenerateDecoderOnlyOutput):
    """`GenerateDecoderOnlyOutput` plus `acceptance_lengths`: for each row, the tokens committed by each target
    forward after the prefill (accepted drafts + the target's own token; cut at a stop). Its mean is the acceptance
    length tau. `draft_lengths`: the drafts each of those forwards verified (the tree's nodes with
    `draft_tree_size`; 0 where a step skipped its drafts under `assistant_confidence_threshold`, or where
    `max_length` left room for one token only)."""

    acceptance_lengths: list[list[int]] | None = None
    draft_lengths: list[list[int]] | None = None


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
    the drafter's distributions (`hf_dflash.tree`); 0 verifies the chain of argmax drafts. `"auto"` chooses the
    tree size per step from the target's measured forward costs (`hf_dflash.cost_model`); then only an explicit
    `assistant_confidence_threshold` applies, not the drafter's default.
    """
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


def check_compatible(target, drafter: DFlashDraftModel) -> None:
    """Raise a ValueError naming the mismatch between a target and a drafter, and how to fix it."""
    if not isinstance(drafter, DFlashDraftModel):
        raise TypeError(f"Expected a DFlashDraftModel, got {type(drafter).__name__}.")
    config = target.config.get_text_config()
    if getattr(target.config, "is_encoder_decoder", False):
        raise ValueError("DFlash needs a decoder-only causal LM; the target is an encoder-decoder model.")
    if config.hidden_size != drafter.config.hidden_size:
        raise ValueError(
            f"The drafter was made for hidden size {drafter.config.hidden_size}, the target has {config.hidden_size}. "
            "Use the drafter trained for this target, or make one with DFlashDraftModel.from_target(target)."
        )
    num_layers = config.num_hidden_layers
    bad = [i for i in drafter.config.target_layer_ids if not 0 <= i < num_layers]
    if bad:
        raise ValueError(
            f"The drafter reads target layers {bad}, but the target has {num_layers} layers (0..{num_layers - 1}). "
            "Use the drafter trained for this target, or set target_layer_ids within range."
        )
    rows = target.get_input_embeddings().weight.shape[0]
    if drafter.config.mask_token_id is None or not 0 <= drafter.config.mask_token_id < rows:
        raise ValueError(
            f"The drafter's mask_token_id={drafter.config.mask_token_id} is not a row of the target's embedding "
            f"table (0..{rows - 1}). Set drafter.config.mask_token_id to an existing row the tokenizer does not use."
        )
    if target.get_output_embeddings() is None:
        raise ValueError(f"{type(target).__name__} has no output embeddings (lm_head): DFlash drafts through it.")


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
    decoder_class=None,
    **model_kwargs,
):
    """The decoding loop, called by `GenerationMixin.generate` as a `custom_generate` callable.

    Each step: draft `block_size - 1` tokens in one drafter forward, verify them in one target forward, commit the
    longest prefix the target agrees with plus the target's own next token, checking every stopping criterion at
    every committed position. With `draft_tree_size`, a tree of drafts instead of a chain. `num_assistant_tokens`,
    `assistant_confidence_threshold` and `draft_tree_size`: see `generate`. `decoder_class`: a callable building the
    loop's state instead of `_Decoder`, with its arguments (the oracle benchmark, `hf_dflash.oracle`, drafts
    through a subclass); the loop itself (`_speculative_loop`) stays the same.
    """
    target = model
    attention_mask = model_kwargs.get("attention_mask")  # None when generate found no padding
    if "inputs_embeds" in model_kwargs or input_ids.shape[1] == 0:
        raise ValueError("DFlash generation needs input_ids (prompts given as inputs_embeds are not supported).")
    batch, prompt_len = input_ids.shape
    prompt_mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    if batch > 1 and not prompt_mask[:, -1].all():
        raise ValueError(
            "The batch is right-padded: DFlash (like any decoder-only generation) needs left padding. "
            "Set tokenizer.padding_side = 'left'."
        )
    # settings of other decoding methods that the DFlash loop does not apply: said once, the output is unaffected
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
    _warn_unused_cache(model_kwargs.get("cache"))
    # cuDNN attention builds a graph per new key length: a new one every step here (`without_cudnn_attention`)
    with without_cudnn_attention(input_ids.device):
        # built outside inference mode: its tensors stay ordinary ones (`sequences` is returned, the drafter's
        # gathered head is cached across calls by version counters, which inference tensors lack)
        state = (decoder_class or _Decoder)(
            target, drafter, num_assistant_tokens, assistant_confidence_threshold, draft_tree_size, generation_config,
            logits_processor, stopping_criteria, streamer, input_ids,
        )
        # Inference mode rather than `generate`'s no_grad: less bookkeeping per operation (3-4 % of a SmolLM2
        # forward on a CPU thread). What the loop makes in it stays inside; `result` returns ordinary tensors.
        with torch.inference_mode():
            _speculative_loop(state, input_ids, attention_mask, prompt_mask)
    return state.result()


def _speculative_loop(state: "_Decoder", input_ids, attention_mask, prompt_mask) -> None:
    """Prefill, then draft / verify / commit until every row has stopped; the tokens accumulate in `state`."""
    # Prefill: the target reads the prompts and picks the first token; its features become the drafter's context.
    position_ids = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)
    out = state.target_forward(input_ids, attention_mask, position_ids, logits_to_keep=1)
    _check_cache(state.cache)  # the layer types exist once the prefill filled the cache
    state.holes = _holes_allowed(state.target, state.cache)
    state.context = (state.features(out), prompt_mask, position_ids)
    tokens, kept, scores, _ = state.verify(out.logits[:, -1:], DraftTree.chain(input_ids[:, -1:]))  # no drafts
    state.commit(tokens, kept, scores)
    state.target_mask = prompt_mask
    state.next_pos = prompt_mask.sum(-1)  # position of each row's newest token, not yet in the cache
    state.drop_finished()

    while state.rows.numel():
        tree = state.propose()  # [rows, T]: the newest token (the root), then its drafts: a chain or a tree
        out = state.verify_forward(tree)
        tokens, kept, scores, path = state.verify(out.logits, tree)  # kept: accepted drafts + the target's token
        state.record(state.commit(tokens, kept, scores), tree, path, kept)
        state.keep_path(state.features(out), path, kept)
        state.next_pos = state.next_pos + kept
        state.drop_finished()


class _Decoder:
    """State of one `dflash_decode` call. Rows are the batch rows still generating (`rows` maps them back)."""

    def __init__(
        self, target, drafter, num_drafts, threshold, tree_size, generation_config, logits_processor,
        stopping_criteria, streamer, input_ids,
    ):
        check_compatible(target, drafter)
        self.target, self.drafter = target, drafter
        if num_drafts is not None and (not isinstance(num_drafts, int) or num_drafts < 0):
            raise ValueError(f"num_assistant_tokens={num_drafts!r}: use a whole number of draft tokens >= 0.")
        # tokens verified per step: the newest + the drafts; never more drafts than the drafter's block holds
        self.block_size = drafter.block_size if num_drafts is None else min(drafter.block_size, num_drafts + 1)
        tree_size = drafter.draft_tree_size if tree_size is None else tree_size
        if tree_size != "auto" and (not isinstance(tree_size, int) or isinstance(tree_size, bool) or tree_size < 0):
            raise ValueError(f"draft_tree_size={tree_size!r}: use a whole number of draft nodes >= 0, or 'auto'.")
        # "auto" replaces the drafter's tuned default threshold; an explicit one still applies
        default_threshold = 0.0 if tree_size == "auto" else drafter.assistant_confidence_threshold
        self.threshold = default_threshold if threshold is None else threshold
        if not 0 <= self.threshold <= 1:
            raise ValueError(
                f"assistant_confidence_threshold={self.threshold!r}: use a probability in [0, 1] (0: never skip)."
            )
        self.config = generation_config
        self.processors = logits_processor or []
        if input_ids.shape[0] > 1 and any(isinstance(p, UnbatchedClassifierFreeGuidanceLogitsProcessor)
                                          for p in self.processors):
            raise ValueError(
                "guidance_scale with a batch of several prompts: the guidance processor keeps one unconditional cache "
                "for the whole batch and extends it by one token per call, while DFlash rows commit different numbers "
                "of tokens per step. Generate one prompt at a time with guidance_scale, or without assistant_model."
            )
        self.stopping_criteria = stopping_criteria
        self.streamer = streamer
        device = input_ids.device
        batch, self.prompt_len = input_ids.shape
        max_length = generation_config.max_length
        pad = generation_config._pad_token_tensor
        self.pad_token_id = int(pad) if pad is not None else 0
        self.sequences = torch.full((batch, max_length), self.pad_token_id, dtype=torch.long, device=device)
        self.sequences[:, : self.prompt_len] = input_ids
        self.lengths = torch.full((batch,), self.prompt_len, dtype=torch.long, device=device)
        self.rows = torch.arange(batch, device=device)
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)
        self.acceptance_lengths: list[list[int]] = [[] for _ in range(batch)]
        self.draft_lengths: list[list[int]] = [[] for _ in range(batch)]
        self.keep_scores = generation_config.return_dict_in_generate and generation_config.output_scores
        self.keep_logits = generation_config.return_dict_in_generate and generation_config.output_logits
        self.scores: list[list[torch.Tensor]] = [[] for _ in range(batch)]
        self.raw_logits: list[list[torch.Tensor]] = [[] for _ in range(batch)]
        self.eos_ids, self.max_length = _simple_stops(stopping_criteria, device)
        if self.keep_scores or self.keep_logits:
            self.eos_ids = None  # scores are kept token by token

        self.cache = DynamicCache(config=target.config)
        self.cache.activate_past_recording()  # sliding-window layers must be able to roll back rejected slots
        self.draft_cache = DynamicCache()
        self.draft_valid = torch.zeros(batch, 0, dtype=torch.bool, device=drafter.device)
        self.draft_pos = torch.zeros(batch, 0, dtype=torch.long, device=drafter.device)
        self.head = target.get_output_embeddings()
        self.draft_head = drafter.draft_head(self.head)  # gathered once: the draft vocabulary's rows
        if drafter.device.type == "cpu":
            pack_linears(drafter)  # its bfloat16 linears multiply prepacked weights (`hf_dflash.cpu_ops`)
            head = None if self.draft_head is None else self.draft_head[0]
            if head is not None and head.weight.data_ptr() != _stored_weight(self.head).data_ptr():
                pack_linears(head)  # the drafter's own copy (a packed twin of the target's head would double it)
        head = self.head if self.draft_head is None else self.draft_head[0]
        self.draft_vocab_size = head.weight.shape[0]
        self.prior = drafter.bigram_prior  # (keys, boosts, vocab size): buffers, on the drafter's device
        self.tree_size, self.costs, self.calibration = 0, None, None
        self.holes = False  # rejected slots stay in the target cache, masked (`_holes_allowed`, after the prefill)
        if tree_size and _tree_supported(target):
            if tree_size == "auto":
                self.costs = LoopCosts(load_forward_costs(target, batch_size=batch))
                tree_size = self.costs.curve.max_tokens - 1  # the largest verification the curve covers
                self.calibration = NodeCalibration(self.block_size - 1)
            self.tree_size = tree_size
            self.top_k = min(tree_size, self.draft_vocab_size)  # candidates per position: no tree uses more
        self.mask_one_token = bool(self.tree_size) and mask_one_token(device)

    # --- target -------------------------------------------------------------------------------------------
    def target_forward(self, input_ids, attention_mask, position_ids, **kwargs):
        out = self.target(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=self.cache,
            use_cache=True,
            output_hidden_states=True,
            **kwargs,
        )
        if getattr(out, "hidden_states", None) is None:
            raise ValueError(
                f"{type(self.target).__name__} returned no hidden_states with output_hidden_states=True: DFlash "
                "drafts from the target's layer features, so the target must return them."
            )
        return out

    def features(self, out) -> torch.Tensor:
        # [rows, length, len(target_layer_ids) * hidden]; hidden_states[0] is the embedding output. A target split
        # over devices (`device_map`) gives each layer's output on that layer's device: gathered where the drafter runs.
        device = self.drafter.device
        return torch.cat([out.hidden_states[i + 1].to(device) for i in self.drafter.config.target_layer_ids], dim=-1)

    # --- drafting -----------------------------------------------------------------------------------------
    def propose(self) -> DraftTree:
        """What to verify: each row's newest token, then drafts for the positions after it (a chain, or a tree)."""
        if self.costs is not None:  # "auto" times its steps: the one before ends here
            self.costs.step_begins(self.clock())
        newest = self.sequences[self.rows, self.lengths[self.rows] - 1]
        left = int((self.config.max_length - self.lengths[self.rows]).max())
        verify_len = min(self.block_size, left)  # never draft past max_length (a tree: never deeper)
        no_drafts = DraftTree.chain(newest[:, None])
        if verify_len < 2:
            return no_drafts
        if self.tree_size:
            return self.propose_tree(newest, verify_len) or no_drafts
        if self.prior is not None:
            drafts, confidence = self.prior_chain(newest, verify_len)
        else:
            drafts, confidence = self.drafter_propose(newest, verify_len)
        # All or nothing: cutting the block at a later unsure draft saves little (verifying 2-3 tokens costs about
        # as much as 4 on a CPU, the same on a GPU); a one-token step costs much less where a block is expensive.
        if self.threshold and bool((confidence < self.threshold).all()):
            return no_drafts
        return DraftTree.chain(torch.cat([newest[:, None], drafts.to(newest.device)], dim=1))

    def propose_tree(self, newest: torch.LongTensor, verify_len: int) -> DraftTree | None:
        """A best-first tree of `tree_size` drafts at most, or None for a step without drafts (the threshold, or
        "auto" finding that no tree pays)."""
        ids, probs = self.drafter_candidates(newest, verify_len, self.top_k)
        if self.prior is not None:  # [rows, D, k, k]: each parent's children
            probs = conditional_probs(ids, probs, self.prior)
        if self.threshold and bool((probs[:, 0, 0].reshape(len(ids), -1).amax(-1) < self.threshold).all()):
            return None
        tree = build_tree(newest, ids.to(newest.device), probs.to(newest.device), self.tree_size)
        if self.costs is None:
            return tree
        num_drafts = choose_tree_size(self.calibration(tree), self.costs, self.costs.overhead)
        return tree.first(num_drafts) if num_drafts else None

    def drafter_propose(self, newest: torch.LongTensor, verify_len: int) -> tuple:
        """Drafts [rows, verify_len - 1] and, with a confidence threshold, the drafter's probability for each row's
        first draft [rows]."""
        hidden = self.drafter_hidden(newest, verify_len)
        if not self.threshold:
            return self.drafter.draft_tokens(hidden, self.head, self.draft_head), None
        drafts, confidence = self.drafter.draft_tokens(hidden, self.head, self.draft_head, return_confidence=True)
        return drafts, confidence[:, 0]

    def prior_chain(self, newest: torch.LongTensor, verify_len: int) -> tuple:
        """`drafter_propose` with the drafter's bigram prior: each position's best candidate (of its 8 most likely,
        where the prior's gain was measured) under the draft before it."""
        ids, probs = self.drafter_candidates(newest, verify_len, min(8, self.draft_vocab_size))
        return conditional_chain(ids, conditional_probs(ids, probs, self.prior))

    def drafter_candidates(self, newest: torch.LongTensor, verify_len: int, k: int) -> tuple:
        """The drafter's k most likely tokens for each draft position and their probabilities, most likely first:
        ids and probs [rows, verify_len - 1, k]."""
        hidden = self.drafter_hidden(newest, verify_len)
        return self.drafter.draft_tokens(hidden, self.head, self.draft_head, return_confidence=True, top_k=k)

    def drafter_hidden(self, newest: torch.LongTensor, verify_len: int) -> torch.Tensor:
        """One drafter forward over [newest, mask...]: the hidden states of the draft positions [rows, verify_len - 1,
        hidden]. The drafter's cache keeps the new context, not the block."""
        drafter = self.drafter
        device = drafter.device
        context, context_valid, context_pos = (t.to(device) for t in self.context)
        rows = newest.shape[0]
        block_ids = torch.full((rows, verify_len), drafter.config.mask_token_id, dtype=torch.long, device=device)
        block_ids[:, 0] = newest.to(device)
        block_pos = self.next_pos.to(device)[:, None] + torch.arange(verify_len, device=device)
        key_valid = torch.cat([self.draft_valid, context_valid, torch.ones_like(block_ids, dtype=torch.bool)], 1)
        key_pos = torch.cat([self.draft_pos, context_pos, block_pos], dim=1)
        hidden = drafter(
            noise_embeds=drafter.embed(self.target, block_ids).to(device),
            context_hidden_states=context,
            position_ids=torch.cat([context_pos, block_pos], dim=1),
            attention_mask=_drafter_masks(drafter.config, key_valid, key_pos, block_pos),
            cache=self.draft_cache,
        ).last_hidden_state
        self.draft_cache.crop(-verify_len)  # keep the context, drop the block
        self.draft_valid = torch.cat([self.draft_valid, context_valid], dim=1)
        self.draft_pos = torch.cat([self.draft_pos, context_pos], dim=1)
        return hidden[:, 1:]

    # --- verification -------------------------------------------------------------------------------------
    def verify_forward(self, tree: DraftTree):
        """The target's forward over `tree` (a node at depth d at the next position + d), timed for "auto"."""
        positions = self.next_pos[:, None] + tree.depths
        began = self.clock() if self.costs is not None else None
        out = self.target_forward(tree.tokens, self.verify_mask(tree), positions)
        if began is not None:
            self.costs.verified(tree.tokens.shape[1], self.clock() - began)
        return out

    def clock(self) -> float:
        """The time "auto" times its steps by (`LoopCosts`), once the device has finished its queued work."""
        return now(self.rows.device)

    def verify_mask(self, tree: DraftTree):
        """The target's attention mask for verifying `tree`: a 2-D padding mask for a chain (None without padding),
        a tree attention mask otherwise, and for a one-token step in tree mode on a CPU (`mask_one_token`)."""
        if not tree.is_chain or (self.mask_one_token and tree.tokens.shape[1] == 1):
            return tree_attention_mask(tree, self.target_mask, self.cache, self.target.dtype)
        mask = torch.cat([self.target_mask, torch.ones_like(tree.tokens, dtype=torch.bool)], dim=1)
        return None if mask.all() else mask.long()

    def verify(self, logits: torch.Tensor, tree: DraftTree):
        """Walk down each row's tree from the root: the target's token after the current node (its processors see
        the committed tokens plus the path so far), then on to the child that drafted that token, or stop. Only as
        far as each row's drafts match: later positions are never committed, so their processors and sampling would
        be wasted (top-p sorts the whole vocabulary). The tree is fixed before the target chooses, so each token is
        the target's own choice given the path: exact for greedy and sampling alike.

        `logits` [rows, T, vocab], one per tree slot. Returns tokens [rows, L], kept [rows], the processed scores
        [rows, L, vocab] (filled where computed) and path [rows, L]: the slot whose logits gave each token (the
        root, then the accepted nodes); L = the tree's depth + 1."""
        if not self.config.do_sample and all(isinstance(p, _POSITION_FREE) for p in self.processors):
            return self._verify_greedy(logits, tree)
        rows, _, vocab = logits.shape
        length = int(tree.depths.max()) + 1
        tokens = tree.tokens.new_zeros(rows, length)
        path = tree.tokens.new_zeros(rows, length)
        scores = logits.new_empty(rows, length, vocab, dtype=torch.float32)
        if self.keep_logits:
            self._raw = logits.new_empty(rows, length, vocab, dtype=torch.float32)
        kept = torch.zeros(rows, dtype=torch.long, device=logits.device)
        live = torch.arange(rows, device=logits.device)  # rows whose drafts matched before position j
        committed = self.lengths[self.rows]
        for j in range(length):
            live = live[committed[live] + j < self.config.max_length]  # never committed past max_length
            if live.numel() == 0:
                break
            slot = path[live, j]
            step = logits[live, slot]  # [live, vocab]
            if self.keep_logits:
                self._raw[live, j] = step.float()
            processed = self.process(step, tokens[live, :j], live)
            scores = scores.to(processed.dtype)  # float32, unless a processor computes in another dtype
            scores[live, j] = processed
            tokens[live, j] = self.choose(scores[live, j])
            kept[live] += 1
            if j + 1 < length:
                # [live, T]: the current node's child holding the chosen token (siblings hold distinct tokens)
                child = (tree.parents[live] == slot[:, None]) & (tree.tokens[live] == tokens[live, j, None])
                found = child.any(-1)
                live = live[found]
                path[live, j + 1] = child[found].long().argmax(-1)
        return tokens, kept, scores, path

    def _verify_greedy(self, logits: torch.Tensor, tree: DraftTree):
        """`verify` when every slot's choice is its own argmax (greedy, processors that ignore the ids): the walk
        down the tree on the host (`greedy_paths`). The same outputs as the walk in `verify`, except `scores`: None
        when `commit` does not read them."""
        rows, slots, vocab = logits.shape
        scores = logits
        if self.processors:
            scores = self.process(logits.reshape(rows * slots, vocab), tree.tokens[:, :0], None).view(logits.shape)
        paths, choices = greedy_paths(scores, tree)
        length = int(tree.depths.max()) + 1
        device = logits.device
        kept = torch.tensor([len(path) for path in paths], device=device)
        kept = torch.minimum(kept, self.config.max_length - self.lengths[self.rows])  # never past max_length
        path = torch.tensor([p + [0] * (length - len(p)) for p in paths], device=device)  # [rows, L]
        tokens = torch.tensor([c + [0] * (length - len(c)) for c in choices], device=device)  # [rows, L]
        if self.eos_ids is not None:  # `_commit_at_once` reads no scores
            return tokens, kept, None, path
        index = path[..., None].expand(-1, -1, vocab)
        if self.keep_logits:
            self._raw = logits.gather(1, index).float()
        scores = scores.gather(1, index).float()  # a float32 copy, as `process` makes
        return tokens, kept, scores, path

    def keep_path(self, features: torch.Tensor, path: torch.LongTensor, kept: torch.LongTensor) -> None:
        """After a verification: the target cache keeps each row's accepted path (the first `kept` slots of `path`)
        and drops the rest; the path's features [rows, longest, F] become the drafter's next context."""
        block_len = features.shape[1]
        longest = int(kept.max())
        path = path[:, :longest]
        gather_path(self.cache, path, block_len)  # the path's slots to the front of the block, in path order
        keep = torch.arange(block_len, device=kept.device) < kept[:, None]  # [rows, T]: verified slots to keep
        self.target_mask = _keep_verified(self.cache, self.target_mask, keep, shift=not self.holes)
        positions = self.next_pos[:, None] + torch.arange(longest, device=kept.device)
        features = features.gather(1, path[..., None].to(features.device).expand(-1, -1, features.shape[-1]))
        self.context = (features, keep[:, :longest], positions)

    def process(self, logits: torch.Tensor, drafts: torch.LongTensor, live: torch.LongTensor) -> torch.Tensor:
        """Logits processors for one block position of the rows `live`: row i sees its committed tokens plus
        drafts[i] (the drafts before this position)."""
        if not self.processors:
            return logits.to(dtype=torch.float32, copy=True)  # like `_sample`: processors run in float32
        with _as_plain_generate():
            return self._process(logits.to(dtype=torch.float32, copy=True), drafts, live)

    def _process(self, scores: torch.Tensor, drafts: torch.LongTensor, live: torch.LongTensor) -> torch.Tensor:
        if all(isinstance(p, _POSITION_FREE) for p in self.processors):
            return self.processors(drafts.new_zeros(scores.shape[0], 1), scores)
        # Processors may hold state for every row of the batch (repetition_penalty's padding lengths,
        # prefix_allowed_tokens_fn's batch_id), so they always see the whole batch, as in `_sample`. One group of
        # rows with equal committed lengths at a time; the other rows show their own ids cut or padded to the same
        # width, and their outputs are discarded.
        batch, width = self.sequences.shape[0], drafts.shape[1]
        rows = self.rows[live]
        lengths = self.lengths[rows]
        for committed in lengths.unique().tolist():
            group = (lengths == committed).nonzero().squeeze(1)
            ids = self.sequences[:, : committed + width].clone()
            ids[rows[group], committed:] = drafts[group]
            full = scores.new_zeros(batch, scores.shape[-1])
            full[rows[group]] = scores[group]
            processed = self.processors(ids, full)[rows[group]]
            scores = scores.to(processed.dtype)  # a processor may compute in another dtype (guidance: the target's)
            scores[group] = processed
        return scores

    def choose(self, scores: torch.Tensor) -> torch.LongTensor:
        if not self.config.do_sample:
            return argmax(scores)
        # A greedy draft is a point-mass proposal: sampling the target at each position and accepting while the
        # sample equals the draft is exact speculative sampling.
        return torch.multinomial(F.softmax(scores, dim=-1), 1).squeeze(-1)

    def commit(self, tokens: torch.LongTensor, kept: torch.LongTensor, scores: torch.Tensor) -> torch.LongTensor:
        """Append each row's first `kept` tokens one by one, checking the stopping criteria after each; return how
        many each row committed."""
        kept = torch.minimum(kept, self.config.max_length - self.lengths[self.rows])
        if self.eos_ids is not None:
            return self._commit_at_once(tokens, kept)
        committed = torch.zeros_like(kept)
        done = torch.zeros_like(kept, dtype=torch.bool)
        for j in range(int(kept.max())):
            live = ((j < kept) & ~done).nonzero().squeeze(1)
            if live.numel() == 0:
                break
            rows = self.rows[live]
            self.sequences[rows, self.lengths[rows]] = tokens[live, j]
            self.lengths[rows] += 1
            committed[live] += 1
            for i, r in zip(live.tolist(), rows.tolist()):
                if self.keep_scores:
                    self.scores[r].append(scores[i, j])
                if self.keep_logits:
                    self.raw_logits[r].append(self._raw[i, j])
            done[live] = self._stopped(rows, scores[live, j])
        self.finished[self.rows] |= done
        self._stream(committed)
        return committed

    def _commit_at_once(self, tokens: torch.LongTensor, kept: torch.LongTensor) -> torch.LongTensor:
        """`commit` when the only stopping criteria are the max length and EOS tokens (`self.eos_ids`) and no scores
        are kept: each row's tokens up to its first EOS go in at once."""
        width = tokens.shape[1]
        offsets = torch.arange(width, device=tokens.device)
        eos = torch.isin(tokens, self.eos_ids) & (offsets < kept[:, None])  # [rows, L]
        stopped = eos.any(-1)
        committed = torch.where(stopped, eos.long().argmax(-1) + 1, kept)  # up to and with the first EOS
        take = offsets < committed[:, None]
        rows = self.rows[:, None].expand(-1, width)
        self.sequences[rows[take], (self.lengths[self.rows, None] + offsets)[take]] = tokens[take]
        self.lengths[self.rows] += committed
        self.finished[self.rows] |= stopped | (self.lengths[self.rows] >= self.max_length)
        self._stream(committed)
        return committed

    def record(self, committed: torch.LongTensor, tree: DraftTree, path: torch.LongTensor, kept: torch.LongTensor):
        """Per row: the tokens a step committed, the drafts it verified; "auto" learns from the accepted drafts."""
        for r, n in zip(self.rows.tolist(), committed.tolist()):
            self.acceptance_lengths[r].append(n)
            self.draft_lengths[r].append(tree.num_drafts)
        if self.calibration is not None and tree.scores is not None and tree.num_drafts:
            self.calibration.update(tree, path, kept - 1)

    def _stopped(self, rows: torch.LongTensor, scores: torch.Tensor) -> torch.BoolTensor:
        """Stopping criteria for `rows` at their current lengths. Like the processors, the criteria see the whole
        batch (row i is batch row i, as in `_sample`), one group of equal lengths at a time."""
        with _as_plain_generate():
            stopped = torch.zeros(rows.shape[0], dtype=torch.bool, device=rows.device)
            lengths = self.lengths[rows]
            for length in lengths.unique().tolist():
                group = (lengths == length).nonzero().squeeze(1)
                full = scores.new_zeros(self.sequences.shape[0], scores.shape[-1])
                full[rows[group]] = scores[group]
                done = self.stopping_criteria(self.sequences[:, :length], full)
                stopped[group] = done.to(rows.device)[rows[group]]
        return stopped

    def _stream(self, committed: torch.LongTensor) -> None:
        if self.streamer is None or int(committed.max()) == 0:
            return
        width = int(committed.max())
        with _as_plain_generate():
            chunk = torch.full((self.sequences.shape[0], width), self.pad_token_id, dtype=torch.long)
            for i, r in enumerate(self.rows.tolist()):
                end = int(self.lengths[r])
                chunk[r, : int(committed[i])] = self.sequences[r, end - int(committed[i]) : end].cpu()
            self.streamer.put(chunk)

    def drop_finished(self) -> None:
        live = (~self.finished[self.rows]).nonzero().squeeze(1)
        if live.numel() == self.rows.numel():
            return
        self.rows = self.rows[live]
        self.cache.batch_select_indices(live)
        self.draft_cache.batch_select_indices(live.to(self.drafter.device))
        live_d = live.to(self.draft_valid.device)
        self.draft_valid, self.draft_pos = self.draft_valid[live_d], self.draft_pos[live_d]
        self.target_mask, self.next_pos = self.target_mask[live], self.next_pos[live]
        self.context = tuple(t[live.to(t.device)] for t in self.context)

    def result(self):
        if self.streamer is not None:
            self.streamer.end()
        longest = int(self.lengths.max())
        sequences = self.sequences[:, :longest]
        if not self.config.return_dict_in_generate:
            return sequences
        return DFlashGenerateOutput(
            sequences=sequences,
            scores=self._per_position(self.scores) if self.keep_scores else None,
            logits=self._per_position(self.raw_logits) if self.keep_logits else None,
            acceptance_lengths=self.acceptance_lengths,
            draft_lengths=self.draft_lengths,
        )

    def _per_position(self, per_row: list[list[torch.Tensor]]) -> tuple[torch.Tensor, ...]:
        """Per-row lists -> one [batch, vocab] tensor per generated position, like `generate`. Rows that had
        already finished at a position get -inf there."""
        steps = max(len(r) for r in per_row)
        vocab = next(len(t) for r in per_row for t in r)
        filler = torch.full((vocab,), float("-inf"), device=self.sequences.device)
        return tuple(torch.stack([r[k] if k < len(r) else filler for r in per_row]) for k in range(steps))


@contextlib.contextmanager
def _as_plain_generate():
    """Around user code (logits processors, stopping criteria, streamers): plain `generate`'s no_grad instead of the
    loop's inference mode, so that the tensors they get, and what they keep or make of them, stay ordinary tensors."""
    with torch.inference_mode(False), torch.no_grad():  # inference_mode(False) alone would enable grad
        yield


def _simple_stops(criteria, device) -> tuple:
    """(EOS ids, max length) when the stopping criteria are only transformers' own max length and EOS criteria, so a
    step can commit all its tokens at once; (None, None) otherwise."""
    kinds = {type(c) for c in criteria or []}
    if not kinds <= {MaxLengthCriteria, EosTokenCriteria} or MaxLengthCriteria not in kinds:
        return None, None
    eos = [c.eos_token_id.reshape(-1).to(device) for c in criteria if type(c) is EosTokenCriteria]
    eos = torch.cat(eos) if eos else torch.zeros(0, dtype=torch.long, device=device)
    return eos, min(c.max_length for c in criteria if type(c) is MaxLengthCriteria)


def _warn_unused_cache(cache) -> None:
    """The loop keeps its own dynamic target cache: it drops rejected draft slots, and the drafter needs the target's
    features at every prompt position, which a cache of past keys/values does not hold. Say so when `generate` was
    given a cache (`cache` / `past_key_values`, `cache_implementation`) that it therefore neither reads nor extends;
    the output is the same, only prompt reuse is lost."""
    if cache is None:
        return
    if cache.get_seq_length() > 0:
        logger.warning_once(
            f"DFlash generation does not read or extend the given cache ({cache.get_seq_length()} cached tokens): "
            "the drafter needs the target's features at every prompt position, so the whole prompt is prefilled "
            "again. The output is unchanged; pass no cache (past_key_values) to skip this warning."
        )
    elif type(cache) is not DynamicCache or getattr(cache, "offloading", False):
        name = "an offloaded DynamicCache" if type(cache) is DynamicCache else type(cache).__name__
        logger.warning_once(
            f"DFlash generation uses its own DynamicCache, not {name} (cache_implementation, cache): its "
            "verification drops rejected draft slots. The output is unchanged."
        )


def _drafter_masks(config, key_valid, key_pos, query_pos) -> dict | None:
    """Per-layer-type 4-D masks `[rows, 1, V, keys]`, or None when every key is visible to every query."""
    layer_types = set(config.layer_types or ["full_attention"])
    if key_valid.all() and layer_types == {"full_attention"}:
        return None
    visible = key_valid[:, None, None, :].expand(-1, 1, query_pos.shape[1], -1)
    masks = {"full_attention": visible}
    if "sliding_attention" in layer_types:
        distance = query_pos[:, None, :, None] - key_pos[:, None, None, :]
        masks["sliding_attention"] = visible & (distance >= 0) & (distance < config.sliding_window)
    return masks


def _tree_supported(target) -> bool:
    """Whether the target can verify a tree: its attention must take an explicit 4-D mask (eager, sdpa)."""
    implementation = target.config.get_text_config()._attn_implementation
    if implementation in ("eager", "sdpa"):
        return True
    logger.warning_once(
        f"draft_tree_size needs eager or sdpa attention (an explicit tree mask); {implementation} attention gets "
        "a chain of drafts instead."
    )
    return False


def _holes_allowed(target, cache) -> bool:
    """Whether rejected slots may stay in the cache as masked holes: every layer full attention (a sliding window
    counts slots, so a hole would shorten it) through an explicit dense mask (eager, sdpa: a hole is a masked key
    like a padding one). Moving them to the left end instead copies every row that kept less, every layer, every
    step: at batch 4 in bfloat16 on a CPU, holes made "auto" 2-3 % faster and a 16-node tree 5-8 %."""
    implementation = target.config.get_text_config()._attn_implementation
    return implementation in ("eager", "sdpa") and all(type(layer) is DynamicLayer for layer in cache.layers)


def _check_cache(cache) -> None:
    for layer in cache.layers:
        if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer):
            raise ValueError(
                f"The target's cache uses {type(layer).__name__} layers, which cannot drop rejected draft tokens. "
                "DFlash needs a target with key/value attention caches (DynamicLayer / DynamicSlidingWindowLayer)."
            )


def _keep_verified(cache, valid: torch.BoolTensor, keep: torch.BoolTensor, shift: bool = True) -> torch.BoolTensor:
    """Drop the rejected verified slots from the target cache and return the new slot mask `[rows, slots]`.

    `valid` [rows, S] marks real slots before the verified block, `keep` [rows, V] the block slots to keep (a
    prefix per row). Slots past the longest kept prefix are cropped; when rows kept different lengths, each row's
    rejected slots are moved to its left end so every row stays left-padded (`shift`), or stay where they are,
    masked, where every layer reads its keys through the mask alone (`_holes_allowed`).
    """
    verify_len = keep.shape[1]
    longest = int(keep.sum(-1).max())
    kept = keep[:, :longest]
    if not shift or kept.all():
        cache.crop(longest - verify_len)
        return torch.cat([valid, kept], dim=1)
    slots = torch.cat([valid, kept], dim=1)  # [rows, S + longest]
    shifts = [(i, r) for i, r in enumerate((longest - keep.sum(-1)).tolist()) if r]  # row i moves right by r
    for layer in cache.layers:
        # A sliding layer stores only its window of the S old slots: shift inside what it stores. The `r` slots it
        # frees at the left are masked, and the window trim below removes them again.
        tail = layer.keys.shape[-2] - verify_len + longest
        layer.keys, layer.values = layer.keys[..., :tail, :], layer.values[..., :tail, :]
        for i, r in shifts:  # in place, row by row: a gather over the whole cache is ~10x slower on CPU
            layer.keys[i, :, r:] = layer.keys[i, :, :-r].clone()
            layer.values[i, :, r:] = layer.values[i, :, :-r].clone()
        if isinstance(layer, DynamicSlidingWindowLayer):
            layer.cumulative_length = slots.shape[1]
            if tail >= layer.sliding_window:
                layer.keys = layer.keys[..., -layer.sliding_window + 1 :, :]
                layer.values = layer.values[..., -layer.sliding_window + 1 :, :]
    order = torch.sort(slots.to(torch.int8), dim=1, stable=True).indices
    return slots.gather(1, order)
