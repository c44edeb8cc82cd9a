"""Partitioner: contiguous layers -> heterogeneous stages, by dynamic programming.

A stage's load is its busy time per iteration, m x (forward + recompute + backward) + gradient
sync, for the cheapest in-stage mode and recompute choice that fits its device memory with the
schedule's in-flight micro-batches (1F1B: stage k keeps min(p - k, m)). The DP over
(stage, layers so far) first finds the least possible bottleneck load, then among partitions
within it the least total load (shorter fill and drain). Layers are identical, so a stage's cost
depends only on its layer count and whether it holds the embedding (first) or head (last).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from costmodel.hetero.cluster import Cluster
from costmodel.hetero.stage import modes, stage_cost
from costmodel.hetero.topology import Unit
from costmodel.hetero.workload import Workload
from costmodel.pipeline import in_flight
from costmodel.search.ilp import ModelShape

__all__ = ["Partition", "partition", "assign", "even_bounds"]


@dataclass(frozen=True)
class Partition:
    """Layers [start, end) and the chosen cost of each stage; `fits` when every stage fits."""

    bounds: tuple
    costs: tuple
    fits: bool


@lru_cache(maxsize=256)
def _options(model: ModelShape, wl: Workload, device, rate: float, width: int) -> tuple:
    """Every (mode, recompute) cost of one kind of stage, indexed [option][n - 1][first][last],
    with its load and byte terms as arrays of that shape."""
    costs = [[[[stage_cost(model, wl, device, rate, width, n, bool(f), bool(la), md, rec) for la in (0, 1)]
               for f in (0, 1)] for n in range(1, model.n_layers + 1)]
             for md in modes(model, wl, width) for rec in (False, True)]

    def arr(get):
        return np.array([[[[get(c) for c in by_last] for by_last in by_first] for by_first in by_n]
                         for by_n in costs])

    load = arr(lambda c: wl.microbatches * c.time_s + c.sync_s)
    return costs, load, (arr(lambda c: c.static_bytes), arr(lambda c: c.act_bytes), arr(lambda c: c.recompute_bytes))


def _choice(model, wl, unit: Unit, inflight: int, limit: float, rate):
    """Per (n - 1, first, last): the least load of a fitting option (inf if none) and its index."""
    _, load, (static, act, rec) = _options(model, wl, unit.group.device, rate or unit.group.rate, unit.width)
    masked = np.where(static + inflight * act + rec <= limit, load, np.inf)
    return masked.min(axis=0), masked.argmin(axis=0)


def _limit(cluster: Cluster, unit: Unit) -> float:
    return cluster.memory_fraction * unit.group.device.memory_bytes


def partition(cluster: Cluster, model: ModelShape, wl: Workload, stages: Sequence[Unit], schedule: str,
              rate: float | None = None) -> Partition | None:
    """The min-bottleneck, then min-total-load contiguous partition; None if nothing fits.

    rate: one FLOP/s per device for every stage (the homogeneous-speed planner), default each
    group's own."""
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
        best, arg = _choice(model, wl, u, in_flight(k, p, wl.microbatches, schedule), _limit(cluster, u), rate)
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
        opt = int(pick[k][i, j])
        u = stages[k]
        options = _options(model, wl, u.group.device, rate or u.group.rate, u.width)[0]
        costs.append(options[opt][j - i - 1][i == 0][j == L])
    return Partition(bounds, tuple(costs), True)


def even_bounds(n_layers: int, p: int) -> tuple:
    """Layers split as evenly as possible, the first stages taking the remainder."""
    q, r = divmod(n_layers, p)
    sizes = [q + (k < r) for k in range(p)]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    return tuple((int(starts[k]), int(starts[k + 1])) for k in range(p))


def assign(cluster: Cluster, model: ModelShape, wl: Workload, stages: Sequence[Unit], bounds: Sequence[tuple],
           schedule: str) -> Partition:
    """Given layers per stage, each stage's cheapest fitting option (or, if none fits, its leanest)."""
    L, p = model.n_layers, len(stages)
    costs, fits = [], True
    for k, ((i, j), u) in enumerate(zip(bounds, stages)):
        inflight = in_flight(k, p, wl.microbatches, schedule)
        opts = [stage_cost(model, wl, u.group.device, u.group.rate, u.width, j - i, i == 0, j == L, md, rec)
                for md in modes(model, wl, u.width) for rec in (False, True)]
        ok = [c for c in opts if c.peak_bytes(inflight) <= _limit(cluster, u)]
        if ok:
            costs.append(min(ok, key=lambda c: wl.microbatches * c.time_s + c.sync_s))
        else:
            fits = False
            costs.append(min(opts, key=lambda c: c.peak_bytes(inflight)))
    return Partition(tuple(bounds), tuple(costs), fits)
