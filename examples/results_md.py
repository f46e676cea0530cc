"""Write docs/results.md from the benchmark snapshots under docs/results/: the shipped drafter's tables, one dated
snapshot per machine kind, the drafter comparisons under docs/results/comparisons/ (`examples/compare_drafters.py`),
and the index of the experiments that left the repository.

    python examples/results_md.py            # rewrites docs/results.md, prints its path and the snapshots used
    python examples/results_md.py --check    # exit 1 if docs/results.md is not what the snapshots give

A snapshot is a folder docs/results/<date>-<machine>-<dtype>/ holding what `hf-dflash bench` wrote
(bench_results.json, which records the machine and settings, and bench.png) plus command.txt, the command that
produced it. Snapshots are grouped by machine kind (the CPU or GPU and its core count, from the JSON) and the target's
dtype, which changes what a CPU is bound by; each group shows its newest date, the older ones are linked. The tables
are the package's own (`hf_dflash.bench.to_markdown`).
"""

import argparse
import json
import sys
from pathlib import Path

from hf_dflash.bench import to_markdown

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SNAPSHOTS = DOCS / "results"
OUTPUT = DOCS / "results.md"
DRAFTER = "examples/drafters/smollm2-135m-instruct-dflash"

# Where the experiment files last lived, and what they were: one line each.
EXPERIMENTS_COMMIT = "39fc9e6"
EXPERIMENTS = [
    ("examples/drafters/RESULTS.md", "the measurement diary of drafters C to I and of the loop (121 KB): every "
     "training run, acceptance and speed table, A/B and oracle run, with its command"),
    ("examples/drafters/data/", "the regenerated training text (G's 20,869 samples, 10,194 ShareGPT later turns; "
     "xz); `reproduce/reproduce.sh` takes it from this commit"),
    ("examples/drafters/reproduce_smollm2_c.sh", "how drafter C was made (data, runs A -> B -> C)"),
    ("examples/drafters/reproduce_smollm2.sh", "how drafters D1 to G were made, with the learning curve and the "
     "layer / block sweeps"),
    ("examples/drafters/continue_g.sh", "drafter H: G trained further on G's data (never shipped, weights lost)"),
    ("examples/drafters/continue_h.sh", "drafter I (and J, K, V16): G or H trained on G's data plus the later turns"),
    ("examples/drafters/regenerate_later_turns.sh", "the regeneration of ShareGPT's later turns"),
    ("examples/drafters/evaluate_drafter.sh", "a new drafter's acceptance against the shipped one"),
    ("examples/drafters/ship_drafter.sh", "staging and shipping a drafter that beats the shipped one"),
    ("examples/drafters/measure_speed.sh", "the speed tables' command (now in each snapshot's command.txt)"),
    ("examples/drafters/loss_variants.sh", "the ce / dpace / lk loss comparison"),
    ("examples/drafters/eval_acceptance.py", "acceptance length of drafters with `generate` on held-out prompts"),
    ("examples/drafters/learning_curve.py", "acceptance against training samples or steps, plotted "
     "(learning_curve.png, learning_curve_steps.png)"),
    ("examples/drafters/acceptance/", "the acceptance JSONs of C to G, the learning curve and the sweeps"),
    ("examples/drafters/results_tables.py", "side-by-side speed and oracle tables from several bench JSONs"),
    ("examples/drafters/results-d2/, results-e/, results-f/, results-g/", "the bench files of the drafters shipped "
     "before I (bf16, float32, batch 4, sampling, oracle runs; G also on the EPYC and after cpu_ops)"),
    ("examples/drafters/results-f-fixed-sizes/", "F with fixed draft tree sizes against \"auto\""),
    ("examples/drafters/results-h/", "H's training log, record and acceptance against G"),
    ("examples/drafters/results-i/", "I's training log and record, a copy of its weights, acceptance against G, the "
     "EPYC runs (trees, turns, loop costs, oracle, bigram prior A/Bs) and the tables before the prior"),
    ("examples/drafters/results-v16/", "V16 (a 16,384-token draft vocabulary) and its 8,192 control V8C: records and "
     "acceptance"),
    ("examples/drafters/results-head-ab/", "logs of the packed draft head A/B"),
    ("examples/drafters/markov_head/", "a learned Markov head over the drafter, tried and not kept"),
    ("examples/drafters/reveal/", "a path-conditioned second drafter pass (patch, replay), tried and not kept"),
    ("examples/drafters/oracle-cuda-h200/", "the first GPU runs: the oracle on a random Qwen3-8B shape on an H200, "
     "cuDNN attention on and off, the CUDA test log"),
    ("examples/drafters/attention_baseline_ab.py", "plain `generate` and DFlash with SDPA against eager attention"),
    ("examples/drafters/auto_replay.py", "\"auto\"'s per-step choices replayed against fixed tree sizes"),
    ("examples/drafters/bf16_near_ties.py", "where bfloat16 DFlash leaves plain greedy: the near-ties"),
    ("examples/drafters/bigram_prior_ab.py", "a drafter with and without its bigram prior, side by side"),
    ("examples/drafters/bigram_tree_replay.py", "acceptance of chains and trees with and without the prior, on the "
     "same steps"),
    ("examples/drafters/confidence_calibration.py", "first-draft probability against acceptance (C's confidence "
     "threshold)"),
    ("examples/drafters/cost_curve_ab.py", "two forward-cost curves for \"auto\", A/B"),
    ("examples/drafters/cpu_ops_ab.py", "the `hf_dflash.cpu_ops` A/B (argmax, packed layers and head)"),
    ("examples/drafters/cpu_ops_micro.py", "micro-timings behind `cpu_ops` and the bigram prior's per-step cost"),
    ("examples/drafters/draft_vocab_breaks.py", "how often chains break at a token outside the draft vocabulary"),
    ("examples/drafters/inference_mode_ab.py", "the loop in inference mode against no_grad"),
    ("examples/drafters/loop_costs_ab.py", "\"auto\"'s cost correction (LoopCosts) A/B"),
    ("examples/drafters/prior_acceptance.py", "the prior's sampling acceptance and the top-8 ranking bound"),
    ("examples/drafters/sdpa_new_lengths.py", "GPU attention's cost per new key length"),
    ("examples/drafters/train_speed.py", "seconds per training step under each speed option"),
    ("examples/drafters/tree_order_replay.py", "a calibrated best-first tree order, replayed"),
    ("examples/draft_trees_timing.py", "a quick timing of draft tree sizes against the chain (now `hf-dflash bench "
     "--draft-tree-sizes`)"),
]


def _other_target(results: dict) -> str | None:
    """The target a snapshot measured where it is not the shipped drafter's (a random-weight shape): snapshots of
    another target are a group of their own, beside the shipped drafter's."""
    target = results.get("target") or ""
    return None if target in ("", "HuggingFaceTB/SmolLM2-135M-Instruct") else target


def load_snapshots() -> list[dict]:
    snapshots = []
    for path in sorted(SNAPSHOTS.glob("*/bench_results.json")):
        results = json.loads(path.read_text(encoding="utf-8"))
        machine = results["machine"]
        command = path.parent / "command.txt"
        snapshots.append({
            "folder": path.parent,
            "results": results,
            "kind": (machine.get("cuda") or machine.get("cpu") or machine["processor"], machine["cpu_count"],
                     results["settings"]["target_dtype"].removeprefix("torch."), _other_target(results)),
            "date": machine["date"][:10],
            "command": command.read_text(encoding="utf-8").strip() if command.is_file() else None,
        })
    return snapshots


def load_comparisons() -> list[dict]:
    """Acceptance comparisons of drafters (`examples/compare_drafters.py`): docs/results/comparisons/<name>/."""
    comparisons = []
    for path in sorted((SNAPSHOTS / "comparisons").glob("*/acceptance.json")):
        command = path.parent / "command.txt"
        comparisons.append({"folder": path.parent, "results": json.loads(path.read_text(encoding="utf-8")),
                            "command": command.read_text(encoding="utf-8").strip() if command.is_file() else None})
    return comparisons


def comparison_section(comparison: dict) -> list[str]:
    results, folder = comparison["results"], comparison["folder"]
    m, s = results["machine"], results["settings"]
    sets = s["sets"]
    lines = [
        f"### {folder.name}",
        "",
        f"Machine: {m.get('cuda') or m.get('cpu') or m['processor']}, {m['torch_threads']} torch thread(s); torch "
        f"{m['torch']}, transformers {m['transformers']}; measured {m['date']}. Target {s['target']} in {s['dtype']}, "
        f"{s['num_prompts']} prompts per set, {s['max_new_tokens']} new tokens, sampling at temperature "
        f"{s['temperature']}. tau: tokens committed per target forward (acceptance only, nothing timed).",
        "",
        "Command:", "", "```bash", comparison["command"] or "not recorded", "```", "",
        "| drafter | mode | " + " | ".join(sets) + " | mean |",
        "|---|---|" + "---|" * (len(sets) + 1),
    ]
    for drafter, modes in results["tau"].items():
        for mode, taus in modes.items():
            values = [taus[name] for name in sets]
            lines.append(f"| {drafter} | {mode} | " + " | ".join(f"{v:.2f}" for v in values)
                         + f" | {sum(values) / len(values):.2f} |")
    return lines + [""]


def link(path: Path) -> str:
    return path.relative_to(DOCS).as_posix()


def snapshot_section(snapshot: dict) -> list[str]:
    results, folder = snapshot["results"], snapshot["folder"]
    m, s = results["machine"], results["settings"]
    trees = ", ".join("chain" if t == 0 else str(t) for t in s["draft_tree_sizes"] or ["the drafter's own"])
    path = ", DFlash on the fixed-shape path" if s.get("cache_implementation") == "static" else ""
    compiled = f", compiled with {s['compile_config']['backend']}" if s.get("compile_config") else ""
    lines = [
        f"### {folder.name}: target {s['target_dtype'].removeprefix('torch.')}{path}",
        "",
        f"Machine: {m.get('cuda') or m.get('cpu') or m['processor']}, {m['cpu_count']} CPU cores, "
        f"{m['torch_threads']} torch thread(s) per run, device {s.get('device', 'cpu')}; torch {m['torch']}, "
        f"transformers {m['transformers']}, Python {m['python']}, {m['platform']}; measured {m['date']}.",
        f"Settings: target {s['target_dtype']}, drafter {s['drafter_dtype']}; {s['max_new_tokens']} new tokens, "
        f"{', '.join(s['modes'])}, batch {', '.join(map(str, s['batch_sizes']))}, block "
        f"{', '.join(map(str, s['block_sizes'] or ['as shipped']))}, draft trees: {trees}; prompts per set: "
        + ", ".join(f"{name} {n}" for name, n in s["num_prompts"].items())
        + f"; baselines: {', '.join(s.get('baselines') or ['plain'])}{compiled}.",
        "",
    ]
    if snapshot["command"]:
        lines += ["Command:", "", "```bash", snapshot["command"], "```", ""]
    else:
        lines += ["Command: not recorded (no command.txt in the snapshot).", ""]
    files = [f"[{p.name}]({link(p)})" for p in sorted(folder.iterdir()) if p.is_file()]
    lines += [f"Files: {', '.join(files)}.", ""]
    if (folder / "bench.png").is_file():
        lines += [f"![speedup and acceptance, {folder.name}]({link(folder / 'bench.png')})", ""]
    tables = to_markdown(results)
    if tables.startswith("Measured on"):  # its first paragraph says what the lines above say
        tables = tables.split("\n\n", 1)[1]
    lines += [tables.rstrip("\n"), ""]
    return lines


def render(snapshots: list[dict], comparisons: list[dict]) -> str:
    lines = [
        "# Results",
        "",
        "<!-- Generated by `python examples/results_md.py` from docs/results/*/: edit those files, not this one. -->",
        "",
        f"The shipped drafter ([`{DRAFTER}`](../{DRAFTER}), drafter \"I\" for SmolLM2-135M-Instruct) against plain "
        "`generate`, one dated snapshot per machine kind and dtype. tau: tokens committed per target forward; speedup: "
        "plain `generate`'s time over DFlash's, both in the same dtype, prompt by prompt in one run. Every snapshot "
        "names the machine, the settings and the command; its folder holds the full JSON (per prompt) and the plot.",
        "",
        "To add one: run its command on the new machine, copy the output folder to "
        "`docs/results/<date>-<machine>-<dtype>/` with the command in `command.txt`, and rerun "
        "`python examples/results_md.py`.",
        "",
    ]
    kinds: dict[tuple, list[dict]] = {}
    for snapshot in snapshots:
        kinds.setdefault(snapshot["kind"], []).append(snapshot)
    for (device, cores, dtype, target), group in kinds.items():
        newest = max(s["date"] for s in group)
        lines += [f"## {device}, {cores} CPU cores, {dtype}{f', target {target}' if target else ''}: {newest}", ""]
        older = [s for s in group if s["date"] != newest]
        if older:
            lines += ["Earlier snapshots on this machine kind in this dtype: "
                      + ", ".join(f"[{s['folder'].name}]({link(s['folder'] / 'bench_results.json')})" for s in older)
                      + ".", ""]
        for snapshot in group:
            if snapshot["date"] == newest:
                lines += snapshot_section(snapshot)
    if comparisons:
        lines += [
            "## Drafters compared",
            "",
            "Drafters trained alike, side by side on the same prompts (`examples/compare_drafters.py`). Greedy: "
            "`chain` (as `generate` drafts it), `chain_unconditional` (each position's own argmax: no DFlash2 "
            "selector, no bigram prior), `tree16` (a tree of 16 drafts). Sampling: `sampling` (a chain drawn from the "
            "drafter, as `generate` does), `sampling_point_mass` (the greedy chain), `sampling_tree16`. Why the "
            "shipped drafter is the one it is: [design.md](design.md#dflash2-the-selector-as-a-conditional-proposal).",
            "",
        ]
        for comparison in comparisons:
            lines += comparison_section(comparison)
    lines += [
        "## Experiments that left the repository",
        "",
        f"Until commit `{EXPERIMENTS_COMMIT}` `examples/` also held the experiments behind the shipped drafter and the "
        "decoding loop; their conclusions are in [design.md](design.md). Read any of them with "
        f"`git show {EXPERIMENTS_COMMIT}:PATH`, or bring them all back with "
        f"`git checkout {EXPERIMENTS_COMMIT} -- examples/drafters` (a full clone has them):",
        "",
    ]
    lines += [f"- `{path}`: {what}" for path, what in EXPERIMENTS]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/results.md is stale; write nothing")
    args = parser.parse_args()
    snapshots = load_snapshots()
    if not snapshots:
        sys.exit(f"no snapshots: {SNAPSHOTS}/*/bench_results.json")
    text = render(snapshots, load_comparisons())
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.is_file() else ""
        print(f"{OUTPUT.relative_to(ROOT)} is {'up to date' if current == text else 'stale: rerun without --check'}")
        return 0 if current == text else 1
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(ROOT)} from {len(snapshots)} snapshots: "
          + ", ".join(s["folder"].name for s in snapshots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
