"""Command line of the cost model.

    python -m costmodel hetero --cluster FILE --config MODEL_CONFIG [--seq-len N] [--global-batch N]
                               [--microbatches N] [--schedule 1f1b|gpipe] [--json]

Bad input prints one line `error: ...` on stderr and exits with status 2.
"""
from __future__ import annotations

import argparse
import json
import sys

from costmodel.cluster import ClusterError, Workload, load_model
from costmodel.cluster.hetero import load_cluster, plan_hetero
from costmodel.cluster.pipeline import SCHEDULES


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m costmodel", description="dysejax cost model and planners")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)
    h = sub.add_parser("hetero", help="HPH pipeline plan for a heterogeneous cluster")
    d = Workload()
    h.add_argument("--cluster", required=True, help="cluster description YAML (see configs/clusters/)")
    h.add_argument("--config", required=True, help="dysejax config whose model: section gives the shape")
    h.add_argument("--seq-len", type=int, default=d.seq_len)
    h.add_argument("--global-batch", type=int, default=d.global_batch, help="sequences per iteration")
    h.add_argument("--microbatches", type=int, default=d.microbatches, help="micro-batches per iteration")
    h.add_argument("--schedule", choices=SCHEDULES, default="1f1b")
    h.add_argument("--json", action="store_true", help="print the plan as JSON")
    return ap


def _table(plan) -> str:
    sim = plan.simulate()
    wl = plan.workload
    lines = [f"HPH plan for {plan.model.name} on {plan.cluster.name} ({plan.cluster.n_devices} devices): "
             f"{plan.schedule}, {wl.microbatches} micro-batches of {wl.micro_batch} x {wl.seq_len} tokens "
             "(model predictions, simulated)",
             f"{'stage':>5}  {'group':<10} {'devices':<8} {'kind':<10} {'mode':<8} {'layers':<9} "
             f"{'recompute':<9} {'time/mb':>9}  {'peak / usable GiB':>17}"]
    for s in plan.to_json()["stages"]:
        lines.append(f"{s['stage']:>5}  {s['group']:<10} {'%d-%d' % (s['devices'][0], s['devices'][1] - 1):<8} "
                     f"{s['device_kind']:<10} {s['mode']:<8} {'[%d, %d)' % tuple(s['layers']):<9} "
                     f"{'yes' if s['recompute'] else 'no':<9} {s['stage_time_s'] * 1e3:>7.2f}ms  "
                     f"{s['peak_bytes'] / 2**30:>7.1f} / {s['memory_bytes'] / 2**30:<7.1f}")
    lines.append(f"predicted iteration {plan.predicted_iteration_s:.4f} s (event simulator {sim.iteration_s:.4f} s), "
                 f"{plan.throughput_tokens_per_s:,.0f} tokens/s, bubble {100 * sim.bubble_fraction:.1f}%")
    lines.append(f"recompute: {plan.recompute.describe()}")
    lines.append("baselines:")
    for name, b in plan.baselines.items():
        lines.append(f"  {name:<12} {b.predicted_iteration_s:.4f} s  {b.throughput_tokens_per_s:>12,.0f} tokens/s  "
                     f"HPH speedup {b.predicted_iteration_s / plan.predicted_iteration_s:.2f}x  layers/stage "
                     f"{[j - i for i, j in b.partition.bounds]}{'' if b.fits else '  DOES NOT FIT'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        cluster = load_cluster(args.cluster)
        model = load_model(args.config)
        wl = Workload.split(args.seq_len, args.global_batch, args.microbatches)
        plan = plan_hetero(cluster, model, wl, args.schedule)
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(plan.to_json(), indent=1) if args.json else _table(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
