"""HPH planner: topology, partition and recompute-aware schedule for a heterogeneous cluster.

For every choice of stage width per device kind (powers of two dividing the kind's group sizes)
the topology designer proposes group orders, the partitioner assigns layers by DP, and each
candidate's iteration is predicted exactly for its schedule (`costmodel.cluster.pipeline.iteration_time`);
the fastest that fits wins. Baselines, predicted the same way, each with the stage widths that
are best for it at the true speeds (as a user tuning that knob would pick):
  even_split        groups in file order, layers split evenly, one stage width for all devices;
  even_split_tuned  the same with a width per device kind (more devices per stage for the slow
                    kind balances speed a little without moving layers);
  homogeneous       the same designer and DP as HPH, one stage width, believing every device
                    runs at the cluster's mean peak FLOP/s (memory and links known).
The planner also weighs the baselines' plans, so it is never slower than any of them.
All figures are model predictions (simulated), not measurements.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import cached_property
from typing import Sequence

from costmodel.cluster.hetero.cluster import HeteroCluster
from costmodel.cluster.hetero.partition import Partition, assign, even_bounds, partition
from costmodel.cluster.hetero.recompute import RecomputeReport, recompute_report
from costmodel.cluster.hetero.simulate import SimResult, simulate
from costmodel.cluster.hetero.stage import stage_options
from costmodel.cluster.hetero.topology import Unit, boundary_times, candidate_orders, units
from costmodel.cluster.pipeline import boundary_bytes, in_flight, iteration_time
from costmodel.cluster.workload import ClusterError, Model, Workload

__all__ = ["HeteroPlan", "plan_hetero", "evaluate", "width_choices"]

WIDTHS = (1, 2, 4, 8, 16)  # devices per stage


@dataclass
class HeteroPlan:
    """A placement (stage -> devices), partition (stage -> layers) and schedule, with its prediction."""

    name: str
    cluster: HeteroCluster
    model: Model
    workload: Workload
    schedule: str
    stages: tuple  # Units
    partition: Partition
    send_s: tuple
    predicted_iteration_s: float
    baselines: dict = field(default_factory=dict)
    source: str = ""  # which candidate set the plan came from (the planner also weighs the baselines')

    @cached_property
    def recompute(self) -> RecomputeReport:
        """Whether the recompute of memory-poor stages hides in their bubbles."""
        return recompute_report(self.partition.costs, self.send_s, self.workload.microbatches, self.schedule)

    @property
    def fits(self) -> bool:
        return self.partition.fits

    @property
    def throughput_tokens_per_s(self) -> float:
        return self.workload.tokens / self.predicted_iteration_s

    def peak_bytes(self) -> list:
        p = len(self.stages)
        return [c.peak_bytes(in_flight(k, p, self.workload.microbatches, self.schedule))
                for k, c in enumerate(self.partition.costs)]

    def simulate(self) -> SimResult:
        """Replay this plan in the event-driven simulator."""
        return simulate(self.partition.costs, self.send_s, self.workload.microbatches, self.schedule)

    def to_json(self) -> dict:
        sim = self.simulate()
        stages = []
        for k, (u, (i, j), c) in enumerate(zip(self.stages, self.partition.bounds, self.partition.costs)):
            stages.append({
                "stage": k, "group": u.group.name, "node": u.group.node, "devices": [u.start, u.start + u.width],
                "n_devices": u.width, "device_kind": u.group.device.name, "mode": f"{c.mode}{u.width}",
                "layers": [i, j], "n_layers": j - i, "recompute": c.recompute, "stage_time_s": c.time_s,
                "sync_s": c.sync_s, "peak_bytes": sim.peak_bytes[k],
                "memory_bytes": self.cluster.memory_fraction * u.group.device.memory_bytes,
                "bubble_s": sim.bubble_s[k]})
        out = {
            "name": self.name, "source": self.source or self.name, "cluster": self.cluster.name,
            "n_devices": self.cluster.n_devices,
            "model": self.model.name, "schedule": self.schedule, "microbatches": self.workload.microbatches,
            "micro_batch": self.workload.micro_batch, "seq_len": self.workload.seq_len,
            "global_batch": self.workload.global_batch, "fits": self.fits, "stages": stages,
            "predicted_iteration_s": self.predicted_iteration_s, "simulated_iteration_s": sim.iteration_s,
            "bubble_fraction": sim.bubble_fraction, "throughput_tokens_per_s": self.throughput_tokens_per_s,
            "recompute": {"stages": list(self.recompute.stages), "extra_s": self.recompute.extra_s,
                          "hidden": self.recompute.hidden, "summary": self.recompute.describe()},
            "note": "model predictions (simulated), not measurements",
        }
        if self.baselines:
            out["baselines"] = {name: {**b.to_json(), "speedup": b.predicted_iteration_s / self.predicted_iteration_s}
                                for name, b in self.baselines.items()}
        return out


def evaluate(cluster: HeteroCluster, model: Model, wl: Workload, stages: Sequence[Unit], part: Partition,
             schedule: str, name: str) -> HeteroPlan:
    """Predict a placement + partition's iteration exactly (max-plus over its schedule)."""
    send = tuple(boundary_times(cluster, stages, boundary_bytes(wl.micro_batch, wl.seq_len, model.spec.d_model,
                                                                model.act_bytes)))
    c = part.costs
    t = iteration_time([x.fwd_s for x in c], [x.bwd_s for x in c], send, wl.microbatches, schedule,
                       [x.recompute_s for x in c], [x.sync_s for x in c])
    return HeteroPlan(name, cluster, model, wl, schedule, tuple(stages), part, send, t)


def width_choices(cluster: HeteroCluster, model: Model, wl: Workload, uniform: bool = False) -> list:
    """Every {device kind: stage width}: powers of two dividing all of the kind's group sizes
    (`uniform`: one width for every kind)."""
    per_kind = {}
    for g in cluster.groups:
        per_kind.setdefault(g.device, []).append(g.count)

    def fits(w, counts, devices):
        return all(c % w == 0 for c in counts) and all(stage_options(model, wl, d, w) for d in devices)

    if uniform:
        every = [c for counts in per_kind.values() for c in counts]
        return [dict.fromkeys(per_kind, w) for w in WIDTHS if fits(w, every, per_kind)]
    options = [[(dev, w) for w in WIDTHS if fits(w, counts, [dev])] for dev, counts in per_kind.items()]
    return [dict(combo) for combo in itertools.product(*options)]


def _best(plans):
    plans = [p for p in plans if p is not None]
    fitting = [p for p in plans if p.fits]
    return min(fitting or plans, key=lambda p: p.predicted_iteration_s, default=None)


def _designed(cluster, model, wl, schedule, name, flops=None, uniform=False):
    """Designer + DP over the width choices; with `flops`, partitioned as if every device ran at it
    (then predicted at the true speeds)."""
    plans = []
    nbytes = boundary_bytes(wl.micro_batch, wl.seq_len, model.spec.d_model, model.act_bytes)
    for widths in width_choices(cluster, model, wl, uniform):
        for order in candidate_orders(cluster, widths, nbytes, wl.microbatches):
            stages = units(order, widths)
            part = partition(cluster, model, wl, stages, schedule, flops)
            if part is not None and flops is not None:
                part = assign(cluster, model, wl, stages, part.bounds, schedule)
            if part is not None:
                plans.append(evaluate(cluster, model, wl, stages, part, schedule, name))
    return _best(plans)


def _even(cluster, model, wl, schedule, name, uniform):
    plans = []
    for widths in width_choices(cluster, model, wl, uniform):
        stages = units(cluster.groups, widths)
        if len(stages) <= model.n_layers:
            part = assign(cluster, model, wl, stages, even_bounds(model.n_layers, len(stages)), schedule)
            plans.append(evaluate(cluster, model, wl, stages, part, schedule, name))
    return _best(plans)


def plan_hetero(cluster: HeteroCluster, model: Model, workload: Workload = Workload(),
                schedule: str = "1f1b") -> HeteroPlan:
    """The HPH plan for this model on this cluster, with the baselines in `.baselines`."""
    mean_flops = sum(g.device.flops * g.count for g in cluster.groups) / cluster.n_devices
    baselines = {"even_split": _even(cluster, model, workload, schedule, "even_split", uniform=True),
                 "even_split_tuned": _even(cluster, model, workload, schedule, "even_split_tuned", uniform=False),
                 "homogeneous": _designed(cluster, model, workload, schedule, "homogeneous", mean_flops, uniform=True)}
    hph = _designed(cluster, model, workload, schedule, "hph")
    best = _best([hph] + list(baselines.values()))
    if best is None:
        raise ClusterError(f"cluster {cluster.name}: every stage layout has more stages than {model.name}'s "
                           f"{model.n_layers} layers; give fewer, larger device groups")
    if not best.fits:
        k, peak = max(enumerate(best.peak_bytes()), key=lambda x: x[1] / best.stages[x[0]].group.device.memory_bytes)
        g = best.stages[k].group
        raise ClusterError(f"model {model.name} ({model.n_layers} layers) does not fit on cluster "
                           f"{cluster.name} even with recompute (stage {k} on {g.device.name} needs "
                           f"{peak / 2**30:.1f} GiB of {cluster.memory_fraction * g.device.memory_bytes / 2**30:.1f} "
                           "usable); use more or larger devices, shorter sequences or fewer sequences per micro-batch")
    plan = evaluate(cluster, model, workload, best.stages, best.partition, schedule, "hph")
    plan.source = best.name
    plan.baselines = {k: v for k, v in baselines.items() if v is not None}
    return plan
