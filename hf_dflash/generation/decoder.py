"""The target side of the decoding loop: verification, commit, stopping, streaming and the result.

`Decoder` holds what one `dflash_decode` call has committed (`sequences`, `lengths`), the target's KV cache and the
rows still generating (`rows`, batch rows; finished rows leave the batch). Each step it runs the target over a
`DraftTree`, walks down each row's tree following the target's own choices (logits processors and sampling applied
position by position, as `generate` would), commits the accepted tokens one stopping check at a time, and keeps the
accepted path in the cache (`hf_dflash.generation.kv_cache`).
"""

import contextlib
from dataclasses import dataclass

import torch
from torch.nn import functional as F
from transformers.generation import (
    EosTokenCriteria,
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    MaxLengthCriteria,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
    UnbatchedClassifierFreeGuidanceLogitsProcessor,
)
from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..cpu_ops import argmax
from ..sampling import exponential_race, rejection_sample
from .forward_costs import now
from .kv_cache import gather_path, holes_allowed, keep_verified
from .linear_attention import keep_states, linear_layers, new_cache, record_block, select_rows
from .proposer import Context
from .tree import DraftTree, greedy_paths, mask_one_token, tree_attention_mask

# Processors that ignore `input_ids`: applied once to all block positions instead of position by position.
POSITION_FREE_PROCESSORS = (
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


@contextlib.contextmanager
def as_plain_generate():
    """Around user code (logits processors, stopping criteria, streamers): plain `generate`'s no_grad instead of the
    loop's inference mode, so that the tensors they get, and what they keep or make of them, stay ordinary tensors."""
    with torch.inference_mode(False), torch.no_grad():  # inference_mode(False) alone would enable grad
        yield


class Decoder:
    """The target's state in one `dflash_decode` call on the general loop. `attention_mask`: the prompts' (None
    without padding); `positions` [rows, P]: theirs (`prompt_positions`). `trees`: the proposer drafts trees (their
    masks, on a CPU also for one-token steps: `mask_one_token`); `costs`: the "auto" policy's `LoopCosts`, fed by
    timing each verification (None: nothing is timed).

    The loop's interface, which `fixed_shape.FixedShapeDecoder` implements too: `prefill`, `prompt_context`, `room`,
    `verify_forward`, `accept`, `drop_finished`, `done`, `result`; and what a proposer reads of the committed tokens:
    `newest_tokens()`, `next_pos`, `rows`, `lengths`, `sequences`, `prompt_len`, `finished`."""

    def __init__(
        self, target, generation_config, logits_processor, stopping_criteria, streamer, input_ids, attention_mask,
        positions, *, trees: bool = False, costs=None,
    ):
        self.target = target
        self.config = generation_config
        self.processors = logits_processor or []
        self.attention_mask = attention_mask
        self.prompt_mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else \
            attention_mask.bool()
        self.prompt_positions = positions
        if input_ids.shape[0] > 1 and any(isinstance(p, UnbatchedClassifierFreeGuidanceLogitsProcessor)
                                          for p in self.processors):
            raise ValueError(
                "guidance_scale with a batch of several prompts: the guidance processor keeps one unconditional cache "
                "for the whole batch and extends it by one token per call, while DFlash rows commit different numbers "
                "of tokens per step. Generate one prompt at a time with guidance_scale, or without assistant_model."
            )
        self.stopping_criteria = stopping_criteria
        self.streamer = streamer
        self.costs = costs
        device = input_ids.device
        batch, self.prompt_len = input_ids.shape
        max_length = generation_config.max_length
        self.pad_token_id = pad_token_id(generation_config)
        self.sequences = torch.full((batch, max_length), self.pad_token_id, dtype=torch.long, device=device)
        self.sequences[:, : self.prompt_len] = input_ids
        self.lengths = torch.full((batch,), self.prompt_len, dtype=torch.long, device=device)
        self.rows = torch.arange(batch, device=device)
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)
        self.next_pos = None  # [rows]: position of each row's newest token, not yet in the cache
        self.target_mask = None  # [rows, cached]: which cache slots are real
        self.acceptance_lengths: list[list[int]] = [[] for _ in range(batch)]
        self.draft_lengths: list[list[int]] = [[] for _ in range(batch)]
        self.keep_scores = generation_config.return_dict_in_generate and generation_config.output_scores
        self.keep_logits = generation_config.return_dict_in_generate and generation_config.output_logits
        self.scores: list[list[torch.Tensor]] = [[] for _ in range(batch)]
        self.raw_logits: list[list[torch.Tensor]] = [[] for _ in range(batch)]
        self.eos_ids, self.stop_length = _simple_stops(stopping_criteria, device)
        if self.keep_scores or self.keep_logits:
            self.eos_ids = None  # scores are kept token by token
        self.cache = new_cache(target)  # sliding-window and linear-attention layers record what a rollback needs
        self.recurrent = bool(linear_layers(self.cache))  # a hybrid target: chains only
        self.model_type = target.config.get_text_config().model_type  # named in `keep_states`' error
        self.holes = False  # rejected slots stay in the cache, masked (`holes_allowed`, once the prefill filled it)
        self.trees = trees
        self.mask_one_token = trees and mask_one_token(device)

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

    # --- the loop's interface ------------------------------------------------------------------------------------
    def prefill(self, input_ids: torch.LongTensor):
        """The target reads the prompts and commits its first token; returns its output (the prompts' features)."""
        positions = self.prompt_positions
        out = self.target_forward(input_ids, self.attention_mask, positions, logits_to_keep=1)
        keep_states(self.cache, input_ids.shape[1])
        self.holes = holes_allowed(self.target, self.cache)
        tokens, kept, scores, _ = self.verify(out.logits[:, -1:], DraftTree.chain(input_ids[:, -1:]))  # no drafts
        self.commit(tokens, kept, scores)
        self.target_mask = self.prompt_mask
        self.next_pos = positions[:, -1] + 1  # as `generate` goes on: one past the last prompt slot's, mask or not
        return out

    def prompt_context(self, features: torch.Tensor) -> Context:
        """The drafter's first context: the prompts' features [rows, P, F], real where the mask says."""
        return Context(features, self.prompt_mask, self.prompt_positions)

    def room(self, block_size: int) -> int:
        """The most tokens a step may verify, at most `block_size`: no row drafts past `max_length` (a tree: never
        deeper)."""
        return min(block_size, int((self.config.max_length - self.lengths[self.rows]).max()))

    def accept(self, logits: torch.Tensor, tree: DraftTree, features: torch.Tensor) -> tuple:
        """After the verification of `tree` (`logits` [rows, T, vocab]): the target's tokens along each row's tree,
        committed with the stopping checks, recorded, and the accepted path kept in the cache. `features`
        [rows, T, F]: the drafter's features of the verified slots. Returns the drafter's next `Context`, the
        path [rows, L] and how many tokens each row kept [rows] (accepted drafts + the target's own)."""
        tokens, kept, scores, path = self.verify(logits, tree)
        self.record(self.commit(tokens, kept, scores), tree)
        return Context(*self.keep_path(features, path, kept)), path, kept

    def done(self) -> bool:
        """Whether every row has stopped (stopped rows leave the batch: `drop_finished`)."""
        return self.rows.numel() == 0

    def newest_tokens(self) -> torch.LongTensor:
        """Each live row's newest committed token [rows]: the root of its next tree."""
        return self.sequences[self.rows, self.lengths[self.rows] - 1]

    # --- verification -------------------------------------------------------------------------------------
    def verify_forward(self, tree: DraftTree):
        """The target's forward over `tree` (a node at depth d at the next position + d), timed for "auto"."""
        positions = self.next_pos[:, None] + tree.depths
        if self.recurrent and not tree.is_chain:  # the proposer drafts chains for them (`DraftSettings.chains_only`)
            raise RuntimeError("A tree reached the verification of a target with linear-attention layers.")
        record_block(self.cache, tree.tokens.shape[1])
        if self.costs is None:
            return self.target_forward(tree.tokens, self.verify_mask(tree), positions)
        began = self.clock()
        self.costs.step_begins(began)  # a step runs from one verification to the next
        out = self.target_forward(tree.tokens, self.verify_mask(tree), positions)
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
        if not self.config.do_sample and all(isinstance(p, POSITION_FREE_PROCESSORS) for p in self.processors):
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
            if tree.proposal is not None and j < tree.num_drafts:  # a sampled draft sits at this position
                ids, q = (t[live, j] for t in tree.proposal)
                tokens[live, j] = rejection_sample(scores[live, j], tree.tokens[live, j + 1], ids, q)
            else:
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

    def process(self, logits: torch.Tensor, drafts: torch.LongTensor, live: torch.LongTensor) -> torch.Tensor:
        """Logits processors for one block position of the rows `live`: row i sees its committed tokens plus
        drafts[i] (the drafts before this position)."""
        if not self.processors:
            return logits.to(dtype=torch.float32, copy=True)  # like `_sample`: processors run in float32
        with as_plain_generate():
            return self._process(logits.to(dtype=torch.float32, copy=True), drafts, live)

    def _process(self, scores: torch.Tensor, drafts: torch.LongTensor, live: torch.LongTensor) -> torch.Tensor:
        if all(isinstance(p, POSITION_FREE_PROCESSORS) for p in self.processors):
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
        # A greedy draft is a point-mass proposal: sampling the target at each position and accepting while the
        # sample equals the draft is exact speculative sampling.
        return pick(scores, self.config.do_sample)

    # --- commit -------------------------------------------------------------------------------------------
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
        self.finished[self.rows] |= stopped | (self.lengths[self.rows] >= self.stop_length)
        self._stream(committed)
        return committed

    def record(self, committed: torch.LongTensor, tree: DraftTree) -> None:
        """Per row: the tokens a step committed and the drafts it verified."""
        for r, n in zip(self.rows.tolist(), committed.tolist()):
            self.acceptance_lengths[r].append(n)
            self.draft_lengths[r].append(tree.num_drafts)

    def keep_path(self, features: torch.Tensor, path: torch.LongTensor, kept: torch.LongTensor) -> tuple:
        """After a verification: the cache keeps each row's accepted path (the first `kept` slots of `path`) and
        drops the rest. `features` [rows, T, F]: the drafter's features of the verified slots. Returns the path's
        features [rows, longest, F], which of them were kept [rows, longest] and their positions: the proposer's
        next context."""
        block_len = features.shape[1]
        longest = int(kept.max())
        path = path[:, :longest]
        gather_path(self.cache, path, block_len)  # the path's slots to the front of the block, in path order
        # linear-attention layers: each row's states after its path
        keep_states(self.cache, block_len, kept, self.model_type)
        keep = torch.arange(block_len, device=kept.device) < kept[:, None]  # [rows, T]: verified slots to keep
        self.target_mask = keep_verified(self.cache, self.target_mask, keep, shift=not self.holes)
        positions = self.next_pos[:, None] + torch.arange(longest, device=kept.device)
        self.next_pos = self.next_pos + kept
        features = features.gather(1, path[..., None].to(features.device).expand(-1, -1, features.shape[-1]))
        return features, keep[:, :longest], positions

    def _stopped(self, rows: torch.LongTensor, scores: torch.Tensor) -> torch.BoolTensor:
        """Stopping criteria for `rows` at their current lengths. Like the processors, the criteria see the whole
        batch (row i is batch row i, as in `_sample`), one group of equal lengths at a time."""
        with as_plain_generate():
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
        with as_plain_generate():
            chunk = torch.full((self.sequences.shape[0], width), self.pad_token_id, dtype=torch.long)
            for i, r in enumerate(self.rows.tolist()):
                end = int(self.lengths[r])
                chunk[r, : int(committed[i])] = self.sequences[r, end - int(committed[i]) : end].cpu()
            self.streamer.put(chunk)

    def drop_finished(self) -> torch.LongTensor | None:
        """Drop the rows that stopped; returns the indices of the rows kept (into the rows before), or None when
        every row goes on."""
        live = (~self.finished[self.rows]).nonzero().squeeze(1)
        if live.numel() == self.rows.numel():
            return None
        self.rows = self.rows[live]
        select_rows(self.cache, live)
        self.target_mask, self.next_pos = self.target_mask[live], self.next_pos[live]
        return live

    # --- result -------------------------------------------------------------------------------------------
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


def pick(scores: torch.Tensor, do_sample: bool) -> torch.LongTensor:
    """The target's token for each row of `scores` [..., vocab] (processed): the argmax, or a sample of their softmax
    (an exponential race: exact, like `multinomial`, without a host read)."""
    return exponential_race(F.softmax(scores, dim=-1)) if do_sample else argmax(scores)


def eos_token_ids(criteria, device) -> torch.LongTensor:
    """The EOS ids of the stopping criteria's `EosTokenCriteria` (none: an empty tensor)."""
    eos = [c.eos_token_id.reshape(-1).to(device) for c in criteria or [] if type(c) is EosTokenCriteria]
    return torch.cat(eos) if eos else torch.zeros(0, dtype=torch.long, device=device)


def pad_token_id(generation_config) -> int:
    """The id `generate` pads finished rows with: `pad_token_id`, else the first EOS id (transformers' fallback), else
    0."""
    pad = generation_config.pad_token_id
    if pad is None:
        eos = generation_config.eos_token_id
        pad = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    return 0 if pad is None or isinstance(pad, (list, tuple)) else int(pad)


def prompt_positions(prompt_mask: torch.BoolTensor, position_ids: torch.LongTensor | None = None) -> torch.LongTensor:
    """The prompts' position ids [rows, prompt_len] as plain `generate` gives them to the model: `position_ids` (what
    `generate` derived from the attention mask, or the user's), else derived from the mask as transformers derives
    them (the real tokens counted from 0, masked slots at 0). Each new token then sits one past the token before it,
    whatever the mask says: after a prompt whose last slot is masked, at 1, 2, ..."""
    if position_ids is not None and position_ids.dim() == 2:
        return position_ids.to(prompt_mask.device).expand(prompt_mask.shape)
    return (prompt_mask.long().cumsum(-1) - 1).masked_fill(~prompt_mask, 0)


def _simple_stops(criteria, device) -> tuple:
    """(EOS ids, max length) when the stopping criteria are only transformers' own max length and EOS criteria, so a
    step can commit all its tokens at once; (None, None) otherwise."""
    kinds = {type(c) for c in criteria or []}
    if not kinds <= {MaxLengthCriteria, EosTokenCriteria} or MaxLengthCriteria not in kinds:
        return None, None
    return eos_token_ids(criteria, device), min(c.max_length for c in criteria if type(c) is MaxLengthCriteria)
