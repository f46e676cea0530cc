"""Timing a `generate` call: its wall time, and where it went (`PhaseTimer`), without touching the loop."""

import contextlib
import time

import torch

from ..generation.decoder import Decoder

PHASES = ("target_prefill", "target_steps", "drafter_layers", "drafter_head", "drafts", "cache_keep")


def synchronize(device) -> None:
    """Wait for the work queued on `device` (a GPU's; a CPU has none)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device=None):
    """`fn()` and its wall time, the work it queued on `device` included (waited for before and after)."""
    synchronize(device)
    start = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - start


class PhaseTimer:
    """Where one `generate` call spends its time, from forward hooks (no change to the loop itself): inside the
    target's forward (the prefill, then one forward per step), inside the drafter's layers, inside the output head
    the drafts are scored with (`drafter_head`: the target's head, or the drafter's draft-vocabulary rows of it, called
    outside a target forward), and the rest of the time from the end of the drafter's layers to the next target
    forward (`drafts`: softmax / top-k, the prior or selector, building and sizing the tree, assembling the block),
    and after a verification the target cache keeping each row's accepted path (`cache_keep`: `Decoder.keep_path`,
    a hybrid target's per-row state rollback included). The rest of the call is loop overhead (processors, stopping
    criteria, the commit). Forwards run compiled (the fixed-shape path) are not split: their time counts as loop
    overhead, and its cache keeping too (compiled with them)."""

    def __init__(self, target, drafter=None):
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.target_forwards = 0
        self.paused_seconds = 0.0  # excluded from the call's time (the oracle recomputing a continuation)
        self._paused = False
        self._cuda = target.device.type == "cuda"
        self._start = {}
        self._drafted = None  # when the drafter's layers last finished
        self._head_seconds = 0.0  # the head's time since then
        self._handles, self._drafter = [], drafter
        self._own = getattr(drafter, "__dict__", {}).get("draft_head")  # an instance attribute there before, if any
        for module, name in [(target, "target")] + ([(drafter, "drafter"), (target.get_output_embeddings(), "head")]
                                                     if drafter is not None else []):
            self._hook(module, name)
        if hasattr(drafter, "draft_head"):  # the loop scores drafts with what it returns: hook that too
            def draft_head(output_head, original=drafter.draft_head):
                head = original(output_head)
                if head is not None and not any(m is head[0] for m, _ in self._handles):
                    self._hook(head[0], "head")
                return head

            drafter.draft_head = draft_head  # an instance attribute over the method, until `__exit__`
        self._keep_path = Decoder.keep_path
        if drafter is not None:
            def keep_path(decoder, *args, original=Decoder.keep_path, **kwargs):
                began = None if self._paused else self._now()
                try:
                    return original(decoder, *args, **kwargs)
                finally:
                    if began is not None:
                        self.seconds["cache_keep"] += self._now() - began

            Decoder.keep_path = keep_path  # for the call timed, until `__exit__`

    def _hook(self, module, name: str) -> None:
        if isinstance(module, torch.nn.Module):
            self._handles += [(module, module.register_forward_pre_hook(lambda *_: self._enter(name), prepend=True)),
                              (module, module.register_forward_hook(lambda *_: self._leave(name)))]

    @torch.compiler.disable  # Dynamo may trace a hook as a frame of its own (module calls are not inlined): no clock
    def _now(self) -> float:
        if self._cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    @contextlib.contextmanager
    def pause(self):
        """Time inside is no phase's and is reported as `paused_seconds`; the forwards inside are not counted."""
        began = self._now()
        self._paused = True
        try:
            yield
        finally:
            self._paused = False
            elapsed = self._now() - began
            self.paused_seconds += elapsed
            # intervals open across the pause resume after it
            self._start = {k: v + elapsed for k, v in self._start.items()}
            if self._drafted is not None:
                self._drafted += elapsed

    def _enter(self, what: str) -> None:
        # a compiled forward (the fixed-shape path) traces its hooks: no clock in its graph, its time stays "other"
        if self._paused or torch.compiler.is_compiling() or (what == "head" and "target" in self._start):
            return  # (the target's own head, inside its forward)
        now = self._now()
        if what == "target" and self._drafted is not None:
            self.seconds["drafts"] += now - self._drafted - self._head_seconds
            self._drafted = None
        self._start[what] = now

    def _leave(self, what: str) -> None:
        if self._paused or torch.compiler.is_compiling() or what not in self._start:
            return
        now = self._now()
        elapsed = now - self._start.pop(what)
        if what == "head":
            self.seconds["drafter_head"] += elapsed
            self._head_seconds += elapsed if self._drafted is not None else 0.0
            return
        if what == "drafter":
            self.seconds["drafter_layers"] += elapsed
            self._drafted, self._head_seconds = now, 0.0
            return
        self.seconds["target_prefill" if self.target_forwards == 0 else "target_steps"] += elapsed
        self.target_forwards += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for _, handle in self._handles:
            handle.remove()
        if self._own is not None:
            self._drafter.draft_head = self._own
        elif "draft_head" in getattr(self._drafter, "__dict__", ()):
            del self._drafter.draft_head
        Decoder.keep_path = self._keep_path


def profiled(fn, target, drafter=None, oracle=None):
    """`fn()`, its wall time and a `PhaseTimer` breakdown of it. With an `OracleDrafts`, its recomputations run in
    the timer's pauses and are left out of the time. On a GPU the timer waits for the device at every forward, which
    would slow the run it times: there the time is a run of its own without the timer, and the phases come from a
    second run, with the random state of the first (an oracle's run stays one: its pauses wait anyway)."""
    if target.device.type == "cuda" and oracle is None:
        with torch.random.fork_rng(devices=[target.device]):
            out, seconds = timed(fn, target.device)
        _, _, phases = _profiled(fn, target, drafter, None)
        return out, seconds, phases
    return _profiled(fn, target, drafter, oracle)


def _profiled(fn, target, drafter, oracle):
    with PhaseTimer(target, drafter) as timer:
        if oracle is not None:
            oracle.pause = timer.pause
        out, seconds = timed(fn, target.device)
    seconds -= timer.paused_seconds
    phases = dict(timer.seconds, other=seconds - sum(timer.seconds.values()), target_forwards=timer.target_forwards,
                  paused=timer.paused_seconds)
    return out, seconds, phases
