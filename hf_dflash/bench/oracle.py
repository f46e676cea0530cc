"""The oracle benchmark: how close the decoding loop gets to what the hardware allows.

With always-right drafts a step commits a whole block, so the best speedup over plain `generate` a block of B tokens
can give is the ceiling B x t(1) / t(B), t(k) being the target's forward over k new tokens. The loop reaches less: the
drafter's forward, the verification's bookkeeping, the cache updates. The oracle runs the real loop with the real
drafter: `OracleProposer` replaces its drafts with the target's own greedy continuation (`OracleDrafts`, precomputed
by the plain `generate` run the benchmark makes anyway), so the measured speedup over the ceiling is the loop's
efficiency. After each step `OracleDecoder` also times t(1) and t(k) of the sizes the ceiling needs, there, on the
step's own cache: a machine's drift (clocks, other jobs) then reaches the loop and its ceiling alike (`ceilings`).
On the fixed-shape path (`cache_implementation="static"`) the same `OracleProposer` drafts (one proposer serves both
paths) and `FixedShapeOracleDecoder` times the path's own (compiled) forwards.
`hf_dflash.bench.benchmark(..., oracle=True)` measures both in the same run.

In bfloat16 a verification over B tokens may round a near-tie differently from one-token forwards, so the committed
text can leave the precomputed continuation; the oracle then recomputes the continuation from the committed text.
That, the oracle's own bookkeeping (placing its drafts, counting rejected ones) and its timed forwards run inside
pauses of the benchmark's timer, so their time is not the loop's.
"""

import contextlib
import functools

import torch

from ..generation.decoder import Decoder, as_plain_generate
from ..generation.fixed_shape import FixedShapeDecoder
from ..generation.forward_costs import now
from ..generation.kv_cache import set_write_index
from ..generation.linear_attention import record_block
from ..generation.loop import DFlashCall, original_generate
from ..generation.proposer import DFlashProposer
from ..generation.tree import DraftTree, tree_attention_mask


# --- always-right drafts --------------------------------------------------------------------------------------------
class OracleDrafts:
    """The target's greedy continuation of each batch row, and the bookkeeping of one oracle `generate` call.

    `continuation` [batch, W]: each row's plain greedy new tokens (W = max_new_tokens; pad after a stop);
    `prompt_mask` [batch, prompt_len] (None: no padding); `stop_ids`: the stop tokens (a row's continuation ends
    at the first, and tokens past it are no drafts). `pause`: a context manager factory the caller's timer
    provides; the oracle's own work (`untimed`: placing drafts, counting rejected ones, recomputing a continuation)
    runs inside it. Counted: `wrong_steps` (verifications that rejected a draft the oracle placed), `resyncs` (the
    generated length at each recomputation after the committed text left the continuation), `resync_seconds` (all
    recomputations, extensions included), and `untimed_seconds` (all of the oracle's work). `steps`: per step after
    the prefill, what the ceiling needs (`OracleDecoder.time_ceiling`).
    """

    def __init__(self, continuation: torch.LongTensor, prompt_mask=None, pad_token_id: int = 0, stop_ids=(),
                 pause=None):
        self.continuation = continuation.clone()
        self.prompt_mask = prompt_mask
        self.pad_token_id = pad_token_id
        self.stop_ids = torch.tensor(list(stop_ids), dtype=torch.long, device=continuation.device)
        self.known = torch.full_like(self.continuation[:, 0], continuation.shape[1])  # [batch] tokens computed
        self.ends = self._ends(self.continuation)  # [batch]
        self.placed = None  # [rows]: the oracle's drafts in this step (fewer past a row's stop)
        self.pause = pause or contextlib.nullcontext
        self.wrong_steps = 0
        self.resyncs: list[int] = []
        self.resync_seconds = 0.0
        self.untimed_seconds = 0.0
        self.steps: list[dict] = []
        self.step = None  # what the ceiling of the step being made needs (`OracleDecoder.record`)
        self.full_step = None  # tokens a full step verifies (`OracleProposer`; None: what each step verified)

    @classmethod
    def from_plain(cls, sequences, prompt_len: int, max_new_tokens: int, prompt_mask=None, pad_token_id: int = 0,
                   stop_ids=()):
        """From plain `generate`'s output sequences [batch, prompt_len + n] (n <= max_new_tokens: every row stopped)."""
        new = sequences[:, prompt_len : prompt_len + max_new_tokens]
        filler = new.new_full((new.shape[0], max_new_tokens - new.shape[1]), pad_token_id)
        return cls(torch.cat([new, filler], dim=1), prompt_mask, pad_token_id, stop_ids)

    def _ends(self, continuation: torch.LongTensor) -> torch.LongTensor:
        """Each row's continuation length up to and including its first stop token in `continuation` [rows, n]
        (W without one: the rest may be unknown yet) [rows]."""
        width = self.continuation.shape[1]
        stops = torch.isin(continuation, self.stop_ids)
        first = torch.where(stops, torch.arange(continuation.shape[1], device=stops.device), width).min(-1).values
        return torch.clamp(first + 1, max=width)

    @contextlib.contextmanager
    def untimed(self, device):
        """The oracle's own work: not the loop's, so inside a pause of the caller's timer (counted apart)."""
        with self.pause():
            began = now(device)
            try:
                yield
            finally:
                self.untimed_seconds += now(device) - began

    def drafts(self, decoder: Decoder, count: int) -> torch.LongTensor:
        """The next `count` tokens of each live row's greedy continuation [rows, count] (pad past its end),
        recomputed first for rows whose committed text left it."""
        with self.untimed(decoder.target.device):
            return self._drafts(decoder, count)

    def _drafts(self, decoder: Decoder, count: int) -> torch.LongTensor:
        rows, start = decoder.rows, decoder.prompt_len
        width = self.continuation.shape[1]
        generated = decoder.lengths[rows] - start  # [rows]
        known = self.known[rows]
        committed = decoder.sequences[rows, start : start + width]  # [rows, W]
        written = torch.arange(width, device=committed.device) < torch.minimum(generated, known)[:, None]
        left = ((committed != self.continuation[rows]) & written).any(-1)  # [rows]
        short = known < torch.minimum(generated + count, self.ends[rows])  # a recomputed continuation ran out
        redo = left | short
        for r, diverged in zip(rows[redo].tolist(), left[redo].tolist()):
            self._resync(decoder, r, 2 * count, diverged)
        beyond = self.continuation.new_full((rows.numel(), count), self.pad_token_id)  # drafts past the end
        padded = torch.cat([self.continuation[rows], beyond], dim=1)  # [rows, W + count]
        index = generated[:, None] + torch.arange(count, device=generated.device)  # [rows, count]
        self.placed = (self.ends[rows] - generated).clamp(0, count)
        return padded.gather(1, index)

    def _resync(self, decoder: Decoder, row: int, horizon: int, diverged: bool) -> None:
        """Batch row `row`'s continuation recomputed from its committed text by plain greedy `generate` (the same
        call that precomputed it), `horizon` tokens ahead: only so far, since where a bfloat16 verification rounds
        near-ties differently (a random target's flat logits) the text may leave it again at every step; extended the
        same way when the drafts reach its end. Called inside `untimed`; `diverged`: counted as a resync."""
        target, start = decoder.target, decoder.prompt_len
        length = int(decoder.lengths[row])
        began = now(target.device)
        ids = decoder.sequences[row : row + 1, :length]
        mask = torch.ones_like(ids)
        if self.prompt_mask is not None:
            mask[:, :start] = self.prompt_mask[row : row + 1]
        width = self.continuation.shape[1]
        out = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=min(horizon, width - (length - start)),
                              do_sample=False, pad_token_id=self.pad_token_id)
        new = out[0, start : start + width]
        self.continuation[row] = self.pad_token_id
        self.continuation[row, : new.shape[0]] = new
        self.known[row] = new.shape[0]
        self.ends[row] = self._ends(new[None])[0]
        self.resync_seconds += now(target.device) - began
        if diverged:
            self.resyncs.append(length - start)

    def count_wrong(self, decoder: Decoder, tree, kept: torch.LongTensor) -> None:
        """After a verification: count the rows that rejected one of the oracle's drafts. The oracle's drafts are the
        tree's leading slots that form a chain (slot s at depth s: all of a chain; the always-sure first path of a
        tree, see `OracleProposer.draft_candidates`) up to the row's stop token; a row rejected one if it kept
        fewer than them, unless `max_length` cut it."""
        if tree.num_drafts == 0:  # the prefill, or a step without drafts: nothing placed
            return
        with self.untimed(decoder.target.device):
            self._count_wrong(decoder, tree, kept)

    def _count_wrong(self, decoder: Decoder, tree, kept: torch.LongTensor) -> None:
        slots = torch.arange(1, tree.tokens.shape[1], device=tree.depths.device)
        on_chain = (tree.depths[:, 1:] == slots).long().cumprod(-1).sum(-1)  # [rows]
        placed = torch.minimum(on_chain.to(kept.device), self.placed.to(kept.device))
        cut = decoder.lengths[decoder.rows] + kept >= decoder.config.max_length
        self.wrong_steps += int(((kept - 1 < placed) & ~cut).sum())

    def time_ceiling(self, forward) -> None:
        """Time the ceiling's forwards after a step (`step`, set by the decoder): `forward(k)` runs one over k tokens
        and returns its seconds, for t(1), t(the tokens the step verified) and t(a full step: the block, a tree's
        nodes + 1; "auto": what it verified), one each, in turns, in reverse order every other step. Kept in `steps`
        with the step's rows, tokens verified and tokens committed (all rows)."""
        full = self.full_step or self.step["verified"]
        sizes = sorted({1, self.step["verified"], full}, reverse=len(self.steps) % 2 == 1)
        self.steps.append({**self.step, "full": full, "seconds": {str(k): forward(k) for k in sizes}})

    def record(self) -> dict:
        return {"wrong_steps": self.wrong_steps, "resyncs": list(self.resyncs), "resync_seconds": self.resync_seconds,
                "untimed_seconds": self.untimed_seconds, "steps": list(self.steps)}


class OracleProposer(DFlashProposer):
    """A `DFlashProposer` whose drafts are the target's own greedy continuation, placed after the real drafter ran (its
    cost stays in the loop), on either path. A drafter's bigram prior or DFlash2 selector is left out: either would
    rerank the right drafts below wrong ones.
    `full_step` tells the oracle what a full step verifies (None with "auto": what each step verified)."""

    def __init__(self, *args, oracle: OracleDrafts, **kwargs):
        super().__init__(*args, **kwargs)
        self.oracle = oracle
        self.prior, self.selector = None, False
        self.temperature = None  # its drafts are point masses (the greedy continuation), never sampled
        oracle.full_step = None if self.auto is not None else self.tree_size + 1 if self.tree_size else self.block_size

    def draft_chain(self, decoder, verify_len):
        drafts, confidence = super().draft_chain(decoder, verify_len)
        right = self.oracle.drafts(decoder, verify_len - 1).to(drafts.device)
        # sure of every draft: a confidence threshold never skips a step
        return right, None if confidence is None else torch.ones_like(confidence)

    def draft_candidates(self, decoder, verify_len, k):
        """The drafter's candidates with the right token at rank 0 of every position, probability 1 (swapped with
        its rank if the drafter had it: siblings must stay distinct). The best-first tree then starts with the whole
        right chain, as deep as its budget allows, and spends the rest on the drafter's runners-up: the oracle
        measures what verifying them costs."""
        ids, probs = super().draft_candidates(decoder, verify_len, k)  # [rows, D, k]
        right = self.oracle.drafts(decoder, verify_len - 1).to(ids.device)  # [rows, D]
        with self.oracle.untimed(ids.device):
            ids, probs = ids.clone(), probs.clone()
            rank = (ids == right[..., None]).long().argmax(-1, keepdim=True)  # 0 where the drafter lacks it
            ids.scatter_(-1, rank, ids[..., :1].clone())  # the old first candidate moves to the right token's rank
            ids[..., 0] = right
            probs[..., 0] = 1.0
        return ids, probs


class OracleDecoder(Decoder):
    """A `Decoder` that counts the oracle's rejected drafts and, after each step, times the forwards of the ceiling
    on the step's own cache (`time_ceiling`); the oracle's own work is left out of the time "auto" reads."""

    def __init__(self, *args, oracle: OracleDrafts, **kwargs):
        super().__init__(*args, **kwargs)
        self.oracle = oracle

    def clock(self) -> float:
        return super().clock() - self.oracle.untimed_seconds  # the oracle's own work is not the loop's

    def verify(self, logits, tree):
        tokens, kept, scores, path = super().verify(logits, tree)
        self.oracle.count_wrong(self, tree, kept)
        return tokens, kept, scores, path

    def record(self, committed, tree):
        super().record(committed, tree)
        self.oracle.step = {"rows": int(self.rows.numel()), "verified": tree.tokens.shape[1],
                            "committed": int(committed.sum())}

    def keep_path(self, features, path, kept):
        context = super().keep_path(features, path, kept)
        with self.oracle.untimed(self.target.device):
            self.time_ceiling()
        return context

    def time_ceiling(self) -> None:
        """The ceiling's forwards (`OracleDrafts.time_ceiling`) as the loop verifies (a tree with a tree mask) on the
        step's own cache, then dropped from it; t(1) as plain `generate` decodes (no_grad)."""
        newest = self.newest_tokens()  # [rows]: any token costs the same

        def forward(k: int) -> float:
            chain = DraftTree.chain(newest[:, None].expand(-1, k))
            if self.trees and k > 1:
                mask = tree_attention_mask(chain, self.target_mask, self.cache, self.target.dtype)
            else:
                mask = self.verify_mask(chain)
            positions = self.next_pos[:, None] + torch.arange(k, device=self.next_pos.device)
            record_block(self.cache, k)  # a hybrid target's states, recorded as the loop records them, so `crop` works
            # t(1) under no_grad, as plain decodes; a hybrid target's states, made in the loop's inference mode,
            # can only be updated inside it
            plain = k == 1 and not self.recurrent
            with as_plain_generate() if plain else contextlib.nullcontext():
                began = now(self.target.device)
                self.target_forward(chain.tokens, mask, positions)
                seconds = now(self.target.device) - began
            self.cache.crop(-k)
            return seconds

        self.oracle.time_ceiling(forward)


class FixedShapeOracleDecoder(FixedShapeDecoder):
    """`OracleDecoder` on the fixed-shape path: it counts the oracle's rejected drafts and, after each step, times
    the ceiling's forwards as the path runs them (compiled, over its preallocated cache)."""

    def __init__(self, *args, oracle: OracleDrafts, **kwargs):
        super().__init__(*args, **kwargs)
        self.oracle = oracle
        self.warm = set()  # forward widths run once: a width's first compiled call compiles, so it is not timed

    def verify(self, logits, tree):
        tokens, kept, path = super().verify(logits, tree)
        with self.oracle.untimed(self.target.device):  # the oracle's drafts: the chain, or the tree's first path
            placed = self.oracle.placed.to(kept.device)
            cut = self.lengths + kept >= self.max_length
            self.oracle.wrong_steps += int(((kept - 1 < placed) & ~cut & ~self.finished).sum())
        return tokens, kept, path

    def accept(self, logits, tree, features):
        before = self.lengths
        accepted = super().accept(logits, tree, features)
        with self.oracle.untimed(self.target.device):
            self.oracle.step = {"rows": len(before), "verified": tree.tokens.shape[1],
                                "committed": int((self.lengths - before).sum())}
            self.time_ceiling()
        return accepted

    def time_ceiling(self) -> None:
        """The ceiling's forwards (`OracleDrafts.time_ceiling`) with the path's own (compiled) forward, written at the
        slots the next verification writes over first, so the cache stays as it was."""
        newest = self.newest_tokens()[:, None]  # [rows, 1]: any token costs the same

        def forward(k: int) -> float:
            tokens = newest.repeat(1, k)  # [rows, k], laid out as a verified block (a compiled graph guards strides)
            slots = self.write_index[:, :k]  # the loop's own index tensor: the compiled graph guards its kind
            slots.copy_(self.step_slots(k))
            set_write_index(self.cache, slots)  # `verify_forward` sets its own again
            if k not in self.warm:
                self.forward_at(tokens, slots)
                self.warm.add(k)
            began = now(self.target.device)
            self.forward_at(tokens, slots)
            return now(self.target.device) - began

        self.oracle.time_ceiling(forward)


def oracle_generate(target, drafter, oracle: OracleDrafts, inputs: dict, *, draft_tree_size=None,
                    assistant_confidence_threshold=None, **kwargs):
    """`target.generate(**inputs, assistant_model=drafter, ...)` with the oracle's drafts: the same call
    (`DFlashCall`; the fixed-shape path with `cache_implementation="static"`) run with the oracle's proposer, and
    the decoder of its path that times the ceiling."""

    decode = DFlashCall.custom_generate(
        drafter, functools.partial(OracleProposer, oracle=oracle),
        {"general": functools.partial(OracleDecoder, oracle=oracle),
         "fixed_shape": functools.partial(FixedShapeOracleDecoder, oracle=oracle)},
        draft_tree_size=draft_tree_size, assistant_confidence_threshold=assistant_confidence_threshold,
    )
    return original_generate(target, **inputs, custom_generate=decode, **kwargs)


# --- the ceiling --------------------------------------------------------------------------------------------------
def ceilings(steps: list[dict], block_size: int) -> tuple[float, float]:
    """Two ceilings of a run from its steps' timed forwards (`OracleDecoder.time_ceiling`; any number of `generate`
    calls' steps, pooled): the speedup over plain decoding with always-right drafts, that is plain decoding's seconds
    for the tokens (tokens per row x t(1)) over the steps' seconds, with each step's own t. First, every step
    commits its full step, min(block_size, verified) tokens a row: for a chain of B, B x t(1) / t(B). Second, each
    step as it was (its tokens verified and committed): a last step cut short by the token budget, or a near-tie's
    wrong draft in bfloat16, costs a forward and commits less, for the loop and its ceiling alike."""
    full = [(min(block_size, s["full"]) * s["seconds"]["1"], s["seconds"][str(s["full"])]) for s in steps]
    own = [(s["committed"] / s["rows"] * s["seconds"]["1"], s["seconds"][str(s["verified"])]) for s in steps]
    return tuple(sum(p for p, _ in pairs) / sum(t for _, t in pairs) for pairs in (full, own))
