"""The benchmark's report: a markdown table (`to_markdown`), a plot, and the files `write_outputs` writes."""

import json
from pathlib import Path

RESULTS_FILE, MARKDOWN_FILE, PLOT_FILE = "bench_results.json", "bench.md", "bench.png"


def tree_label(tree) -> str:
    return "chain" if tree == 0 else str(tree)


def _measured_on(results: dict) -> str:
    m, settings = results["machine"], results["settings"]
    device = m.get("cuda") or m.get("cpu", m["processor"])
    prompts = ", ".join(f"{name} {n}" for name, n in settings["num_prompts"].items())
    return (f"Measured on {device}, {m['cpu_count']} CPU cores, {m['torch_threads']} torch thread(s), torch "
            f"{m['torch']}, transformers {m['transformers']}, {m['date']}; target {settings['target_dtype']}, "
            f"drafter {settings['drafter_dtype']}; prompts: {prompts}.")


def _speedup_cell(summary: dict) -> str:
    cell = f"{summary['speedup']:.2f}x"
    if summary["plain_new_tokens"] != summary["dflash_new_tokens"]:
        cell += f" ({summary['speedup_per_token']:.2f}x per token)"
    return cell


def to_markdown(results: dict) -> str:
    names = [n for b in results["settings"]["baselines"] if b != "plain"
             for n in (("vllm", "vllm_dflash") if b == "vllm" else (b,))]
    head = ["set", "batch", "mode", "block", "tree", "tau", "drafts/step", "tok/s plain", "tok/s dflash", "speedup",
            "identical"]
    head += [f"tok/s {n}" for n in names]
    if {"static", "packed"} & set(names):
        head.append("speedup vs best plain")
    lines = [_measured_on(results), "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in results["runs"]:
        s = run["summary"]
        identical = "-" if s["identical"] is None else ("yes" if s["identical"] else
                                                        f"{s['identical_rows']}/{s['rows']} (first diff at "
                                                        f"{', '.join(map(str, s['first_differences']))})")
        cells = [run["set"], run["batch_size"], run["mode"], run["block_size"], tree_label(run["tree_size"]),
                 f"{s['tau']:.2f}", f"{s['drafts_per_step']:.1f}", f"{s['tokens_per_s_plain']:.1f}",
                 f"{s['tokens_per_s_dflash']:.1f}", _speedup_cell(s), identical]
        for n in names:
            b = run["baselines"].get(n, {})
            tau = f" (tau {b['tau']:.2f})" if b.get("tau") else ""  # vLLM with the drafter
            cells.append(f"{b['tokens_per_s']:.1f}{tau}" + ("" if b["identical"] else " (differs)")
                         if "tokens_per_s" in b else "-")
        if {"static", "packed"} & set(names):
            cells.append(f"{s['speedup_best_plain']:.2f}x" if "speedup_best_plain" in s else "-")
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    auto = [run for run in results["runs"] if run["tree_size"] == "auto"]
    if auto:
        lines += ["", 'What draft_tree_size="auto" verified (drafts per step: steps):', ""]
        lines += [f"- {run['set']}, batch {run['batch_size']}, {run['mode']}, block {run['block_size']}: "
                  + ", ".join(f"{n}: {c}" for n, c in run["summary"]["draft_lengths"].items()) for run in auto]
    if any("oracle" in run for run in results["runs"]):
        lines += ["", "Oracle: always-right drafts (the target's own greedy continuation, placed after the real "
                  "drafter ran); ceiling = tokens committed per step x t(1) / t(tokens verified per step), forwards "
                  "timed after each step on its own cache (t: their mean), with every step committing its block "
                  "(B x t(1) / t(B)) and with the run's own steps (a last step cut by the token budget, a near-tie's "
                  "wrong draft: verified and committed as they were); decode speedup: both calls' prefill left out; "
                  "the calls' forwards: the same ratio against the time of the calls' own target forwards (plain's "
                  "one-token steps over the loop's verifications), no timed forward; vs plain at its best: the decode "
                  "speedup over the fastest of plain eager and the static and packed baselines, over the ceiling:", ""]
        head = ["set", "batch", "block", "tree", "tau", "wrong drafts", "resyncs", "t(1) ms", "t(verified) ms",
                "speedup", "decode speedup", "ceiling", "decode speedup / ceiling", "ceiling of its steps",
                "decode speedup / that", "/ the calls' forwards", "vs plain at its best: decode speedup / ceiling"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for run in results["runs"]:
            o = run["oracle"]
            verified = {k: v for k, v in o["forward_seconds"].items() if k != "1"} or o["forward_seconds"]
            if run["tree_size"] != "auto":  # the full step's size; shorter last steps are in the JSON
                full = str(run["block_size"] if run["tree_size"] == 0 else run["tree_size"] + 1)
                verified = {full: o["forward_seconds"][full]}
            cells = [run["set"], run["batch_size"], run["block_size"], tree_label(run["tree_size"]),
                     f"{run['summary']['tau']:.2f}", o["wrong_steps"], o["resyncs"],
                     f"{1000 * o['forward_seconds']['1']:.1f}",
                     ", ".join(f"{1000 * v:.1f} ({k})" for k, v in verified.items()),
                     f"{o['speedup']:.2f}x", f"{o['decode_speedup']:.2f}x", f"{o['ceiling']:.2f}x", f"{o['ratio']:.2f}",
                     f"{o['steps_ceiling']:.2f}x", f"{o['steps_ratio']:.2f}",
                     f"{o['calls_ratio']:.2f}" if o.get("calls_ratio") else "-",  # none compiled, nor before 2026-12-04
                     f"{o['best_plain_ratio']:.2f}" if "best_plain_ratio" in o else "-"]  # nor before 2026-12-06
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    head = ["set", "batch", "mode", "block", "tree", "plain: target fwd", "plain: other", "dflash: target verify",
            "dflash: drafter layers", "dflash: drafter lm_head", "dflash: drafts, tree", "dflash: cache keep",
            "dflash: other"]
    lines += ["", "Where the time goes, ms per step (one target forward after the prefill):", "",
              "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in results["runs"]:
        plain, dflash = run["profile"]["plain"], run["profile"]["dflash"]
        cells = [run["set"], run["batch_size"], run["mode"], run["block_size"], tree_label(run["tree_size"]),
                 plain["target_steps_ms"],
                 plain["other_ms"], dflash["target_steps_ms"], dflash["drafter_layers_ms"], dflash["drafter_head_ms"],
                 dflash.get("drafts_ms"), dflash.get("cache_keep_ms"), dflash["other_ms"]]
        lines.append("| " + " | ".join("-" if c is None else str(c) if isinstance(c, (str, int)) else f"{c:.1f}"
                                       for c in cells) + " |")
    if any(not run["profile"]["dflash"].get("split", True) for run in results["runs"]):
        lines += ["", "-: compiled forwards (the fixed-shape path) are not split into phases; `dflash: other` is then "
                      "a whole step"]
    if any("cache_keep_ms" not in run["profile"]["dflash"] for run in results["runs"]):
        lines += ["", "-: measured before the phase had a column of their own (2026-12-07): the drafts are in "
                      "`drafter lm_head`, the cache keeping in `other`"]
    return "\n".join(lines) + "\n"


def differences(results: dict, exact: bool) -> list[str]:
    """What `hf-dflash bench` says on stderr: runs whose DFlash output differs from plain greedy, and oracle drafts the
    target rejected; errors where the dtype is `exact` (float32 / float64), else notes (a bfloat16 near-tie)."""
    kind = "ERROR" if exact else "note"
    lines = [f"{kind}: DFlash output differs from plain greedy generate on {run['set']} batch {run['batch_size']} "
             f"block {run['block_size']} in {s['rows'] - s['identical_rows']} of {s['rows']} rows"
             for run in results["runs"] if (s := run["summary"])["identical"] is False]
    return lines + [f"{kind}: the target rejected {run['oracle']['wrong_steps']} oracle drafts on {run['set']} batch "
                    f"{run['batch_size']} block {run['block_size']}"
                    for run in results["runs"] if run.get("oracle", {}).get("wrong_steps")]


def plot(results: dict, path) -> Path:
    try:
        import matplotlib
    except ImportError:
        raise ModuleNotFoundError("The benchmark plot needs matplotlib: pip install 'hf-dflash[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    labels = [f"{r['set']}\nbatch {r['batch_size']}\n{r['mode']}\nblock {r['block_size']}\n"
              f"tree {tree_label(r['tree_size'])}" for r in runs]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(runs) + 3), 4.5))
    x = list(range(len(runs)))
    best = [r["summary"].get("speedup_best_plain") for r in runs]
    if any(b is not None for b in best):  # the static baseline ran: both speedups, side by side
        ax1.bar([i - 0.2 for i in x], [r["summary"]["speedup"] for r in runs], 0.4, color="tab:blue",
                label="vs plain eager")
        ax1.bar([i + 0.2 for i in x], [b or 0.0 for b in best], 0.4, color="tab:green", label="vs plain at its best")
        ax1.legend(fontsize=8)
    else:
        ax1.bar(x, [r["summary"]["speedup"] for r in runs], color="tab:blue")
    ax1.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax1.set_title("speedup over\nplain generate")
    ax2.bar(x, [r["summary"]["tau"] for r in runs], color="tab:orange")
    ax2.set_title("acceptance length\n(tokens / target forward)")
    for ax in (ax1, ax2):
        ax.set_xticks(x, labels)
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_outputs(results: dict, output_dir, make_plot: bool = True) -> dict:
    """Write bench_results.json (holding the markdown too), bench.md and bench.png; return their paths."""
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"json": folder / RESULTS_FILE, "markdown": folder / MARKDOWN_FILE}
    paths["json"].write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    paths["markdown"].write_text(results["markdown"], encoding="utf-8")
    if make_plot:
        paths["plot"] = plot(results, folder / PLOT_FILE)
    return paths
