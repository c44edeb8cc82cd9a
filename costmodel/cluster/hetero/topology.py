"""Topology designer: the order in which device groups form the pipeline.

Every group becomes `count / width` consecutive stages (its devices share NVLink); the order of
the groups decides which links the stage boundaries cross. An order costs the flow-shop time of
its boundary transfers, sum + (m - 1) max (one micro-batch's activations over `min(width)`
device pairs per boundary): the fill latency plus the slowest link's share of the steady state.
Exhaustive over group orders up to `EXHAUSTIVE` groups, greedy nearest-neighbour beyond.
Orders with the same signature (device kinds, widths and link speeds along the pipeline) are
equivalent and kept once; the planner partitions layers on each returned order.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

from costmodel.cluster.hetero.cluster import Group, HeteroCluster
from costmodel.cluster.pipeline import flowshop_time, transfer_time

__all__ = ["Unit", "units", "boundary_times", "order_cost", "candidate_orders"]

EXHAUSTIVE = 7


@dataclass(frozen=True)
class Unit:
    """One stage's devices: `width` devices of `group` from index `start`."""

    group: Group
    start: int
    width: int


def units(order: Sequence[Group], widths: dict) -> list:
    """The stages of groups in this order, each group split into slices of `widths[device profile]`."""
    return [Unit(g, i, widths[g.device]) for g in order for i in range(0, g.count, widths[g.device])]


def boundary_times(cluster: HeteroCluster, stages: Sequence[Unit], nbytes: float) -> list:
    """Seconds to move `nbytes` across each boundary k -> k + 1."""
    out = []
    for a, b in zip(stages, stages[1:]):
        link = cluster.link(a.group, b.group)
        out.append(transfer_time(nbytes / min(a.width, b.width), link.bandwidth, link.latency))
    return out


def order_cost(cluster: HeteroCluster, order: Sequence[Group], widths: dict, nbytes: float, m: int) -> float:
    """Flow-shop time of this order's boundary transfers."""
    c = boundary_times(cluster, units(order, widths), nbytes)
    return float(flowshop_time(c, m)) if c else 0.0


def _greedy(cluster: HeteroCluster, widths: dict, nbytes: float, m: int) -> list:
    orders = []
    for start in cluster.groups:
        order, left = [start], [g for g in cluster.groups if g is not start]
        while left:
            nxt = min(left, key=lambda g: order_cost(cluster, [order[-1], g], widths, nbytes, m))
            order.append(nxt)
            left.remove(nxt)
        orders += [order, order[::-1]]
    return orders


def candidate_orders(cluster: HeteroCluster, widths: dict, nbytes: float, m: int, tolerance: float = 0.05,
                     limit: int = 8) -> list:
    """Distinct group orders within `tolerance` of the least boundary-transfer time, best first."""
    groups = cluster.groups
    orders = (itertools.permutations(groups) if len(groups) <= EXHAUSTIVE
              else _greedy(cluster, widths, nbytes, m))
    seen, scored = set(), []
    for order in orders:
        stages = units(order, widths)
        sig = (tuple((u.group.device.name, u.width) for u in stages),
               tuple(cluster.link(a.group, b.group) for a, b in zip(stages, stages[1:])))
        if sig not in seen:
            seen.add(sig)
            scored.append((order_cost(cluster, order, widths, nbytes, m), tuple(order)))
    scored.sort(key=lambda x: x[0])
    best = scored[0][0]
    return [o for c, o in scored if c <= best * (1 + tolerance) + 1e-15][:limit]
