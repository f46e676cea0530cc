"""The README's result tables from `hf-dflash bench` JSON files: per prompt set, acceptance length and speedup of each
draft tree setting, for several runs side by side (e.g. bfloat16 and float32), and the oracle table.

    python examples/drafters/results_tables.py bf16=OUT1/bench_results.json fp32=OUT2/bench_results.json
    python examples/drafters/results_tables.py --oracle bf16=OUT3/bench_results.json fp32=OUT4/bench_results.json
"""

import argparse
import json


def label(tree):
    return "chain" if tree in (0, None) else f"tree {tree}"


def speed_table(named):
    columns = []  # (name, tree)
    for name, results in named:
        for run in results["runs"]:
            if (name, run["tree_size"]) not in columns:
                columns.append((name, run["tree_size"]))
    sets = list(dict.fromkeys(run["set"] for _, results in named for run in results["runs"]))
    head = ["set"] + [f"{name} {label(tree)}" for name, tree in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = {}
    for name, results in named:
        for run in results["runs"]:
            rows[(run["set"], name, run["tree_size"])] = run["summary"]
    means = {c: [] for c in columns}
    for s in sets:
        cells = [s]
        for c in columns:
            r = rows[(s, *c)]
            means[c].append((r["speedup"], r["tau"]))
            cells.append(f"{r['speedup']:.2f}x / {r['tau']:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    cells = ["mean"]
    for c in columns:
        sp = sum(x for x, _ in means[c]) / len(means[c])
        tau = sum(y for _, y in means[c]) / len(means[c])
        cells.append(f"{sp:.2f}x / {tau:.2f}")
    lines.append("| " + " | ".join(cells) + " |")
    notes = []
    for name, results in named:
        for run in results["runs"]:
            s = run["summary"]
            if s.get("identical") is False:
                notes.append(f"{name} {run['set']} {label(run['tree_size'])}: {s['identical_rows']}/{s['rows']} "
                             f"identical (first difference at new token {', '.join(map(str, s['first_differences']))})")
            if run["tree_size"] == "auto":
                notes.append(f"{name} {run['set']} auto drafts per step {{drafts: steps}}: {s['draft_lengths']}")
    return "\n".join(lines), notes


def oracle_table(named):
    head = ["dtype", "drafter", "block", "tau", "speedup", "decode speedup", "ceiling B t(1)/t(B)", "ratio",
            "ceiling of its steps", "ratio", "ratio to the calls' forwards", "t(1) ms", "t(B) ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, results in named:
        layers = results["drafter"]["num_hidden_layers"]
        for run in results["runs"]:
            o, block = run["oracle"], run["block_size"]
            t = {int(k): v for k, v in o["forward_seconds"].items()}  # max: the full step's size (last steps are shorter)
            calls = f"{o['calls_ratio']:.2f}" if "calls_ratio" in o else "-"  # older runs: not recorded
            lines.append(f"| {name} | {layers} layer{'s' * (layers > 1)} | {block} | {run['summary']['tau']:.2f} | "
                         f"{o['speedup']:.2f}x | {o['decode_speedup']:.2f}x | {o['ceiling']:.2f}x | {o['ratio']:.2f} | "
                         f"{o['steps_ceiling']:.2f}x | {o['steps_ratio']:.2f} | {calls} | {1000 * t[1]:.1f} | "
                         f"{1000 * t[max(t)]:.1f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="NAME=bench_results.json")
    parser.add_argument("--oracle", action="store_true")
    args = parser.parse_args()
    named = [(n, json.load(open(p))) for n, p in (r.split("=", 1) for r in args.runs)]
    if args.oracle:
        print(oracle_table(named))
        return
    table, notes = speed_table(named)
    print(table)
    print("\n" + "\n".join(f"- {n}" for n in notes))


if __name__ == "__main__":
    main()
