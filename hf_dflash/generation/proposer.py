"""The drafter side of the decoding loop: what the target verifies next.

`DFlashProposer` runs one drafter forward over the newest token and `block_size - 1` mask tokens, conditioned on the
target's features of what is committed, and proposes a chain of argmax drafts or a best-first tree of candidates
(`hf_dflash.generation.tree`), each ranked under its parent by a DFlash2 drafter's candidate selector, or by the
drafter's bigram prior (`hf_dflash.bigram`) when it carries one.

The loop talks to a proposer through five methods, the same on both paths, like transformers' candidate generators
and vLLM's proposers: `propose(decoder, verify_len)` reads the committed tokens (never changing them) and returns a
`DraftTree`; `features(hidden_states)` picks what it reads of a target forward, and `extend_context(context)` hands it
the decoder's `Context` of the newly verified tokens; `accepted(tree, path, num_accepted)` says what the target
accepted; `select_rows(live)` drops finished rows. Where the drafter keeps that context is the one thing the paths do
differently: a `DynamicDrafterCache` on the general loop, a `fixed_shape.RowDrafterCache` on the fixed-shape path,
given to the proposer by the loop. So a subclass (the oracle benchmark's, another drafter family) serves both paths;
`draft_chain` (greedy), `sample_chain` (drawn, under sampling), `draft_candidates` and `conditional_candidates` are the
building blocks to override.
"""

from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
from transformers.cache_utils import DynamicCache
from transformers.utils import logging

from ..bigram import conditional_chain, conditional_probs, conditional_walk, sample_conditional_chain
from ..cpu_ops import pack_linears
from ..modeling import DFlash2DraftModel, DFlashDraftModel
from ..modeling.modeling_dflash import block_visibility, stored_weight
from .auto_size import AutoTreeSize, fixed_shape_auto
from .forward_costs import LoopCosts, load_forward_costs
from .linear_attention import is_hybrid
from .tree import DraftTree, build_tree, build_tree_on_device, takes_explicit_masks

logger = logging.get_logger(__name__)

# Candidates per position the bigram prior reranks in a chain: where its gain was measured (docs/design.md).
PRIOR_CANDIDATES = 8
# Candidates a sampled draft is drawn from: the drafter's distribution cut to its most likely tokens (the target's
# rejection step stays exact for any proposal; the cut only costs acceptance where the mass beyond it is large).
SAMPLED_CANDIDATES = 16


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


def _tree_unsupported(target) -> str | None:
    """Why the target cannot verify a tree of drafts, or None where it can (an explicit 4-D mask, no recurrence)."""
    if is_hybrid(target):
        return (f"{target.config.get_text_config().model_type} targets verify chains of drafts, not trees: their "
                "linear-attention (or state-space) layers read a block in order, not through a tree mask")
    if not takes_explicit_masks(target):
        implementation = target.config.get_text_config()._attn_implementation
        return f"draft_tree_size needs eager or sdpa attention (an explicit tree mask), not {implementation}"
    return None


class Context(NamedTuple):
    """What the drafter reads next (a decoder's, for `DFlashProposer.extend_context`): the target's features
    [rows, n, F] of the tokens just verified (a tree's accepted path, root first), which of them were kept [rows, n],
    their positions [rows, n] and, on the fixed-shape path, the cache slots [rows, n] they went to."""

    features: torch.Tensor
    valid: torch.BoolTensor
    positions: torch.LongTensor
    slots: torch.LongTensor | None = None


@dataclass(frozen=True)
class DraftSettings:
    """A call's drafting settings, resolved once (`draft_settings`) for both sides of either path.

    `block_size`: tokens a step verifies in a chain (the newest + drafts); `tree_size`: the nodes of a tree (0: a
    chain; "auto" until `with_auto` sizes it); `threshold`: a step verifies no drafts when every row's first draft is
    less likely (0: never); `temperature`: drafts are drawn at it (None: greedy); `auto`: the "auto" policy;
    `chains_only`: the target cannot verify trees, so "auto" sizes chains (trees of one candidate per position)."""

    block_size: int
    tree_size: int | str
    threshold: float
    temperature: float | None
    auto: AutoTreeSize | None = None
    chains_only: bool = False


def draft_settings(target, drafter: DFlashDraftModel, *, num_assistant_tokens: int | None = None,
                   assistant_confidence_threshold: float | None = None, draft_tree_size: int | str | None = None,
                   temperature: float | None = None) -> DraftSettings:
    """The call's `DraftSettings` from `generate`'s (None: the drafter's defaults), each checked, with a `ValueError`
    naming what is wrong. See `hf_dflash.generate`."""
    check_compatible(target, drafter)
    num_drafts = num_assistant_tokens
    if num_drafts is not None and (not isinstance(num_drafts, int) or num_drafts < 0):
        raise ValueError(f"num_assistant_tokens={num_drafts!r}: use a whole number of draft tokens >= 0.")
    # tokens verified per step: the newest + the drafts; never more drafts than the drafter's block holds
    block_size = drafter.block_size if num_drafts is None else min(drafter.block_size, num_drafts + 1)
    tree_size = drafter.draft_tree_size if draft_tree_size is None else draft_tree_size
    if tree_size != "auto" and (not isinstance(tree_size, int) or isinstance(tree_size, bool) or tree_size < 0):
        raise ValueError(f"draft_tree_size={tree_size!r}: use a whole number of draft nodes >= 0, or 'auto'.")
    # "auto" replaces the drafter's tuned default threshold; an explicit one still applies
    default_threshold = 0.0 if tree_size == "auto" else drafter.assistant_confidence_threshold
    threshold = default_threshold if assistant_confidence_threshold is None else assistant_confidence_threshold
    if not 0 <= threshold <= 1:
        raise ValueError(
            f"assistant_confidence_threshold={threshold!r}: use a probability in [0, 1] (0: never skip)."
        )
    if temperature is not None and not temperature > 0:
        raise ValueError(f"temperature={temperature!r}: sampling needs a temperature > 0.")
    reason = _tree_unsupported(target) if tree_size else None
    chains_only = reason is not None
    if chains_only and tree_size != "auto":  # "auto" sizes chains instead of trees: nothing to say
        logger.warning_once(f"draft_tree_size={tree_size}: {reason}. A chain of drafts is verified instead; "
                            "draft_tree_size='auto' chooses each step's chain length.")
        tree_size = 0
    return DraftSettings(block_size, tree_size, threshold, temperature, chains_only=chains_only)


def with_auto(settings: DraftSettings, target, batch_size: int, fixed_shape: bool) -> DraftSettings:
    """`settings` with "auto" sized for its path: its policy (the general loop's costs per verified token, or the
    fixed-shape path's menu of compiled widths) and, as `tree_size`, the widest tree it may choose."""
    if settings.tree_size != "auto":
        return settings
    if fixed_shape:
        auto = fixed_shape_auto(target, batch_size, settings.block_size, settings.chains_only)
    else:
        auto = AutoTreeSize(LoopCosts(load_forward_costs(target, batch_size=batch_size)),
                            max_depth=settings.block_size - 1)
    return replace(settings, tree_size=auto.max_nodes, auto=auto)


class DFlashProposer:
    """Drafts for one `dflash_decode` call, on either path: `settings` (`DraftSettings`) say what, `cache` (a
    `DynamicDrafterCache`, or the fixed-shape path's `RowDrafterCache`) keeps the drafter's context. Rows follow the
    decoder's live rows (`select_rows`). Under sampling (`settings.temperature`), a chain's drafts are sampled from the
    drafter's own distribution at the target's temperature (`sample_chain`), and the target's rejection step reads
    that distribution."""

    def __init__(self, target, drafter: DFlashDraftModel, settings: DraftSettings, cache):
        self.target, self.drafter, self.cache = target, drafter, cache
        self.block_size, self.tree_size = settings.block_size, settings.tree_size
        self.threshold, self.temperature, self.auto = settings.threshold, settings.temperature, settings.auto
        self.head = target.get_output_embeddings()
        self.draft_head = drafter.draft_head(self.head)  # gathered once: the draft vocabulary's rows
        head = self.head if self.draft_head is None else self.draft_head[0]
        if drafter.device.type == "cpu" and head.weight.data_ptr() != stored_weight(self.head).data_ptr():
            pack_linears(head)  # the drafter's own copy (a packed twin of the target's head would double it)
        self.draft_vocab_size = head.weight.shape[0]
        self.prior = drafter.bigram_prior  # (keys, boosts, vocab size): buffers, on the drafter's device
        self.selector = isinstance(drafter, DFlash2DraftModel)  # drafts under their parent, as the prior does
        # candidates per position: no tree uses more; one keeps a tree a chain
        self.chains_only = settings.chains_only
        self.top_k = 1 if self.chains_only else min(self.tree_size, self.draft_vocab_size)
        self.live = None  # the rows that commit, when "auto" chose the step's tree (fixed shapes keep stopped rows)

    @property
    def conditional(self) -> bool:
        """Whether drafts are ranked under their parent (`conditional_candidates`)."""
        return self.selector or self.prior is not None

    # --- the loop's interface ------------------------------------------------------------------------------
    def features(self, hidden_states: tuple) -> torch.Tensor:
        """The drafter's context from a target forward's `hidden_states` (embeddings first): its target layers
        concatenated, [rows, length, len(target_layer_ids) * hidden], on the drafter's device (a target split over
        devices gives each layer's output on that layer's device). A new tensor, never a view of the forward's."""
        device = self.drafter.device
        return torch.cat([hidden_states[i + 1].to(device) for i in self.drafter.config.target_layer_ids], dim=-1)

    def extend_context(self, context: Context) -> None:
        """The target's features of the tokens verified since the last draft (`Context`): the next drafter forward
        reads them and caches their keys."""
        self.cache.extend(context)

    def select_rows(self, live: torch.LongTensor) -> None:
        """Keep the rows `live` (indices into the current rows)."""
        self.cache.select_rows(live)

    def propose(self, decoder, verify_len: int) -> DraftTree:
        """What to verify: each row's newest token, then drafts for the positions after it (a chain, or a tree), at
        most `verify_len` tokens deep. `decoder`: the committed tokens (`newest_tokens()`, `next_pos`, ...)."""
        newest = decoder.newest_tokens()
        no_drafts = DraftTree.chain(newest[:, None])
        if verify_len < 2:
            return no_drafts
        if self.tree_size:
            return self.propose_tree(decoder, verify_len) or no_drafts
        proposal = None
        if self.temperature is None:
            drafts, confidence = self.draft_chain(decoder, verify_len)
        else:
            drafts, confidence, proposal = self.sample_chain(decoder, verify_len)
            proposal = None if proposal is None else tuple(t.to(newest.device) for t in proposal)
        # All or nothing: cutting the block at a later unsure draft saves little, since verifying a few tokens costs
        # about as much as a block; a one-token step costs much less where a block is expensive.
        if self.threshold and bool((confidence < self.threshold).all()):
            return no_drafts
        return DraftTree.chain(torch.cat([newest[:, None], drafts.to(newest.device)], dim=1), proposal)

    def accepted(self, tree: DraftTree, path: torch.LongTensor, num_accepted: torch.LongTensor) -> None:
        """After a verification of `tree`: `path` [rows, L] its accepted slots (root first), `num_accepted` [rows]
        the drafts each row accepted. "auto" learns how far the drafter's scores come true."""
        if self.auto is not None and tree.scores is not None and tree.num_drafts:
            self.auto.update(tree, path, num_accepted, self.live)

    # --- building blocks -----------------------------------------------------------------------------------
    def propose_tree(self, decoder, verify_len: int) -> DraftTree | None:
        """A best-first tree of `tree_size` drafts at most, or None for a step without drafts (the threshold, or
        "auto" finding that no tree pays; on the fixed-shape path a tree of none, a compiled width too)."""
        newest = decoder.newest_tokens()
        if self.conditional:  # probs [rows, D, k, k]: each parent's children
            ids, probs = self.conditional_candidates(decoder, verify_len,
                                                     PRIOR_CANDIDATES if self.chains_only else self.top_k)
            if self.chains_only:  # the chain `draft_chain` drafts, as one candidate per position
                ids, probs = conditional_walk(ids, probs)
        else:
            ids, probs = self.draft_candidates(decoder, verify_len, self.top_k)
        if self.threshold and bool((probs[:, 0, 0].reshape(len(ids), -1).amax(-1) < self.threshold).all()):
            return None
        fixed_shapes = self.cache.fixed_shapes
        build = build_tree_on_device if fixed_shapes else build_tree  # always `tree_size` nodes, no host read
        tree = build(newest, ids.to(newest.device), probs.to(newest.device), self.tree_size)
        if self.auto is None:
            return tree
        self.live = ~decoder.finished[decoder.rows]
        num_drafts = self.auto.choose(tree, self.live)  # the step's one host read on the fixed-shape path
        return tree.first(num_drafts) if num_drafts or fixed_shapes else None

    def draft_chain(self, decoder, verify_len: int) -> tuple:
        """Drafts [rows, verify_len - 1] and, with a confidence threshold, the probability of each row's first draft
        [rows] (else None). A DFlash2 drafter's selector, or a bigram prior, drafts each position's best candidate
        under the draft before it (`conditional_candidates`)."""
        if self.conditional:
            return conditional_chain(*self.conditional_candidates(decoder, verify_len, PRIOR_CANDIDATES))
        hidden = self.hidden_states(decoder, verify_len)
        if not self.threshold:
            return self.drafter.draft_tokens(hidden, self.head, self.draft_head), None
        drafts, confidence = self.drafter.draft_tokens(hidden, self.head, self.draft_head, return_confidence=True)
        return drafts, confidence[:, 0]

    def sample_chain(self, decoder, verify_len: int) -> tuple:
        """Drafts [rows, verify_len - 1] drawn one by one from the drafter's distribution at `temperature`, each under
        the draft before it (a DFlash2 drafter's selector, or the bigram prior), the first draft's probability [rows],
        and the proposal: (candidate ids, the distribution each draft was drawn from), both [rows, verify_len - 1, k].
        Where the drafter is calibrated, a sampled draft is accepted with probability 1 - TV(target, drafter) rather
        than the target's probability of the drafter's argmax (the gain DFlash2 reports at T > 0)."""
        if self.conditional:
            ids, probs = self.conditional_candidates(decoder, verify_len, SAMPLED_CANDIDATES)
        else:
            ids, probs = self.draft_candidates(decoder, verify_len, min(SAMPLED_CANDIDATES, self.draft_vocab_size))
            probs = probs[:, :, None, :].expand(-1, -1, probs.shape[-1], -1)  # the same under every parent
        drafts, q = sample_conditional_chain(ids, probs, self.temperature)
        return drafts, probs[:, 0, 0].amax(-1), (ids, q)

    def draft_candidates(self, decoder, verify_len: int, k: int) -> tuple:
        """The drafter's k most likely tokens for each draft position and their probabilities, most likely first:
        ids and probs [rows, verify_len - 1, k]."""
        hidden = self.hidden_states(decoder, verify_len)
        return self.drafter.draft_tokens(hidden, self.head, self.draft_head, return_confidence=True, top_k=k)

    def conditional_candidates(self, decoder, verify_len: int, k: int) -> tuple:
        """Candidates ids [rows, verify_len - 1, k] and their probabilities under each candidate of the position
        before [rows, verify_len - 1, k, k] (`hf_dflash.bigram.conditional_probs`' layout): a DFlash2 drafter's
        selector (its own `selector_top_k` candidates), else the drafter's k most likely reweighted by its bigram
        prior."""
        if self.selector:
            hidden = self.hidden_states(decoder, verify_len)
            return self.drafter.candidates(hidden, self.head, decoder.newest_tokens(), self.draft_head)
        ids, probs = self.draft_candidates(decoder, verify_len, min(k, self.draft_vocab_size))
        return ids, conditional_probs(ids, probs, self.prior)

    def hidden_states(self, decoder, verify_len: int) -> torch.Tensor:
        """One drafter forward over [newest, mask...]: the hidden states of the draft positions [rows, verify_len - 1,
        hidden]. The drafter's cache keeps the new context, not the block."""
        drafter = self.drafter
        device = drafter.device
        block_ids = torch.full((len(decoder.rows), verify_len), drafter.config.mask_token_id, dtype=torch.long,
                               device=device)
        block_ids[:, 0] = decoder.newest_tokens().to(device)
        noise = drafter.embed(self.target, block_ids).to(device)
        return self.cache.forward(drafter, noise, decoder)[:, 1:]


class DynamicDrafterCache:
    """The general loop's drafter context: a `DynamicCache` of the target features' keys / values, grown by each
    step's accepted tokens (never by a block), with which cached slots are real and their positions."""

    fixed_shapes = False

    def __init__(self, batch_size: int, device):
        self.cache = DynamicCache()
        self.valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)  # [rows, cached]
        self.positions = torch.zeros(batch_size, 0, dtype=torch.long, device=device)  # [rows, cached]
        self.context = None  # the `Context` the next forward caches

    def extend(self, context: Context) -> None:
        self.context = context

    def select_rows(self, live: torch.LongTensor) -> None:
        self.cache.batch_select_indices(live.to(self.valid.device))
        live = live.to(self.valid.device)
        self.valid, self.positions = self.valid[live], self.positions[live]
        self.context = Context(*(t[live.to(t.device)] for t in self.context[:3]))

    def forward(self, drafter, noise_embeds: torch.Tensor, decoder) -> torch.Tensor:
        """The drafter over the context and a block (`noise_embeds` [rows, V, hidden]) at the decoder's next
        positions; returns the block's hidden states, caching the context's keys only."""
        device = noise_embeds.device
        features, valid, positions = (t.to(device) for t in self.context[:3])
        verify_len = noise_embeds.shape[1]
        block_pos = decoder.next_pos.to(device)[:, None] + torch.arange(verify_len, device=device)
        key_valid = torch.cat([self.valid, valid, torch.ones_like(block_pos, dtype=torch.bool)], 1)
        key_pos = torch.cat([self.positions, positions, block_pos], dim=1)
        config = drafter.config
        # no mask where every key is visible to every query (a host read: the fixed-shape path never asks)
        unmasked = set(config.layer_types or ["full_attention"]) == {"full_attention"} and \
            not config.layer_is_causal("full_attention") and bool(key_valid.all())
        hidden = drafter(
            noise_embeds=noise_embeds,
            context_hidden_states=features,
            position_ids=torch.cat([positions, block_pos], dim=1),
            attention_mask=None if unmasked else drafter_masks(config, key_valid, key_pos, block_pos),
            cache=self.cache,
        ).last_hidden_state
        self.cache.crop(-verify_len)  # keep the context, drop the block
        self.valid = torch.cat([self.valid, valid], dim=1)
        self.positions = torch.cat([self.positions, positions], dim=1)
        return hidden


def drafter_masks(config, key_valid, key_pos, query_pos) -> dict:
    """The drafter's boolean masks per layer type [rows, 1, V, keys] for block queries at `query_pos` [rows, V] over
    keys `key_valid` / `key_pos` [rows, keys]."""
    layer_types = set(config.layer_types or ["full_attention"])
    visible = key_valid[:, None, None, :].expand(-1, 1, query_pos.shape[1], -1)
    distance = query_pos[:, None, :, None] - key_pos[:, None, None, :]
    masks = {}
    for layer_type in layer_types:
        window = config.sliding_window if layer_type == "sliding_attention" else None
        masks[layer_type] = visible & block_visibility(distance, window, config.layer_is_causal(layer_type))
    return masks
