"""HPH planner vs baselines on the shipped heterogeneous clusters and model shapes.

Every figure is a MODEL PREDICTION replayed by the event-driven pipeline simulator
(`costmodel.cluster.hetero.simulate`), not a measurement on hardware. Stages are priced by the
shared cost table (`costmodel.table.cost_table`, via `costmodel.cluster.layers`).

    python benchmarks/hetero.py [--json benchmarks/results/hetero.json] [--schedules 1f1b gpipe]
"""
from __future__ import annotations

import argparse
import glob
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from costmodel.cluster import ClusterError, Workload, load_model  # noqa: E402
from costmodel.cluster.hetero import load_cluster, plan_hetero  # noqa: E402
from results_io import write_json  # noqa: E402  (the script's folder is on sys.path)

MODELS = ("1.3b", "7b", "13b")
NOTE = "model predictions replayed by the event-driven pipeline simulator, not measurements"


def run(schedules, workload: Workload) -> list:
    rows = []
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "clusters", "*.yaml"))):
        cluster = load_cluster(path)
        for name in MODELS:
            model = load_model(os.path.join(ROOT, "configs", f"{name}.yaml"))
            for schedule in schedules:
                t0 = time.perf_counter()
                try:
                    plan = plan_hetero(cluster, model, workload, schedule)
                except ClusterError as e:
                    rows.append({"cluster": cluster.name, "model": name, "schedule": schedule, "error": str(e)})
                    continue
                out = plan.to_json()
                out["search_s"] = time.perf_counter() - t0
                rows.append(out)
    return rows


def _layout(row) -> str:
    return " ".join(f"{s['device_kind'].split('-')[0]}:{s['mode']}x{s['n_layers']}{'r' if s['recompute'] else ''}"
                    for s in row["stages"])


def _vs(baseline) -> str:
    return (f"{baseline['speedup']:.2f}x ({baseline['simulated_iteration_s']:.2f} s)"
            f"{'' if baseline['fits'] else ' OOM'}")


def _recompute(row) -> str:
    r = row["recompute"]
    return "none" if not r["stages"] else "hidden" if r["hidden"] else f"+{r['extra_s']:.2f} s"


def table(rows) -> str:
    lines = ["| cluster | model | schedule | HPH iteration (simulated) | tokens/s | vs even split "
             "| vs even split, widths tuned | vs homogeneous | HPH stages (kind:mode x layers, r = recompute) "
             "| recompute |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head = f"| {r['cluster']} | {r['model']} | {r['schedule']} "
        if "error" in r:
            lines.append(head + "| does not fit | | | | | | |")
            continue
        b = r["baselines"]
        lines.append(head + f"| {r['simulated_iteration_s']:.2f} s | {r['throughput_tokens_per_s']:,.0f} "
                     f"| {_vs(b['even_split'])} | {_vs(b['even_split_tuned'])} | {_vs(b['homogeneous'])} "
                     f"| {_layout(r)} | {_recompute(r)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--schedules", nargs="+", default=["1f1b", "gpipe"], choices=["1f1b", "gpipe"])
    d = Workload()
    ap.add_argument("--seq-len", type=int, default=d.seq_len)
    ap.add_argument("--global-batch", type=int, default=d.global_batch)
    ap.add_argument("--microbatches", type=int, default=d.microbatches)
    args = ap.parse_args(argv)
    try:
        wl = Workload.split(args.seq_len, args.global_batch, args.microbatches)
    except ClusterError as e:
        ap.error(str(e))
    rows = run(args.schedules, wl)
    print(f"HPH vs baselines ({NOTE}); {wl.global_batch} sequences x {wl.seq_len} tokens per iteration in "
          f"{wl.microbatches} micro-batches")
    print(table(rows))
    for name in ("even_split", "even_split_tuned", "homogeneous"):
        x = [r["baselines"][name]["speedup"] for r in rows if "error" not in r]
        if x:
            print(f"HPH speedup over {name}: {min(x):.2f}x to {max(x):.2f}x")
    if args.json:
        write_json(args.json, {"note": NOTE, "platform": platform.platform(),
                               "workload": vars(args) | {"json": None}, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
