"""Partitioner: contiguous layers -> heterogeneous stages, by dynamic programming.

A stage's load is its busy time per iteration, m x (forward + recompute + backward) + its
optimizer update, for the cheapest option (strategy, recompute) that fits its device memory with
the schedule's in-flight micro-batches (1F1B: stage k keeps min(p - k, m)). The DP over
(stage, layers so far) first finds the least possible bottleneck load, then among partitions
within it the least total load (shorter fill and drain). Layers are identical, so a stage's cost
depends only on its layer count and whether it holds the embedding (first) or head (last).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Optional, Sequence

import numpy as np

from costmodel.cluster.hetero.cluster import HeteroCluster
from costmodel.cluster.hetero.stage import StageOptions, stage_options
from costmodel.cluster.hetero.topology import Unit
from costmodel.cluster.pipeline import in_flight
from costmodel.cluster.workload import Model, Workload

__all__ = ["Partition", "partition", "assign", "even_bounds"]


@dataclass(frozen=True)
class Partition:
    """Layers [start, end) and the chosen cost of each stage; `fits` when every stage fits."""

    bounds: tuple
    costs: tuple
    fits: bool


@lru_cache(maxsize=256)
def _options(model: Model, wl: Workload, device, width: int) -> tuple:
    """A stage kind's options with its load and byte terms as [option, n - 1, first, last] arrays."""
    opts = stage_options(model, wl, device, width)
    return opts, opts.load(), tuple(opts.field(f) for f in ("static_bytes", "act_bytes", "recompute_bytes"))


def _device(unit: Unit, flops: Optional[float]):
    """The stage's device, or one believed to run at `flops` (memory and links as they are)."""
    dev = unit.group.device
    return dev if flops is None else replace(dev, flops=flops)


def _choice(model, wl, unit: Unit, inflight: int, limit: float, flops):
    """Per (n - 1, first, last): the least load of a fitting option (inf if none) and its index."""
    _, load, (static, act, rec) = _options(model, wl, _device(unit, flops), unit.width)
    masked = np.where(static + inflight * act + rec <= limit, load, np.inf)
    return masked.min(axis=0), masked.argmin(axis=0)


def _limit(cluster: HeteroCluster, unit: Unit) -> float:
    return cluster.memory_fraction * unit.group.device.memory_bytes


def partition(cluster: HeteroCluster, model: Model, wl: Workload, stages: Sequence[Unit], schedule: str,
              flops: float | None = None) -> Partition | None:
    """The min-bottleneck, then min-total-load contiguous partition; None if nothing fits.

    flops: one peak FLOP/s for every device (the homogeneous-speed planner), default each
    device's own."""
    L, p = model.n_layers, len(stages)
    if p > L:
        return None
    idx = np.arange(L + 1)
    n = idx[None, :] - idx[:, None]  # layers of a stage [i, j)
    valid = n >= 1
    nn = np.clip(n - 1, 0, L - 1)
    first = ((idx[:, None] == 0) & valid).astype(int)
    last = ((idx[None, :] == L) & valid).astype(int)
    C, pick = [], []
    for k, u in enumerate(stages):
        best, arg = _choice(model, wl, u, in_flight(k, p, wl.microbatches, schedule), _limit(cluster, u), flops)
        C.append(np.where(valid, best[nn, first, last], np.inf))
        pick.append(arg[nn, first, last])
    top = np.full(L + 1, np.inf)
    top[0] = 0.0
    for Ck in C:
        top = np.maximum(top[:, None], Ck).min(axis=0)
    bound = top[L]
    if not np.isfinite(bound):
        return None
    total, back = np.full(L + 1, np.inf), []
    total[0] = 0.0
    for Ck in C:
        cand = total[:, None] + np.where(Ck <= bound * (1 + 1e-12), Ck, np.inf)
        back.append(cand.argmin(axis=0))
        total = cand.min(axis=0)
    ends, j = [], L
    for k in range(p - 1, -1, -1):
        i = int(back[k][j])
        ends.append((i, j))
        j = i
    bounds = tuple(reversed(ends))
    costs = []
    for k, (i, j) in enumerate(bounds):
        opts = _options(model, wl, _device(stages[k], flops), stages[k].width)[0]
        costs.append(opts.cost(int(pick[k][i, j]), j - i, i == 0, j == L))
    return Partition(bounds, tuple(costs), True)


def even_bounds(n_layers: int, p: int) -> tuple:
    """Layers split as evenly as possible, the first stages taking the remainder."""
    q, r = divmod(n_layers, p)
    sizes = [q + (k < r) for k in range(p)]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    return tuple((int(starts[k]), int(starts[k + 1])) for k in range(p))


def assign(cluster: HeteroCluster, model: Model, wl: Workload, stages: Sequence[Unit], bounds: Sequence[tuple],
           schedule: str) -> Partition:
    """Given layers per stage, each stage's cheapest fitting option (or, if none fits, its leanest)."""
    L, p = model.n_layers, len(stages)
    costs, fits = [], True
    for k, ((i, j), u) in enumerate(zip(bounds, stages)):
        inflight = in_flight(k, p, wl.microbatches, schedule)
        opts: StageOptions = _options(model, wl, u.group.device, u.width)[0]
        every = [opts.cost(o, j - i, i == 0, j == L) for o in range(len(opts.options))]
        ok = [c for c in every if c.peak_bytes(inflight) <= _limit(cluster, u)]
        if ok:
            costs.append(min(ok, key=lambda c: wl.microbatches * c.time_s + c.sync_s))
        else:
            fits = False
            costs.append(min(every, key=lambda c: c.peak_bytes(inflight)))
    return Partition(tuple(bounds), tuple(costs), fits)
