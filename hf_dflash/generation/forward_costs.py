"""What a verification costs on this hardware: the target's forward over k new tokens, t(k).

`measure_forward_costs` times the target's forward over k = 1, 2, 3, ..., 16 and 32 new tokens after a 128-token
cache, with a tree attention mask as the loop verifies trees, on the target's own device and dtype, at a batch size;
`load_forward_costs` keeps the measurement on disk per (model, config, device, dtype, batch, threads) and measures
only once. `LoopCosts` corrects that curve by what one `generate` call's own verifications cost, `StepCosts` by what
its whole steps cost on the fixed-shape path. The policy that reads them is `hf_dflash.generation.auto_size`.
"""

import hashlib
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..cpu_ops import packed_linears
from ..devices import cpu_description, execution_device, without_cudnn_attention
from ..paths import cache_dir
from .linear_attention import new_cache, record_block
from .tree import DraftTree, mask_one_token, tree_attention_mask

SIZES = (*range(1, 17), 32)
# On a CPU t(k) is not smooth in k: oneDNN picks kernels by shape, so a forward over 13-15 tokens may cost more than
# one over 16 (docs/design.md). Every size up to 16 is timed, and a size is kept where it departs from the curve
# through the powers of two by more than timing noise (`_significant_points`).
DEPARTURE = 0.10  # twice the spread of one size's median over 5 rounds on a shared 2-core CPU


@dataclass(frozen=True)
class ForwardCosts:
    """Seconds of one target forward over `tokens[i]` new tokens: `seconds[i]` (tokens increasing)."""

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]

    @property
    def max_tokens(self) -> int:
        return self.tokens[-1]

    def __call__(self, k: float) -> float:
        """t(k), linear between the measured points (and along the last segment beyond them)."""
        points = list(zip(self.tokens, self.seconds))
        if k <= points[0][0]:
            return points[0][1]
        for (k0, t0), (k1, t1) in zip(points, points[1:]):
            if k <= k1:
                return t0 + (t1 - t0) * (k - k0) / (k1 - k0)
        (k0, t0), (k1, t1) = points[-2], points[-1]
        return t1 + (t1 - t0) * (k - k1) / (k1 - k0)


class LoopCosts:
    """t(k) and the rest of a step as one `generate` call sees them: the timed `ForwardCosts`, corrected by the call's
    own verifications.

    The curve is timed once, after a 128-token cache, with nothing between its forwards. In the loop a verification runs
    at the call's own context, after the drafter's forward, and costs more, the more the larger the tree
    (docs/design.md), so "auto" would choose by costs that are not the loop's. Each verification's excess over the
    curve, e = seconds - t_curve(k), is fitted as a + b (k - 1) by least squares over the call's steps, both shrunk
    toward 0 as if `prior_steps` steps had matched the curve (a one-token step costs what the curve says until the
    steps say otherwise), each e clipped to a quarter of t_curve(k) (one slow step on a shared machine must not
    steer the fit). `overhead`: the rest of a step (the drafter, its head, the tree, the bookkeeping; 0 before the
    first step), smoothed."""

    def __init__(self, curve: ForwardCosts, prior_steps: float = 8.0):
        self.curve = curve
        self.prior_steps = prior_steps
        self.sums = [0.0] * 5  # over the steps: 1, x, x^2, e, x e  (x = k - 1)
        self.excess = (0.0, 0.0)  # the fitted a, b
        self.overhead = 0.0
        self._began = None  # when the step being timed began
        self._verified = None  # (tokens, seconds) of its verification

    def __call__(self, k: float) -> float:
        a, b = self.excess
        return self.curve(k) + a + b * (k - 1)

    def step_begins(self, time: float) -> None:
        """A step begins at `time` (seconds, as `verified`'s): the one before it, if timed, ended."""
        began, self._began = self._began, time
        if self._verified is None:
            return
        (tokens, verify), self._verified = self._verified, None
        rest = time - began - verify
        self.overhead = rest if self.sums[0] == 0 else 0.8 * self.overhead + 0.2 * rest
        limit = self.curve(tokens) / 4
        e, x = min(max(verify - self.curve(tokens), -limit), limit), tokens - 1
        for i, term in enumerate((1.0, x, x * x, e, x * e)):
            self.sums[i] += term
        n, sx, sxx, se, sxe = self.sums
        prior = self.prior_steps
        # ridge normal equations; b's prior weighs a change of b as one of a spread over 4 tokens
        m00, m01, m11 = n + prior, sx, sxx + 16 * prior
        det = m00 * m11 - m01 * m01
        self.excess = ((m11 * se - m01 * sxe) / det, (m00 * sxe - m01 * se) / det)

    def verified(self, tokens: int, seconds: float) -> None:
        """This step's verification, over `tokens` tokens, took `seconds`."""
        self._verified = (tokens, seconds)


class StepCosts:
    """What a whole step of the fixed-shape path costs at each verification width, as one `generate` call's steps
    measure it.

    That path reads the device once per step, when "auto" reads the nodes' scores, so the time from one read to the
    next is one step: the verification of the width chosen at the first, its bookkeeping and the next draft, all as
    compiled. A width's cost is the median of its steps; a width not measured yet costs the timed curve's t(k)
    scaled by the measured widths' cost over the curve's (compiled forwards cost less than the eager ones the curve
    times, much less on a GPU, and a step adds the drafter's forward). Steps that compile are left out: the first
    two of a call (the drafter's first compiled forward is the second draft) and the first at each width."""

    overhead = 0.0  # the rest of a step is in its cost

    def __init__(self, curve: ForwardCosts):
        self.curve = curve
        self.seconds = {}  # width -> its timed steps' seconds
        self._steps = 0
        self._last = None  # (width, time, timed) of the step under way

    def __call__(self, k: float) -> float:
        if self.seconds.get(k):
            return statistics.median(self.seconds[k])
        measured = [w for w, seconds in self.seconds.items() if seconds]
        if not measured:
            return self.curve(k)
        return self.curve(k) * sum(self(w) for w in measured) / sum(self.curve(w) for w in measured)

    def step_begins(self, width: int, time: float) -> None:
        """A step verifying `width` tokens begins at `time` (seconds): the one before it ended."""
        last = self._last
        self._steps += 1
        self._last = (width, time, self._steps > 2 and width in self.seconds)
        self.seconds.setdefault(width, [])
        if last is not None and last[2]:
            self.seconds[last[0]].append(time - last[1])


@torch.no_grad()
def measure_forward_costs(
    target, batch_size: int = 1, sizes=SIZES, context: int = 128, repeats: int = 5
) -> ForwardCosts:
    """Time the target's forward over k new tokens (k in `sizes`) after a `context`-token cache, as the decoding loop
    verifies a tree of k - 1 drafts (a tree attention mask, hidden states, logits at every position), on the
    target's device and dtype (`time_forwards`); the sizes kept are `_significant_points`. Random token ids."""
    # the first "auto" generate at a new model / device / dtype / batch size waits for this: say why
    timed = time_forwards(
        target, sizes, context, batch_size=batch_size, repeats=repeats, tree=True,
        progress=f"hf-dflash: timing the target's forwards for draft_tree_size='auto' (batch {batch_size}; once, "
        "then cached)",
    )
    seconds = _significant_points(timed)
    return ForwardCosts(tuple(sorted(seconds)), tuple(seconds[k] for k in sorted(seconds)))


def _significant_points(seconds: dict, departure: float = DEPARTURE) -> dict:
    """The measured points {k: t(k)} worth interpolating between: the powers of two (and the ends), plus any other
    size whose time departs from the curve through those by more than `departure` (relative). Near-equal times of
    neighbouring sizes differ by noise, and noise in a flat curve would steer the chooser (docs/design.md)."""
    sizes = sorted(seconds)
    base = [k for k in sizes if k & (k - 1) == 0 or k in (sizes[0], sizes[-1])]
    smooth = ForwardCosts(tuple(base), tuple(seconds[k] for k in base))
    return {k: t for k, t in seconds.items() if k in base or abs(t - smooth(k)) > departure * smooth(k)}


@torch.inference_mode()  # as the loop runs its forwards (`dflash_decode`)
def time_forwards(
    target, sizes, context: int, batch_size: int = 1, repeats: int = 10, tree: bool = False, progress: str | None = None
) -> dict:
    """{k: seconds} of the target's forward over k new tokens after a `context`-token cache, timed as the loop
    verifies: hidden states and logits at every position; a chain with the causal mask (no padding), a tree
    (`tree=True`) with a tree attention mask of k slots (`hf_dflash.generation.tree.tree_attention_mask`, whose cost
    depends on its size, not its shape; at k = 1 only where the loop's one-token steps carry one, `mask_one_token`).
    The sizes take turns, `repeats` rounds after one warm-up round, so a machine's drift (another job, clocks)
    reaches all of them alike; the median of each. On the target's device and dtype; random
    token ids. `progress`: a progress bar's description (None: no bar)."""
    sizes = sorted(set(sizes))
    device = execution_device(target)
    generator = torch.Generator().manual_seed(0)
    vocab = target.config.get_text_config().vocab_size
    ids = torch.randint(vocab, (batch_size, context + max(sizes)), generator=generator).to(device)
    # as the loop runs: no cuDNN attention (a graph per new key length otherwise), a bfloat16 target's linears packed
    with without_cudnn_attention(device), packed_linears(target, memory_bound=True):
        cache = new_cache(target)  # sliding-window and linear-attention layers must be able to drop the timed tokens
        target(input_ids=ids[:, :context], cache=cache, use_cache=True, logits_to_keep=1)
        valid = torch.ones(batch_size, context, dtype=torch.bool, device=device)
        inputs = {}
        for k in sizes:
            chain = DraftTree.chain(ids[:, context : context + k])
            masked = tree and (k > 1 or mask_one_token(device))  # as the loop verifies (`Decoder.verify_mask`)
            mask = tree_attention_mask(chain, valid, cache, target.dtype) if masked else None
            positions = torch.arange(context, context + k, device=device).expand(batch_size, -1)
            inputs[k] = dict(input_ids=chain.tokens, attention_mask=mask, position_ids=positions)
        runs = {k: [] for k in sizes}
        for _ in tqdm(range(repeats + 1), desc=progress, unit="round", disable=progress is None):
            for k in sizes:
                record_block(cache, k)  # a hybrid target's verification records its states, as in the loop
                began = now(device)
                target(**inputs[k], cache=cache, use_cache=True, output_hidden_states=True)
                runs[k].append(now(device) - began)
                cache.crop(-k)
    return {k: statistics.median(times[1:]) for k, times in runs.items()}


def load_forward_costs(target, batch_size: int = 1, refresh: bool = False, **measure_kwargs) -> ForwardCosts:
    """The target's forward costs on this machine: read from the cache folder (`forward_costs_dir()`), else measured
    with `measure_forward_costs` and written there. `refresh=True` measures again."""
    key = _cache_key(target, batch_size, measure_kwargs)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = forward_costs_dir() / f"forward_costs-{digest}.json"
    if path.is_file() and not refresh:
        saved = json.loads(path.read_text())
        return ForwardCosts(tuple(saved["tokens"]), tuple(saved["seconds"]))
    costs = measure_forward_costs(target, batch_size=batch_size, **measure_kwargs)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")  # another process may be writing the same file
    temporary.write_text(json.dumps({"key": key, "tokens": costs.tokens, "seconds": costs.seconds}, indent=1))
    temporary.replace(path)
    return costs


def forward_costs_dir() -> Path:
    """Where measured forward costs are kept: `forward_costs/` in hf_dflash's cache folder (`paths.cache_dir`)."""
    return cache_dir("forward_costs")


def _cache_key(target, batch_size: int, measure_kwargs: dict) -> dict:
    config = target.config
    device = execution_device(target)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_description()
    return {
        "model": str(getattr(config, "name_or_path", "") or type(target).__name__),
        "config": hashlib.sha256(config.to_json_string().encode()).hexdigest()[:16],
        "attention": config.get_text_config()._attn_implementation,
        "device": f"{device} ({name})",
        "dtype": str(target.dtype),
        "batch_size": batch_size,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        # what `measure_forward_costs` times: a change of method must not read old files
        "method": "tree mask, significant sizes, inference mode, one-token mask on a CPU, packed linears",
        **{k: list(v) if isinstance(v, tuple) else v for k, v in measure_kwargs.items()},
    }


def now(device) -> float:
    """time.perf_counter() once the device has finished its queued work."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
