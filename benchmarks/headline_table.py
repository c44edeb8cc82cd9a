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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="JSON files written by dynamic_lengths.py")
    args = p.parse_args(argv)
    from dynamic_lengths import ratio, with_overheads
    runs = {}
    for path in args.results:
        with open(path) as fh:
            runs[path] = json.load(fh)
    calibration = max(r["auto_overheads"]["calibrate_memory_s"] + r["auto_overheads"]["calibrate_time_s"]
                      for r in runs.values())

    def epoch(row):
        lo, hi = row["epoch_s_range"]
        return f"{row['epoch_s']:,.0f} [{lo:,.0f}-{hi:,.0f}]"

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
        print(f"| {what} | {epoch(auto)} | `{best}` {epoch(fixed)} | {text(ratio(fixed, auto))} | "
              f"{text(ratio(with_overheads(fixed, fixed['compile_s']), loaded), paired=False)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
