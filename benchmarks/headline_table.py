"""The README's headline table from result files of `dynamic_lengths.py`, calibration charged to all.

Runs that share a `--workdir` read `auto`'s calibration from the cache the first one filled, so
their own "with overheads" ratio charges it nearly nothing. This prints, per file, `auto`'s and
the best complete fixed plan's epoch (median [min-max]), their ratio (median, range over the
samples, and the ratios of the samples taken in the same round, median and range), and the ratio with every
overhead: both sides' compiles, `auto`'s search and the largest calibration any of the files
measured (the run that paid it), so every row pays for the calibration once.

    python benchmarks/headline_table.py \
        benchmarks/results/dynamic_lengths_{stdlib,githubcode,stdlib_20mib,negative_20mib}.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dynamic_lengths import NO_BUDGET, ratio, step_cell, with_overheads  # noqa: E402


def epoch_text(row: dict) -> str:
    """A contender's epoch seconds, median [min-max], or a dash where it cannot run every batch."""
    if not row["epoch_s"]:
        return "—"
    lo, hi = row["epoch_s_range"]
    return f"{row['epoch_s']:,.0f} [{lo:,.0f}-{hi:,.0f}]"


def contender_table(r: dict, n: int) -> list[str]:
    """Markdown lines: one run's facts and its contenders (auto, the n fastest complete fixed
    plans, the written plans of `--plans`, and the fastest fixed plan at the shortest bucket when
    it cannot run every batch)."""
    c, buckets = r["contenders"], [b for b, k in r["bucket_steps"].items() if k]
    best = r["best_complete_static"]
    per_bucket = ", ".join(f"{int(b):,}: {r['epoch_bucket_steps'][b]:,}" for b in buckets)
    out = [f"Epoch batches per bucket: {per_bucket}; "
           f"{r.get('repeats_per_batch', 1)} run(s) per batch; {r.get('wall_s', 0) / 60:.0f} min wall.", "",
           "| contender | epoch s | compile s | " + " | ".join(f"{int(b):,}" for b in buckets) + " |",
           "|---|---|---|" + "---|" * len(buckets)]

    def line(name, label, ranges):
        row = c[name]
        cells = [row["per_bucket"][b] for b in buckets]
        steps = [step_cell(x) if ranges or not x.get("step_s") else f"{x['step_s']:.2f}" for x in cells]
        return f"| {label} | {epoch_text(row)} | {row['compile_s']:.0f} | " + " | ".join(steps) + " |"
    out.append(line("auto", "`auto`", True))
    for k, name in enumerate(r["complete_statics"][:n]):
        out.append(line(name, f"`{name}`" + (" (best complete fixed plan)" if name == best else ""), k == 0))
    written = r.get("written_plans", [])  # --plans: written plans timed beside the others
    for name in written:
        out.append(line(name, f"`{name}` (written, `--plans`)", True))
    unbounded = r.get("unbounded_plans", [])  # --unbounded: timed over the budget too, for the ceiling
    for name in unbounded:
        out.append(line(name, f"`{name.removesuffix(NO_BUDGET)}` (no budget, `--unbounded`)", True))
    short = buckets[0]
    partial = [nm for nm in c if "@best" not in nm and nm != "auto" and nm not in written + unbounded and c[nm]["epoch_s"] is None
               and c[nm]["per_bucket"][short].get("step_s")]
    if partial:
        fastest = min(partial, key=lambda nm: c[nm]["per_bucket"][short]["step_s"])
        out.append(line(fastest, f"`{fastest}` ({int(short):,} only)", True))
    o = r["auto_overheads"]
    plans = ", ".join(f"`{row['auto_plan']}` ({int(b):,})" for b, row in r["regret"].items())
    regret = ", ".join(f"{row['regret']:+.1%} at {int(b):,}" for b, row in r["regret"].items()
                       if row["regret"] is not None)
    out += ["", f"`auto` picked {plans}. Overheads: calibration {o['calibrate_memory_s']:.0f} s (memory) + "
            f"{o['calibrate_time_s']:.0f} s (layer times), search {o['search_s']:.2f} s. Regret {regret}."]
    ceil = r.get("ceiling")
    if ceil:
        v, share = ceil["vs_best_complete_static"], ceil["auto_share_of_gap"]
        out.append("Ceiling (per bucket the fastest program timed, at any budget: " + ", ".join(
            f"`{x['plan']}` {x['bytes_per_device'] / 2**20:.1f} MiB ({int(b):,})" for b, x in ceil["per_bucket"].items())
            + f"): epoch {epoch_text(ceil)}, {v['median']:.2f}x ({v['range'][0]:.2f}-{v['range'][1]:.2f}) the best "
            "complete fixed plan" + (f"; `auto` closed {share:.0%} of that gap." if share is not None else "."))
    tm = (r.get("time_model") or {}).get("held_out_error")
    if tm:
        out.append("Time model on the held-out bucket (|predicted / measured step - 1|, median per strategy): "
                   + ", ".join(f"`{k}` {v['median']:.1%}" for k, v in tm.items()) + ".")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="JSON files written by dynamic_lengths.py")
    p.add_argument("--contenders", type=int, default=0, metavar="N",
                   help="also print each run's table: auto, the N fastest complete fixed plans, ...")
    args = p.parse_args(argv)
    runs = {}
    for path in args.results:
        with open(path) as fh:
            runs[path] = json.load(fh)
    calibration = max(r["auto_overheads"]["calibrate_memory_s"] + r["auto_overheads"]["calibrate_time_s"]
                      for r in runs.values())

    def text(r, paired=True):
        out = f"{r['median']:.2f}x ({r['range'][0]:.2f}-{r['range'][1]:.2f}){'' if r['apart'] else ', tie'}"
        if paired and r.get("paired"):
            lo, hi = r["paired"]["range"]
            out += f"; by round {r['paired']['median']:.2f}x ({lo:.2f}-{hi:.2f})"
        return out

    print(f"calibration charged to every row: {calibration:.0f} s (the largest measured)")
    print("| data, budget per device | `auto` epoch s | best fixed plan, epoch s | `auto` / fixed | with overheads |")
    print("|---|---|---|---|---|")
    for path, r in runs.items():
        best, auto = r["best_complete_static"], r["contenders"]["auto"]
        fixed = r["contenders"][best]
        charged = auto["compile_s"] + r["auto_overheads"]["search_s"] + calibration
        loaded = with_overheads(auto, charged)
        what = f"{r['data']}{', negative' if r.get('negative') else ''}, {r['budget_bytes'] / 2**20:.0f} MiB"
        print(f"| {what} | {epoch_text(auto)} | `{best}` {epoch_text(fixed)} | {text(ratio(fixed, auto))} | "
              f"{text(ratio(with_overheads(fixed, fixed['compile_s']), loaded), paired=False)} |")
    for path, r in runs.items() if args.contenders else ():
        print(f"\n{path}: {r['data']}{', negative' if r.get('negative') else ''}, "
              f"{r['budget_bytes'] / 2**20:.0f} MiB per device, code {r['provenance']['commit'][:7]}\n")
        print("\n".join(contender_table(r, args.contenders)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
