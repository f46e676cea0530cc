"""The fixed-shape decoding path: every step has the same shapes (with "auto", one of a few), so it compiles once, and
the host reads the device once per step (without "auto", one step late).

`generate(..., cache_implementation="static")` asks for it, as it asks plain `generate` for a static cache; where
the call's settings allow it (`unsupported_reason` is None) the loop runs with a `FixedShapeDecoder` and a
`RowDrafterCache` instead of the general path's sides (the same loop, the same proposer). What changes:

- the target's and the drafter's KV caches are preallocated (`kv_cache.row_cache`, kept for the next call of the same
  shape) with room for `max_length` and a spare slot for whatever a last step writes past it; each row writes its
  block at its own slots, and a rejected slot is written over by the next step;
- the drafter's context is the whole verified block, its rejected slots masked, instead of the accepted prefix;
- a tree of drafts (`draft_tree_size=N`) is built on the device (`tree.build_tree_on_device`: always N nodes), and
  the accepted path's keys / values are moved to the slots after the root, where the chain's would be;
- `draft_tree_size="auto"` builds the widest tree it may choose and verifies its best n nodes, n one of a few sizes
  (`auto_size.tree_size_menu`), each a width compiled before the first step (`warm_up`); choosing n is the step's
  one read of the device;
- rows that stop stay in the batch, frozen (they commit nothing), instead of leaving it;
- acceptance, the EOS, stop-string and `max_length` cut, the commit into a preallocated output buffer and the
  acceptance record are computed on the device; sampling draws by exponential races (`hf_dflash.sampling`: exact,
  like `multinomial`, without a host read), and a chain's drafts are drawn from the drafter and rejection-sampled,
  as on the general loop;
- the drafter's forward and the target's verification are compiled where transformers would compile plain decoding
  (`compile_config`, `disable_compile`, a device it compiles on); the prefill and the first draft stay eager.

What it serves: chains, trees and "auto" (no `assistant_confidence_threshold`), greedy and sampling with processors
that ignore `input_ids`, EOS, stop-string and `max_length` stops, batch >= 1, full-attention and sliding-window
targets with eager or sdpa attention, and hybrid targets whose linear layers are `layer_types`' "linear_attention"
(chains: `linear_attention.RowLinearLayer` keeps their states in place). Anything else runs on the general loop, said
once in the log.
"""

import time

import torch
from torch.nn import functional as F
from transformers.generation import EosTokenCriteria, MaxLengthCriteria, StopStringCriteria
from transformers.utils import logging

from ..sampling import rejection_sample
from .compiling import compile_config_for, compiled_call, compiled_function
from .decoder import POSITION_FREE_PROCESSORS, DFlashGenerateOutput, eos_token_ids, pad_token_id, pick
from .kv_cache import cache_capacity, move_slots, row_cache, set_write_index, step_span
from .linear_attention import RowLinearLayer, fixed_shape_unsupported, keep_row_states, record_block, row_linear_states
from .proposer import Context, DraftSettings, drafter_masks
from .tree import DraftTree, additive_mask, ancestors, takes_explicit_masks

logger = logging.get_logger(__name__)

def unsupported_reason(target, settings: DraftSettings, generation_config, logits_processor, stopping_criteria,
                       streamer) -> str | None:
    """Why this call cannot run on the fixed-shape path, or None when it can."""
    if settings.threshold:
        return f"assistant_confidence_threshold={settings.threshold!r} (pass 0)"
    if reason := fixed_shape_unsupported(target):
        return reason
    if not takes_explicit_masks(target):
        implementation = target.config.get_text_config()._attn_implementation
        return f"{implementation} attention (eager or sdpa take the explicit masks it needs)"
    if not all(isinstance(p, POSITION_FREE_PROCESSORS) for p in logits_processor or []):
        names = sorted({type(p).__name__ for p in logits_processor if not isinstance(p, POSITION_FREE_PROCESSORS)})
        return f"logits processors that read input_ids ({', '.join(names)})"
    kinds = {type(c) for c in stopping_criteria or []}
    if not kinds <= {MaxLengthCriteria, EosTokenCriteria, StopStringCriteria}:
        return "stopping criteria other than EOS, stop strings and max_length (custom criteria)"
    if streamer is not None:
        return "a streamer"
    if generation_config.return_dict_in_generate and (generation_config.output_scores or
                                                      generation_config.output_logits):
        return "output_scores / output_logits"
    return None


class FixedShapeDecoder:
    """The target side of the fixed-shape path for one `dflash_decode` call.

    Slots: row r's prompt fills slots [0, P) of its caches (masked slots: `key_is_pad`), a new token at slot j has
    position j + `position_offset[r]`, and `slot` [rows] is where its newest committed token (the next root) goes. A
    step verifies `verify_width` tokens there: the block, or a tree's root and its nodes (at most `tree_size`)."""

    def __init__(self, target, generation_config, logits_processor, stopping_criteria, input_ids, prompt_mask,
                 prompt_positions, settings: DraftSettings):
        self.target = target
        block_size, tree_size = settings.block_size, settings.tree_size
        # "auto": its step costs (`StepCosts`, timed here) and every width it may choose, compiled after the prefill
        self.costs = None if settings.auto is None else settings.auto.costs
        self.warm_widths = [] if settings.auto is None else [size + 1 for size in settings.auto.sizes]
        self.config = generation_config
        self.processors = logits_processor or []
        self.block_size = block_size
        self.verify_width = 1 + tree_size if tree_size else block_size  # a tree's: known once it is built
        span = step_span(block_size, tree_size)
        device = input_ids.device
        batch, self.prompt_len = input_ids.shape
        self.max_length = generation_config.max_length
        self.eos_ids = eos_token_ids(stopping_criteria, device)
        self.stop_strings = [c for c in stopping_criteria or [] if type(c) is StopStringCriteria]
        self.pad_token_id = pad_token_id(generation_config)
        self.capacity = cache_capacity(self.max_length)
        self.sequences = torch.full((batch, self.max_length + block_size), self.pad_token_id, dtype=torch.long,
                                    device=device)
        self.sequences[:, : self.prompt_len] = input_ids
        self.lengths = torch.full((batch,), self.prompt_len, dtype=torch.long, device=device)
        self.slot = self.lengths.clone()
        self.prompt_positions = prompt_positions  # [rows, P]: as `generate` gives them (`decoder.prompt_positions`)
        self.position_offset = prompt_positions[:, -1] + 1 - self.prompt_len  # [rows]: a new token's, from its slot
        self.key_is_pad = torch.zeros(batch, self.capacity, dtype=torch.bool, device=device)
        self.key_is_pad[:, : self.prompt_len] = ~prompt_mask
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)
        self.record = torch.zeros(batch, self.max_length - self.prompt_len + 1, dtype=torch.long, device=device)
        self.steps = 0
        self.widths = []  # each step's verification width, on the host ("auto" chooses it there)
        text_config = target.config.get_text_config()
        self.cache = row_cache(target, text_config.num_hidden_layers, self.capacity, batch, span)
        self.prompt_mask = prompt_mask  # [rows, P]: what a hybrid target's linear layers read in the prefill
        self.linear_states = None  # a hybrid target's (`row_linear_states`), once the prefill allocated them
        self.keep_row_states = None  # `linear_attention.keep_row_states`, compiled where the forwards are
        self.sliding_window = getattr(text_config, "sliding_window", None)
        types = set(getattr(text_config, "layer_types", None) or [])
        if not types:
            types = {"sliding_attention" if self.sliding_window else "full_attention"}
        self.layer_types = types
        self.write_index = torch.zeros(batch, span, dtype=torch.long, device=device)  # its first W: a step's slots
        self.offsets = torch.arange(span, device=device)
        self.family = None  # the verified tree's [rows, T, T] ancestry (`tree.ancestors`)
        self.compile_config = None
        self.verify_calls = {}  # width -> the target's (compiled) call
        self.move_slots = None  # `kv_cache.move_slots`, compiled where the forwards are
        self.rows = torch.arange(batch, device=device)  # every row stays: the decoder's rows never change
        self.flags = _DeferredFlags(self.finished)
        self.checks = 0  # calls of `done`

    @property
    def next_pos(self) -> torch.LongTensor:
        return self.slot + self.position_offset

    def slot_positions(self, slots: torch.LongTensor) -> torch.LongTensor:
        """The position ids [rows, n] of the tokens at `slots` [rows, n]: a prompt's as given, a new one's its slot's
        plus the row's offset."""
        prompt = self.prompt_positions.gather(1, slots.clamp(max=self.prompt_len - 1))
        return torch.where(slots < self.prompt_len, prompt, slots + self.position_offset[:, None])

    def step_slots(self, width: int) -> torch.LongTensor:
        """The slots [rows, width] of a step's tokens from each row's root on. Those from the cache's last slot on all
        go to that one, the spare past `max_length`: their tokens are never committed, and no token that is attends
        to them (a tree's node there is never accepted: `verify`)."""
        return (self.slot[:, None] + self.offsets[:width]).clamp(max=self.capacity - 1)

    def newest_tokens(self) -> torch.LongTensor:
        return self.sequences.gather(1, (self.lengths - 1)[:, None])[:, 0]

    def _masks(self, query_slots: torch.LongTensor, dtype) -> dict | torch.Tensor:
        """Additive masks [rows, 1, Q, capacity] for queries at `query_slots` [rows, Q]: each sees the real slots up to
        its own (as in `generate`: a prompt's masked last slot picks the first token), sliding layers within their
        window, counted in slots as transformers counts them; a query that sees nothing sees itself."""
        keys = torch.arange(self.capacity, device=query_slots.device)
        distance = query_slots[:, :, None] - keys  # [rows, Q, capacity]
        visible = (distance >= 0) & ~self.key_is_pad[:, None, :]
        visible |= (distance == 0) & ~visible.any(-1, keepdim=True)
        masks = {}
        for kind in self.layer_types:
            seen = visible & (distance < self.sliding_window) if kind == "sliding_attention" else visible
            # linear layers: a step's tokens are never padding (the prefill gives them the prompt's 2-D mask)
            masks[kind] = None if kind == "linear_attention" else additive_mask(seen, dtype)[:, None]
        return next(iter(masks.values())) if len(masks) == 1 else masks

    # --- the loop's interface (as `Decoder`'s) ------------------------------------------------------------------
    def prefill(self, input_ids: torch.LongTensor):
        """The prompts into the cache at slots [0, P), eagerly, and the first token committed; with "auto", every
        width it may choose compiled (`warm_up`). Returns the target's output."""
        slots = torch.arange(self.prompt_len, device=input_ids.device).expand(len(input_ids), -1)
        set_write_index(self.cache, slots)
        masks = self._masks(slots, self.target.dtype)
        if "linear_attention" in self.layer_types:
            masks["linear_attention"] = self.prompt_mask.long()
            for layer in self.cache.layers:
                if isinstance(layer, RowLinearLayer):
                    layer.start()
        out = self.target(input_ids=input_ids, position_ids=self.prompt_positions, attention_mask=masks,
                          cache=self.cache, use_cache=True, output_hidden_states=True, logits_to_keep=1)
        self.linear_states = row_linear_states(self.cache) or None
        self.compile_config = compile_config_for(self.target, self.cache, self.config)
        tokens = pick(self.process(out.logits[:, -1:]), self.config.do_sample)  # [rows, 1]
        self.commit(tokens, torch.ones_like(self.lengths), record=False)
        self.warm_up(self.warm_widths)
        return out

    def prompt_context(self, features: torch.Tensor) -> Context:
        """The drafter's first context: the prompts' features [rows, P, F] at slots [0, P)."""
        slots = torch.arange(self.prompt_len, device=self.slot.device).expand(len(self.slot), -1)
        return Context(features, ~self.key_is_pad[:, : self.prompt_len], self.prompt_positions, slots)

    def room(self, block_size: int) -> int:
        """Every step verifies the whole block (its tokens past `max_length` go to the spare slot, never committed)."""
        return block_size

    def done(self) -> bool:
        """Whether every row has stopped, as of the step before the last on CUDA (the last may have had nothing left
        to commit; the host learns of a stop while the next step is already queued), or `max_length` was reached."""
        self.flags.publish(self.finished)
        self.checks += 1
        return self.checks > self.max_length - self.prompt_len or self.flags.all_set()

    def drop_finished(self) -> torch.LongTensor | None:
        """Stopped rows stay in the batch here, frozen (they commit nothing): shapes never change."""
        return None

    def verify_call(self, width: int):
        """The target's call for a verification of `width` tokens: compiled (`compiled_call`), one function a width."""
        call = self.verify_calls.get(width)
        if call is None:
            call = self.verify_calls[width] = compiled_call(self.target, self.compile_config, key=width)
        return call

    def warm_up(self, widths) -> None:
        """Run the (compiled) verification once at each of `widths` it has not run at yet with these shapes, at the
        slots the first step writes over first: "auto" may choose any of them at any step, and a width compiled in
        the middle of a generation would stall it (tens of seconds on a CPU)."""
        if self.compile_config is None:
            return
        newest = self.newest_tokens()[:, None]  # [rows, 1]: any token costs the same
        for width in widths:
            warm = vars(self.verify_call(width)).setdefault("_hf_dflash_warm", set())  # the shapes it has run
            key = (len(self.slot), self.capacity, self.target.dtype)
            if key not in warm:
                slots = self.write_index[:, :width]  # the loop's own index tensor: the compiled graph guards its kind
                slots.copy_(self.step_slots(width))
                set_write_index(self.cache, slots)
                self.forward_at(newest.repeat(1, width), slots)
                warm.add(key)

    def verify_forward(self, tree: DraftTree):
        """The target over `tree` [rows, T] (the root, then its drafts) at each row's slots."""
        self.verify_width = width = tree.tokens.shape[1]
        if self.costs is not None:
            self.costs.step_begins(width, time.perf_counter())  # a step: from one choice to the next
        self.widths.append(width)
        query_slots = self.write_index[:, :width]  # [rows, T]: a view of one buffer, the same every step
        query_slots.copy_(self.step_slots(width))
        set_write_index(self.cache, query_slots)
        if tree.is_chain:
            return self.forward_at(tree.tokens, query_slots)
        if self.linear_states is not None:
            raise RuntimeError("A hybrid target's recurrent layers read a block in order: they verify chains only.")
        self.family = ancestors(tree, max_depth=self.block_size - 1)
        return self.verify_call(width)(input_ids=tree.tokens, position_ids=self.next_pos[:, None] + tree.depths,
                                attention_mask=self._tree_masks(tree, self.target.dtype), cache=self.cache,
                                use_cache=True, output_hidden_states=True)

    def _tree_masks(self, tree: DraftTree, dtype) -> dict | torch.Tensor:
        """`_masks` for a tree at the slots from each row's root on: a node sees the real slots before the root and
        its own ancestors; sliding layers count the distance in slots, a node's being the root's + its depth (where
        the chain through it would sit)."""
        rows, width = tree.tokens.shape
        keys = torch.arange(self.capacity, device=tree.tokens.device)
        in_tree = keys - self.slot[:, None]  # [rows, capacity]: the key's tree slot where 0 <= it < T
        tree_slot = in_tree.clamp(0, width - 1)
        is_node = (in_tree >= 0) & (in_tree < width)
        visible = self.family.gather(2, tree_slot[:, None, :].expand(-1, width, -1)) & is_node[:, None, :]
        visible |= ((in_tree < 0) & ~self.key_is_pad)[:, None, :]  # [rows, T, capacity]
        masks = {}
        for kind in self.layer_types:
            seen = visible
            if kind == "sliding_attention":
                key_at = torch.where(is_node, self.slot[:, None] + tree.depths.gather(1, tree_slot), keys)
                query_at = self.slot[:, None] + tree.depths
                seen = visible & (query_at[:, :, None] - key_at[:, None, :] < self.sliding_window)
            masks[kind] = additive_mask(seen, dtype)[:, None]
        return next(iter(masks.values())) if len(masks) == 1 else masks

    def forward_at(self, tokens: torch.LongTensor, query_slots: torch.LongTensor):
        """The (compiled) target forward over `tokens` [rows, Q] at `query_slots` [rows, Q], writing the cache where
        its layers' write index says; a hybrid target's linear layers record each token's state (`record_block`)."""
        record_block(self.cache, tokens.shape[1])
        return self.verify_call(tokens.shape[1])(input_ids=tokens, position_ids=self.slot_positions(query_slots),
                                attention_mask=self._masks(query_slots, self.target.dtype), cache=self.cache,
                                use_cache=True, output_hidden_states=True)

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` [rows, V, vocab] processed as `generate` processes them, in float32."""
        rows, width, vocab = logits.shape
        scores = logits.to(dtype=torch.float32).reshape(rows * width, vocab)
        if self.processors:
            scores = self.processors(torch.zeros(rows * width, 1, dtype=torch.long, device=scores.device), scores)
        return scores.view(rows, width, vocab)

    def accept(self, logits: torch.Tensor, tree: DraftTree, features: torch.Tensor) -> tuple:
        """Verify `tree` against the target's `logits` [rows, T, vocab], commit, and keep the accepted path in the
        cache. `features` [rows, T, F]: the drafter's features of the verified slots. Returns the drafter's next
        `Context` (the block's, or the tree's path's, now at the slots from the old root on), the accepted path's
        tree slots [rows, B] (a chain's: its own [rows, T]), and how many tokens each row kept before any stop
        [rows]."""
        tokens, kept, path = self.verify(logits, tree)
        if self.linear_states is not None:  # chains only: each row's states after its kept tokens
            if self.keep_row_states is None:
                self.keep_row_states = compiled_function(self.target, keep_row_states, self.compile_config)
            self.keep_row_states(self.linear_states, kept)
        if path is not None:
            self.keep_path(path)
            features = features.gather(1, path.to(features.device)[..., None].expand(-1, -1, features.shape[-1]))
        elif features.shape[1] < self.block_size:  # a chain "auto" cut short: its slots past it are masked
            features = F.pad(features, (0, 0, 0, self.block_size - features.shape[1]))
        written = self.step_slots(self.block_size)
        context = Context(features, self.offsets[: self.block_size] < kept[:, None], self.slot_positions(written),
                          written)
        self.slot = self.slot + self.commit(tokens, kept)
        if path is None:
            path = self.offsets[: tree.tokens.shape[1]].expand(len(kept), -1)
        return context, path, kept

    def verify(self, logits: torch.Tensor, tree: DraftTree) -> tuple:
        """The target's tokens [rows, B] along each row's accepted path and after it, how many of them each row keeps
        before any stop cuts it [rows] (its accepted drafts + the target's own token), and for a tree the path's
        slots [rows, B] (root first; past the accepted depth, any slot)."""
        scores = self.process(logits)
        if tree.proposal is not None:  # drawn drafts: each kept with probability min(1, p / q), else resampled
            drawn = rejection_sample(scores[:, :-1], tree.tokens[:, 1:], *tree.proposal)
            choices = torch.cat([drawn, pick(scores[:, -1:], True)], dim=1)  # after the last draft: the target's own
        else:
            choices = pick(scores, self.config.do_sample)  # [rows, T]: the target's token after each slot
        if tree.is_chain:
            matches = tree.tokens[:, 1:] == choices[:, :-1]
            return choices, matches.long().cumprod(-1).sum(-1) + 1, None
        # a node is right when the target chose its token after its parent; accepted when it and its ancestors are
        right = tree.tokens == choices.gather(1, tree.parents.clamp(min=0))
        right &= self.slot[:, None] + self.offsets[: right.shape[1]] < self.capacity - 1  # else its keys were lost
        right[:, 0] = True
        accepted = ~(self.family & ~right[:, None, :]).any(-1)  # [rows, T]
        deepest = (accepted * (tree.depths + 1)).argmax(-1)  # siblings hold distinct tokens: one per depth
        on_path = self.family[self.rows, deepest]  # [rows, T]: the deepest accepted node and its ancestors
        depths = torch.arange(self.block_size, device=choices.device)
        path = (on_path[:, None, :] & (tree.depths[:, None, :] == depths[:, None])).long().argmax(-1)  # [rows, B]
        return choices.gather(1, path), tree.depths.gather(1, deepest[:, None])[:, 0] + 1, path

    def keep_path(self, path: torch.LongTensor) -> None:
        """Move the keys / values of each row's path [rows, B] (tree slots) to the slots from its root on, in every
        layer, where a chain's would be; slots past the accepted depth get any node's (the next step writes over
        them first)."""
        states = [stored for layer in self.cache.layers for stored in (layer.keys, layer.values)]
        if self.move_slots is None:  # compiled at the first tree step
            self.move_slots = compiled_function(self.target, move_slots, self.compile_config)
        self.move_slots(states, self.slot[:, None] + path, self.step_slots(self.block_size))

    def commit(self, tokens: torch.LongTensor, kept: torch.LongTensor, record: bool = True) -> torch.LongTensor:
        """Append each live row's first `kept` of `tokens` [rows, W], cut after its first EOS or completed stop string
        and at `max_length`; returns how many each row committed (0 for a stopped row)."""
        width = tokens.shape[1]
        offsets = self.offsets[:width]
        ends = (torch.isin(tokens, self.eos_ids) | self.stop_string_ends(tokens)) & (offsets < kept[:, None])
        kept = torch.where(ends.any(-1), ends.long().argmax(-1) + 1, kept)
        kept = torch.minimum(kept, self.max_length - self.lengths)
        kept = torch.where(self.finished, 0, kept)
        index = self.lengths[:, None] + offsets
        self.sequences.scatter_(1, index, torch.where(offsets < kept[:, None], tokens, self.sequences.gather(1, index)))
        stopped = (ends & (offsets < kept[:, None])).any(-1) | (self.lengths + kept >= self.max_length)
        self.lengths = self.lengths + kept
        self.finished = self.finished | stopped
        if record:
            self.record[:, self.steps] = kept
            self.steps += 1
        return kept

    def stop_string_ends(self, tokens: torch.LongTensor) -> torch.BoolTensor:
        """[rows, W]: whether the text would end in a stop string after each of `tokens` [rows, W] appended. Each
        `StopStringCriteria` reads the last tokens of a sequence: it is called once on every position's window."""
        rows, width = tokens.shape
        ends = torch.zeros(rows, width, dtype=torch.bool, device=tokens.device)
        for criterion in self.stop_strings:
            before = criterion.maximum_token_len - 1  # the committed tokens a window reaches back to
            index = self.lengths[:, None] - before + torch.arange(before, device=tokens.device)  # [rows, before]
            # before the first slot: an id past the criterion's table, which it maps to "matches nothing"
            past = criterion.embedding_vec.shape[0] - 1
            history = torch.where(index >= 0, self.sequences.gather(1, index.clamp(min=0)), past)
            windows = torch.cat([history, tokens], dim=1).unfold(1, before + 1, 1)  # [rows, W, before + 1]
            ends |= criterion(windows.reshape(rows * width, -1), None).view(rows, width)
        return ends

    def result(self):
        lengths = self.lengths.tolist()
        sequences = self.sequences[:, : max(lengths)]
        sequences = torch.where(torch.arange(sequences.shape[1], device=sequences.device) < self.lengths[:, None],
                                sequences, self.pad_token_id)
        if not self.config.return_dict_in_generate:
            return sequences
        record = self.record[:, : self.steps].tolist()
        acceptance = [[n for n in row if n] for row in record]
        return DFlashGenerateOutput(
            sequences=sequences, acceptance_lengths=acceptance,
            draft_lengths=[[width - 1 for width, n in zip(self.widths, row) if n] for row in record],
        )


class RowDrafterCache:
    """The fixed-shape path's drafter context (`proposer.DynamicDrafterCache`'s counterpart): a row cache with the
    decoder's slots (`kv_cache.row_cache`), each verified block's features written at its slots (its rejected ones
    masked by the next forward: they lie past the new root), and the drafter's forward compiled from the second draft
    on (the first reads the whole prompt)."""

    fixed_shapes = True

    def __init__(self, drafter, decoder: FixedShapeDecoder):
        self.cache = row_cache(drafter, drafter.config.num_hidden_layers, decoder.capacity, len(decoder.slot))
        self.drafter_call, self.compiled = drafter.__call__, False
        self.context = None

    def extend(self, context: Context) -> None:
        self.context = context

    def select_rows(self, live) -> None:
        raise RuntimeError("The fixed-shape path keeps every row: its decoder never drops one.")

    def forward(self, drafter, noise_embeds: torch.Tensor, decoder: FixedShapeDecoder) -> torch.Tensor:
        """The drafter over the context and a block (`noise_embeds` [rows, V, hidden]) at the slots from each row's
        root on; returns the block's hidden states, writing the context's keys at its slots."""
        device = noise_embeds.device
        context_slots = self.context.slots
        block_slots = decoder.slot[:, None] + decoder.offsets[: noise_embeds.shape[1]]
        positions = decoder.slot_positions(torch.cat([context_slots, block_slots], dim=1)).to(device)
        context_slots, block_slots = context_slots.to(device), block_slots.to(device)
        set_write_index(self.cache, context_slots)
        # the keys: every cached slot below each row's root that holds a real token, then the block
        keys = torch.arange(decoder.capacity, device=device)
        cached = (keys < block_slots[:, :1]) & ~decoder.key_is_pad.to(device)  # [rows, capacity]
        key_valid = torch.cat([cached, torch.ones_like(block_slots, dtype=torch.bool)], dim=1)
        key_slots = torch.cat([keys.expand(len(block_slots), -1), block_slots], dim=1)
        hidden = self.drafter_call(
            noise_embeds=noise_embeds,
            context_hidden_states=self.context.features.to(device),
            position_ids=positions,
            attention_mask=drafter_masks(drafter.config, key_valid, key_slots, block_slots),
            cache=self.cache,
        ).last_hidden_state
        if not self.compiled:  # the context's width is the block's from the next draft on
            self.drafter_call, self.compiled = compiled_call(drafter, decoder.compile_config), True
        return hidden


class _DeferredFlags:
    """Each step's stop flags copied to the host without waiting for the device (pinned memory, an event per copy on
    CUDA, as transformers' `DeferredStopCheck`); on CUDA `all_set` reads the copy published before the last one,
    which the device made while the host queued the last step. A CPU has no queue to keep busy: it reads the last."""

    def __init__(self, flags: torch.BoolTensor):
        cuda = flags.device.type == "cuda"
        self.buffers = [torch.zeros(flags.shape, dtype=torch.bool, pin_memory=cuda) for _ in range(2)]
        self.events = [torch.cuda.Event() if cuda else None for _ in range(2)]
        self.lag = 1 if cuda else 0
        self.published = 0

    def publish(self, flags: torch.BoolTensor) -> None:
        i = self.published % 2
        self.buffers[i].copy_(flags, non_blocking=True)
        if self.events[i] is not None:
            self.events[i].record()
        self.published += 1

    def all_set(self) -> bool:
        i = (self.published - 1 - self.lag) % 2
        if self.events[i] is not None:
            self.events[i].synchronize()
        return bool(self.buffers[i].all())


def wants_fixed_shape(generation_config, cache) -> bool:
    """Whether the call asks for static caches: `cache_implementation="static"`, or a `StaticCache` given."""
    from transformers.cache_utils import StaticCache

    return generation_config.cache_implementation == "static" or isinstance(cache, StaticCache)


__all__ = ["FixedShapeDecoder", "RowDrafterCache", "unsupported_reason", "wants_fixed_shape"]
