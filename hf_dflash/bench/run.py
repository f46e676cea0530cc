"""Measuring a drafter: acceptance length and speedup over plain generate.

`benchmark(...)` runs plain `target.generate` and DFlash (`assistant_model=drafter`) interleaved prompt by prompt on
named prompt sets, with baselines (prompt-lookup decoding, transformers' native `speculation_type="dflash"` path, the
reference `dflash` package's loop) measured in the same run; `report.write_outputs(...)` writes the JSON, a markdown
table and a PNG plot. `hf-dflash bench` is the command-line front end. `draft_tree_sizes` measures draft trees next to
the chain; `oracle=True` measures the loop against its ceiling with always-right drafts (`oracle`).
"""

import copy
import datetime
import functools
import importlib.util
import os
import platform
import statistics
import tempfile
from pathlib import Path

import torch
from transformers.cache_utils import StaticCache

from ..cpu_ops import packed_linears
from ..devices import cpu_description
from ..engines import vllm_python
from ..generation.kv_cache import cache_capacity
from ..prompts import Prompt, left_padded_batch, response_tokens
from ..prompts import stop_ids as target_stop_ids
from .oracle import OracleDrafts, ceilings, oracle_generate
from .report import to_markdown
from .timing import PHASES, profiled, timed
from .vllm import VLLMBaselines

BASELINES = ("plain", "static", "packed", "prompt_lookup", "native", "reference", "vllm")
DEFAULT_BASELINES = BASELINES[:-1]  # all but vLLM, which needs a virtualenv of its own
BEST_PLAIN = ("static", "packed")  # plain `generate` at its best: every batch size and mode, every run
PROMPT_LOOKUP_TOKENS = 10


# --- the measurement ----------------------------------------------------------------------------------------------
def _new_tokens(sequences: torch.Tensor, prompt_len: int, stop_ids: list[int], max_new_tokens: int) -> list[list[int]]:
    """Each row's generated tokens, up to and including the first stop token (padding after it dropped)."""
    return [response_tokens(row, stop_ids, max_new_tokens) for row in sequences[:, prompt_len:].tolist()]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (None: equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _histogram(lengths: list[int], block_size: int) -> list[int]:
    """counts[k] = target forwards that committed k tokens (k = 0 .. block_size)."""
    counts = [0] * (max([block_size, *lengths]) + 1)
    for n in lengths:
        counts[n] += 1
    return counts


def machine_info(threads: int) -> dict:
    """Where a measurement ran: the CPU (its vector extensions), the GPU, versions, threads and the date."""
    import transformers

    return {
        "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
        "cpu": cpu_description(),
        "python": platform.python_version(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
        "transformers": transformers.__version__, "torch_threads": torch.get_num_threads(), "threads": threads,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _reference_drafter(drafter, folder: Path, dtype):
    """The reference `dflash` package's DFlashDraftModel loaded from `drafter` saved in `folder`, or a note."""
    if importlib.util.find_spec("dflash") is None:
        return None, "skipped: the reference package is not installed (pip install --no-deps dflash==0.1.0)"
    from dflash.model import DFlashDraftModel as ReferenceDraftModel

    drafter.save_pretrained(folder)
    return ReferenceDraftModel.from_pretrained(folder, dtype=dtype).to(drafter.device).eval(), None


@torch.no_grad()
def benchmark(
    target,
    drafter,
    tokenizer,
    prompt_sets: dict[str, list[Prompt]],
    *,
    block_sizes=None,
    batch_sizes=(1,),
    modes=("greedy",),
    temperature: float = 0.7,
    max_new_tokens: int = 128,
    baselines=DEFAULT_BASELINES,
    threads: int = 1,
    warmup: int = 1,
    seed: int = 0,
    drafter_note: str | None = None,
    progress: bool = True,
    assistant_confidence_threshold: float | None = None,
    draft_tree_sizes=None,
    oracle: bool = False,
    cache_implementation: str | None = None,
    compile_config=None,
    vllm: str | None = None,
) -> dict:
    """Plain `generate` vs DFlash, interleaved prompt by prompt, for every prompt set x batch size x mode x block
    size (docs/benchmark.md has what each field means). Per prompt batch: new tokens, seconds, acceptance lengths and
    their histogram; per run: tau, tokens/s, speedup = plain seconds / DFlash seconds, and in greedy mode whether the
    output is plain's token for token. Baselines (batch 1, greedy; "static": every batch size and mode) run in the
    same interleaved loop; `warmup` prompt batches per run are generated untimed first, and a call of a new shape
    once untimed where it compiles. Timed calls wait for the device before and after.

    `prompt_sets` values: chat `Prompt`s (through `tokenizer`'s chat template) or token id lists (left-padded with the
    target's pad token). `draft_tree_sizes`: one run each (0: the chain, N: a tree, "auto"; default: the drafter's),
    measured in turns against one plain call per batch. `oracle=True` (greedy): the drafts are the target's own
    continuation (`hf_dflash.bench.oracle`), and each run reports the loop against its ceiling. "static": plain
    `generate` with a static cache as long as the fixed-shape path's, compiled with `compile_config` (None:
    transformers' default; `hf_dflash.compile_everywhere()` on a CPU); `cache_implementation="static"` runs DFlash
    on the fixed-shape path. "vllm" (greedy): vLLM plain and with the drafter (`bench.vllm.VLLMBaselines`), from the
    virtualenv whose python `vllm` (else `$HF_DFLASH_VLLM_PYTHON`) names."""
    from tqdm.auto import tqdm

    block_sizes = list(block_sizes or [drafter.block_size])
    tree_sizes = list(draft_tree_sizes) if draft_tree_sizes else [drafter.draft_tree_size or 0]
    _check_settings(baselines, modes, oracle, tree_sizes)
    torch.set_num_threads(threads)
    notes = [drafter_note] if drafter_note else []
    if any(b > drafter.block_size for b in block_sizes):
        notes.append(
            f"block sizes above the drafter's configured block_size ({drafter.block_size}) draft positions it was "
            "trained on only if its training block was larger"
        )
    settings = dict(max_new_tokens=max_new_tokens, temperature=temperature, baselines=baselines, warmup=warmup,
                    seed=seed, assistant_confidence_threshold=assistant_confidence_threshold, tree_sizes=tree_sizes,
                    oracle=oracle, cache_implementation=cache_implementation, compile_config=compile_config,
                    vllm=vllm_python(vllm) if "vllm" in baselines else None, threads=threads)
    runs_spec = [(s, b, m, k) for s in prompt_sets for b in batch_sizes for m in modes for k in block_sizes]
    bar = tqdm(total=sum(-(-len(prompt_sets[s]) // b) for s, b, *_ in runs_spec), desc="bench", disable=not progress)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        runner = _Runner(target, _drafters(drafter, block_sizes), tokenizer, Path(tmp), **settings)
        try:
            for set_name, batch_size, mode, block in runs_spec:
                runs += runner.runs(set_name, prompt_sets[set_name], batch_size, mode, block, bar)
        finally:
            runner.vllm.close()
    bar.close()
    results = {
        "machine": machine_info(threads),
        "settings": {
            "max_new_tokens": max_new_tokens, "temperature": temperature, "threads": threads, "warmup": warmup,
            "seed": seed, "batch_sizes": list(batch_sizes), "modes": list(modes), "block_sizes": block_sizes,
            "draft_tree_sizes": tree_sizes, "oracle": oracle, "cache_implementation": cache_implementation,
            "compile_config": None if compile_config is None else compile_config.to_dict(),
            "baselines": list(baselines), "prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS,
            "assistant_confidence_threshold": drafter.assistant_confidence_threshold
            if assistant_confidence_threshold is None else assistant_confidence_threshold,
            "num_prompts": {name: len(p) for name, p in prompt_sets.items()}, "target_dtype": str(target.dtype),
            "drafter_dtype": str(drafter.dtype), "device": str(target.device),
        },
        "drafter": {"block_size": drafter.block_size, "num_hidden_layers": drafter.config.num_hidden_layers,
                    "target_layer_ids": list(drafter.config.target_layer_ids), "note": drafter_note},
        "notes": notes,
        "runs": runs,
    }
    results["markdown"] = to_markdown(results)
    return results


def _check_settings(baselines, modes, oracle: bool, tree_sizes: list) -> None:
    unknown = set(baselines) - set(BASELINES)
    if unknown:
        raise ValueError(f"Unknown baselines {sorted(unknown)}: choose from {', '.join(BASELINES)}.")
    bad_modes = set(modes) - {"greedy", "sampling"}
    if bad_modes:
        raise ValueError(f"Unknown modes {sorted(bad_modes)}: use greedy and/or sampling.")
    if oracle and "sampling" in modes:
        raise ValueError("The oracle drafts the target's greedy continuation: use modes=('greedy',) with it.")
    for tree in tree_sizes:
        if tree != "auto" and (not isinstance(tree, int) or tree < 0):
            raise ValueError(f"draft tree size {tree!r}: use whole numbers >= 0 (0: the chain) or 'auto'.")
    if len(set(tree_sizes)) < len(tree_sizes):
        raise ValueError(f"draft tree sizes {tree_sizes}: each size once (they are measured in turns).")


def _drafters(drafter, block_sizes: list) -> dict:
    """{block size: the drafter with that block} (a copy for each block but its own)."""
    drafters = {}
    for block in block_sizes:
        variant = drafter if block == drafter.block_size else copy.deepcopy(drafter)
        variant.config.block_size = block
        drafters[block] = variant.eval()
    return drafters


class _Runner:
    """One `benchmark` call's measurements: per prompt batch, plain `generate`, DFlash at each tree size in turn, then
    the baselines, each shape's first compiled call untimed."""

    def __init__(self, target, drafters: dict, tokenizer, tmp: Path, *, max_new_tokens, temperature, baselines, warmup,
                 seed, assistant_confidence_threshold, tree_sizes, oracle, cache_implementation, compile_config, vllm,
                 threads):
        self.target, self.drafters, self.tmp = target, drafters, tmp
        self.max_new_tokens, self.temperature, self.baselines = max_new_tokens, temperature, baselines
        self.warmup, self.seed, self.threshold = warmup, seed, assistant_confidence_threshold
        self.tree_sizes, self.oracle = tree_sizes, oracle
        self.cache_implementation, self.compile_config = cache_implementation, compile_config
        self.device = target.device
        self.stop_ids = target_stop_ids(target)
        pad_id = target.generation_config.pad_token_id
        self.pad_id = int(pad_id if pad_id is not None else (self.stop_ids or [0])[0])
        if tokenizer is not None:
            tokenizer = copy.copy(tokenizer)
            tokenizer.padding_side = "left"
            if tokenizer.pad_token is None:
                tokenizer.pad_token = tokenizer.eos_token
            self.pad_id = tokenizer.pad_token_id
        self.tokenizer = tokenizer
        self.vllm = VLLMBaselines(vllm, target, drafters, tmp, threads=threads, max_new_tokens=max_new_tokens,
                                  stop_ids=self.stop_ids)
        self.references = {}  # block -> (the reference package's drafter or None, why not)
        self.compiled_shapes = set()

    def runs(self, set_name: str, prompts: list, batch_size: int, mode: str, block: int, bar) -> list[dict]:
        """The runs (one per tree size) of one prompt set at one batch size, mode and block."""
        greedy = mode == "greedy"
        one_batch = [b for b in self.baselines if b not in ("plain", *BEST_PLAIN, "vllm")]
        active = one_batch if greedy and batch_size == 1 else []
        active += [b for b in BEST_PLAIN if b in self.baselines]
        skipped = {}
        if "vllm" in self.baselines:  # greedy, any batch size
            reason = self.vllm.unavailable() if greedy else "greedy only"
            if reason:
                skipped.update(dict.fromkeys(self.vllm.names, reason))
            else:
                active += self.vllm.names
        if "reference" in active:
            if block not in self.references:
                self.references[block] = _reference_drafter(self.drafters[block], self.tmp / f"b{block}",
                                                            self.target.dtype)
            if self.references[block][0] is None:
                skipped["reference"] = self.references[block][1]
                active.remove("reference")
        prompts = list(enumerate(prompts))  # (index, Prompt or token ids)
        batches = [prompts[i : i + batch_size] for i in range(0, len(prompts), batch_size)]
        kwargs = dict(max_new_tokens=self.max_new_tokens, do_sample=not greedy)
        if not greedy:
            kwargs.update(temperature=self.temperature, top_k=0, top_p=1.0)
        for i in range(min(self.warmup, len(batches))):
            self.measure(batches[i], -1 - i, kwargs, block, active)
        records = {tree: [] for tree in self.tree_sizes}
        for i, batch in enumerate(batches):
            for tree, record in self.measure(batch, i, kwargs, block, active).items():
                records[tree].append(record)
            bar.update(1)
        # the baselines draft no trees: measured once, with the first size (static: reported with every size)
        later = [name for name in active if name in BEST_PLAIN]
        first_size = self.tree_sizes[0]
        elsewhere = dict.fromkeys(set(active) - set(later), f"measured in the draft_tree_size={first_size} run")
        runs = []
        for tree in self.tree_sizes:
            first = tree == first_size
            run = _summarise(set_name, batch_size, mode, block, tree, records[tree], active if first else later,
                             skipped if first else elsewhere, greedy)
            if self.oracle:
                run["oracle"] = _oracle_summary(run)
            runs.append(run)
        return runs

    def untimed_first(self, shape, call) -> None:
        """A call of a shape not seen yet runs once first, untimed (compiling is no step's cost), with the random
        state left as it was for the timed call."""
        device = self.device
        if (self.compile_config is not None or device.type == "cuda") and shape not in self.compiled_shapes:
            self.compiled_shapes.add(shape)
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                call()

    def measure(self, batch, timed_index: int, kwargs: dict, block: int, active: list) -> dict:
        """{tree size: record} of one prompt batch: plain `generate` once, then DFlash at each tree size in turn, then
        the baselines (recorded with the first tree size)."""
        target = self.target
        inputs = left_padded_batch([p for _, p in batch], self.tokenizer, self.pad_id, self.device)
        prompt_len = inputs["input_ids"].shape[1]
        torch.manual_seed(self.seed + timed_index)
        plain, plain_s, plain_phases = profiled(lambda: target.generate(**inputs, **kwargs), target)
        plain_rows = _new_tokens(plain, prompt_len, self.stop_ids, self.max_new_tokens)
        shared = {  # what every tree size's record of this batch holds
            "prompt_ids": [p.id if isinstance(p, Prompt) else str(i) for i, p in batch],
            "prompt_tokens": int(inputs["attention_mask"].sum()), "prompt_len": prompt_len,
            "plain": {"new_tokens": sum(map(len, plain_rows)), "seconds": plain_s, "phases": plain_phases},
        }
        records = {}
        for tree in self.tree_sizes:
            torch.manual_seed(self.seed + timed_index)
            records[tree] = self.measure_dflash(inputs, kwargs, block, plain, plain_rows, shared, tree)
        for name in active:
            if name in self.vllm.names:
                measured = self.vllm.measure(name, inputs, block, plain_rows)
            else:
                seq, secs = self.baseline(name, inputs, kwargs, block, len(batch))
                rows = _new_tokens(seq, prompt_len, self.stop_ids, self.max_new_tokens)
                measured = {"new_tokens": sum(map(len, rows)), "seconds": secs, "identical": rows == plain_rows}
            for tree in self.tree_sizes if name in BEST_PLAIN else self.tree_sizes[:1]:  # every run compares with them
                records[tree][name] = measured
        return records

    def baseline(self, name: str, inputs: dict, kwargs: dict, block: int, batch_size: int) -> tuple:
        """(sequences, seconds) of one baseline's call on `inputs`."""
        target, device = self.target, self.device
        if name == "packed":  # the target's linears prepacked, as DFlash's loop packs them: where memory allows
            with packed_linears(target, memory_bound=True):
                return timed(lambda: target.generate(**inputs, **kwargs), device)
        if name == "static":
            length = cache_capacity(inputs["input_ids"].shape[1] + self.max_new_tokens)
            static = functools.partial(target.generate, **inputs, **kwargs, compile_config=self.compile_config)
            self.untimed_first(("static", batch_size, length),
                               lambda: static(cache=StaticCache(config=target.config, max_cache_len=length)))
            return timed(lambda: static(cache=StaticCache(config=target.config, max_cache_len=length)), device)
        if name == "prompt_lookup":
            return timed(lambda: target.generate(**inputs, **kwargs, prompt_lookup_num_tokens=PROMPT_LOOKUP_TOKENS),
                         device)
        if name == "native":
            return timed(lambda: target.generate(**inputs, **kwargs, assistant_model=self.drafters[block],
                                                 speculation_type="dflash"), device)
        reference = self.references[block][0]
        return timed(lambda: reference.spec_generate(target, inputs["input_ids"], self.max_new_tokens,
                                                     self.stop_ids or None, temperature=0.0), device)

    def measure_dflash(self, inputs, kwargs, block, plain, plain_rows, shared, tree) -> dict:
        target, drafter, prompt_len = self.target, self.drafters[block], shared["prompt_len"]
        dflash_kwargs = dict(kwargs, assistant_confidence_threshold=self.threshold, draft_tree_size=tree,
                             return_dict_in_generate=True)
        if self.cache_implementation is not None:
            dflash_kwargs.update(cache_implementation=self.cache_implementation, compile_config=self.compile_config)

        def call(drafts=None):
            if drafts is None:
                return target.generate(**inputs, **dflash_kwargs, assistant_model=drafter)
            return oracle_generate(target, drafter, drafts, inputs, **dflash_kwargs)

        def oracle_drafts():
            return OracleDrafts.from_plain(plain, prompt_len, self.max_new_tokens, inputs.get("attention_mask"),
                                           self.pad_id, self.stop_ids)

        if self.cache_implementation == "static":  # a new cache length of the fixed-shape path compiles
            capacity = cache_capacity(prompt_len + self.max_new_tokens)
            self.untimed_first(("dflash", block, len(inputs["input_ids"]), capacity, tree),
                               lambda: call(oracle_drafts() if self.oracle else None))
        drafts = oracle_drafts() if self.oracle else None
        out, dflash_s, dflash_phases = profiled(lambda: call(drafts), target, drafter, drafts)
        dflash_rows = _new_tokens(out.sequences, prompt_len, self.stop_ids, self.max_new_tokens)
        lengths = [n for row in out.acceptance_lengths for n in row]
        greedy = not kwargs["do_sample"]
        record = {
            **copy.deepcopy(shared),
            "dflash": {"new_tokens": sum(map(len, dflash_rows)), "seconds": dflash_s, "phases": dflash_phases},
            "acceptance_lengths": out.acceptance_lengths,
            "draft_lengths": out.draft_lengths,
            "histogram": _histogram(lengths, block),
            "identical": plain_rows == dflash_rows if greedy else None,
            # per row: the first generated position where DFlash differs from plain (None: identical). In
            # bfloat16 a forward over k tokens may round differently from k one-token forwards: a near-tie
            # can then flip, as on GPUs; in float32 / float64 any difference is a bug.
            "first_difference": [first_difference(a, b) for a, b in zip(plain_rows, dflash_rows)]
            if greedy else None,
        }
        if drafts is not None:
            record["oracle"] = drafts.record()
        return record


def _oracle_summary(run: dict) -> dict:
    """The oracle run's speedup against its ceilings (`oracle.ceilings`, from forwards timed after each
    step on its own cache). A third number needs no timed forward: the calls' own target forwards (plain's one-token
    steps, the loop's verifications), whose time ratio is the speedup the run would have if nothing but the target's
    forwards cost time."""
    s, records = run["summary"], run["prompts"]
    steps = [step for r in records for step in r["oracle"]["steps"]]
    limit, own = ceilings(steps, run["block_size"])
    # The ceiling is the decoding steps' own: the prefill (the same forward in both calls) is left out of both
    plain, dflash = (s[f"{m}_seconds"] - run["profile"][m]["prefill_seconds"] for m in ("plain", "dflash"))
    # plain at its best: the static or packed baseline where it ran and was faster (its prefill is taken to cost what
    # plain's did)
    prefill = run["profile"]["plain"]["prefill_seconds"]
    best = min([plain] + [run["baselines"][n]["seconds"] - prefill for n in BEST_PLAIN
                          if "seconds" in run["baselines"].get(n, {})])
    forwards = [sum(r[m]["phases"]["target_steps"] for r in records) for m in ("plain", "dflash")]
    sizes = sorted({k for step in steps for k in step["seconds"]}, key=int)
    mean = {k: statistics.mean(step["seconds"][k] for step in steps if k in step["seconds"]) for k in sizes}
    return {
        "speedup": s["speedup"], "decode_speedup": plain / dflash, "ceiling": limit, "ratio": plain / dflash / limit,
        "best_plain_ratio": best / dflash / limit,
        "ratio_with_prefill": s["speedup"] / limit, "steps_ceiling": own, "steps_ratio": plain / dflash / own,
        # compiled forwards run no timing hooks (the fixed-shape path's): no calls' ratio then
        "calls_ceiling": forwards[0] / forwards[1] if forwards[1] else None,
        "calls_ratio": plain / dflash * forwards[1] / forwards[0] if forwards[1] else None,
        "forward_seconds": mean,  # each size's mean over the steps that timed it
        "wrong_steps": sum(r["oracle"]["wrong_steps"] for r in records),
        "resyncs": sum(len(r["oracle"]["resyncs"]) for r in records),
        "resync_seconds": sum(r["oracle"]["resync_seconds"] for r in records),
        "untimed_seconds": sum(r["oracle"]["untimed_seconds"] for r in records),
    }


def _summarise(set_name, batch_size, mode, block, tree, records, active, skipped, greedy) -> dict:
    plain_s = sum(r["plain"]["seconds"] for r in records)
    dflash_s = sum(r["dflash"]["seconds"] for r in records)
    plain_tokens = sum(r["plain"]["new_tokens"] for r in records)
    dflash_tokens = sum(r["dflash"]["new_tokens"] for r in records)
    lengths = [n for r in records for row in r["acceptance_lengths"] for n in row]
    drafts = [n for r in records for row in r["draft_lengths"] for n in row]
    histogram = [0] * max(len(r["histogram"]) for r in records)
    for r in records:
        for k, c in enumerate(r["histogram"]):
            histogram[k] += c
    baselines = {}
    for name in active:
        secs = sum(r[name]["seconds"] for r in records)
        tokens = sum(r[name]["new_tokens"] for r in records)
        baselines[name] = {"seconds": secs, "new_tokens": tokens, "tokens_per_s": tokens / secs,
                           "speedup": plain_s / secs, "identical": all(r[name]["identical"] for r in records)}
        if "drafts" in records[0][name]:  # vLLM's speculative counters: its tokens per step
            steps, accepted = (sum(r[name][k] for r in records) for k in ("drafts", "accepted"))
            baselines[name]["tau"] = 1 + accepted / steps if steps else None
    for name, note in skipped.items():
        baselines[name] = {"skipped": note}
    best_plain = min([plain_s] + [baselines[name]["seconds"] for name in BEST_PLAIN if name in active])
    if not greedy or batch_size > 1:
        reason = "greedy, batch 1 only" if greedy else "greedy only"
        for name in ("prompt_lookup", "native", "reference"):
            baselines.setdefault(name, {"skipped": reason})
    return {
        "set": set_name, "batch_size": batch_size, "mode": mode, "block_size": block, "tree_size": tree,
        "prompts": records,
        "profile": {method: _profile(records, method) for method in ("plain", "dflash")},
        "summary": {
            "tau": sum(lengths) / max(len(lengths), 1), "steps": len(lengths),
            "committed": sum(lengths), "histogram": histogram,
            # steps that verified no drafts: skipped under the confidence threshold, or at max_length
            "steps_without_drafts": sum(n == 0 for n in drafts),
            # drafts verified per step: the chain's block, the tree's nodes, what "auto" chose ({drafts: steps})
            "drafts_per_step": sum(drafts) / max(len(drafts), 1),
            "draft_lengths": {str(n): drafts.count(n) for n in sorted(set(drafts))},
            "plain_seconds": plain_s, "dflash_seconds": dflash_s,
            "plain_new_tokens": plain_tokens, "dflash_new_tokens": dflash_tokens,
            "tokens_per_s_plain": plain_tokens / plain_s, "tokens_per_s_dflash": dflash_tokens / dflash_s,
            "speedup": plain_s / dflash_s,
            # against plain `generate` at its best: the faster of eager and static (where measured)
            "speedup_best_plain": best_plain / dflash_s,
            # the same where both made as many tokens; where a near-tie (bfloat16) or sampling made them differ,
            # time per set rewards the call that stopped earlier, and tokens per second does not
            "speedup_per_token": (dflash_tokens / dflash_s) / (plain_tokens / plain_s),
            "identical": all(r["identical"] for r in records) if greedy else None,
            "identical_rows": sum(d is None for r in records for d in r["first_difference"]) if greedy else None,
            "rows": sum(len(r["prompt_ids"]) for r in records),
            "first_differences": sorted(d for r in records for d in r["first_difference"] if d is not None)
            if greedy else None,
        },
        "baselines": baselines,
    }


def _profile(records, method: str) -> dict:
    """Milliseconds per decoding step (one target forward after the prefill) in each phase, pooled over prompts.
    Compiled forwards (the fixed-shape path) run no timing hooks: where the hooks saw fewer forwards than the run made
    steps, the phases are None and `other_ms` holds a step's whole time (`split`: False)."""
    total = {k: sum(r[method]["phases"][k] for r in records) for k in (*PHASES, "other")}
    seen = sum(r[method]["phases"]["target_forwards"] - 1 for r in records)
    # a DFlash batch makes a step until its last row ends (each row's acceptance lengths: one per step it took part in)
    steps = seen if method == "plain" else sum(max(map(len, r["acceptance_lengths"])) for r in records)
    split = seen == steps
    phases = [k for k in PHASES if k != "target_prefill"]
    other = total["other"] if split else total["other"] + sum(total[k] for k in phases)
    per_step = {f"{k}_ms": 1000 * total[k] / max(steps, 1) if split else None for k in phases}
    return {"steps": steps, "split": split, "prefill_seconds": total["target_prefill"], **per_step,
            "other_ms": 1000 * other / max(steps, 1)}


