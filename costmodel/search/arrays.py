"""A cost table's numbers as float arrays, and what a per-layer plan costs by them.

The search reads a `costmodel.table.CostTable` (duck-typed: `choices`, `n_layers`,
`layer_time_s`, `layer_stored_bytes`, `layer_peak_bytes`, `base_bytes`, `base_time_s`,
`switch_time_s`, `switch_bytes`) and returns one choice index per layer. The cost of a plan
c = (c_0 .. c_{L-1}) is the table's:

    bytes(c) = base_bytes + sum_l stored[c_l] + max_l (peak[c_l] + switch_bytes[c_{l-1}, c_l])
    time(c)  = base_time  + sum_l time[c_l]   + sum_{l>=1} switch_time[c_{l-1}, c_l]

(layer 0 has no incoming switch). All figures are model predictions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["TableArrays", "table_arrays", "evaluate", "subset", "plan_transient", "plan_time", "leanest_uniform",
           "fewest_bytes_plan"]


@dataclass(frozen=True)
class TableArrays:
    """The numbers of one cost table as float arrays (K choices, L layers)."""

    t: np.ndarray  # [K] layer time
    w: np.ndarray  # [K] stored bytes
    pk: np.ndarray  # [K] transient bytes while the layer runs
    swt: np.ndarray  # [K, K] switch time i -> j
    swb: np.ndarray  # [K, K] switch transient bytes i -> j
    L: int
    base_b: float
    base_t: float

    @property
    def K(self) -> int:
        return len(self.t)

    @property
    def transient(self) -> np.ndarray:
        """[K, K]: transient bytes of layer l+1 running j after layer l ran i."""
        return self.pk[None, :] + self.swb


def table_arrays(table) -> TableArrays:
    """The arrays of a cost table."""
    k = len(table.choices)
    return TableArrays(
        t=np.asarray(table.layer_time_s, dtype=float).reshape(k),
        w=np.asarray(table.layer_stored_bytes, dtype=float).reshape(k),
        pk=np.asarray(table.layer_peak_bytes, dtype=float).reshape(k),
        swt=np.asarray(table.switch_time_s, dtype=float).reshape(k, k),
        swb=np.asarray(table.switch_bytes, dtype=float).reshape(k, k),
        L=int(table.n_layers), base_b=float(table.base_bytes), base_t=float(table.base_time_s))


def evaluate(a: TableArrays, per_layer: Sequence[int]) -> tuple[float, float]:
    """(time_s, bytes) of a per-layer plan, as the table defines them (bytes rounded to whole
    bytes as `CostTable.plan_bytes` does, so a budget equal to a plan's bytes admits it here too)."""
    idx = np.asarray(per_layer, dtype=int)
    if idx.size == 0:
        return a.base_t, a.base_b
    tr = a.pk[idx].copy()
    tr[1:] += a.swb[idx[:-1], idx[1:]]
    time = a.base_t + a.t[idx].sum() + (a.swt[idx[:-1], idx[1:]].sum() if idx.size > 1 else 0.0)
    return float(time), float(round(a.base_b + a.w[idx].sum() + tr.max()))


def subset(a: TableArrays, keep: np.ndarray) -> TableArrays:
    """The table restricted to the choices `keep` (in that order)."""
    return TableArrays(t=a.t[keep], w=a.w[keep], pk=a.pk[keep], swt=a.swt[np.ix_(keep, keep)],
                       swb=a.swb[np.ix_(keep, keep)], L=a.L, base_b=a.base_b, base_t=a.base_t)


def plan_transient(a: TableArrays, idx: np.ndarray) -> float:
    """The largest transient of a per-layer plan (layer 0: its peak; then peak + switch bytes)."""
    tr = float(a.pk[idx[0]])
    if idx.size > 1:
        tr = max(tr, float((a.pk[idx[1:]] + a.swb[idx[:-1], idx[1:]]).max()))
    return tr


def plan_time(a: TableArrays, plan) -> float:
    """A plan's time without the table's base time."""
    return evaluate(a, plan)[0] - a.base_t


def leanest_uniform(a: TableArrays) -> int:
    """Index of the choice whose all-layers plan needs the fewest bytes (ties: faster)."""
    nbytes = a.L * a.w + a.pk
    order = np.lexsort((a.t, nbytes))
    return int(order[0])


def fewest_bytes_plan(a: TableArrays) -> list:
    """A plan with the fewest bytes (exact: over transient caps, the least stored path under the cap)."""
    L, tr = a.L, a.transient
    best, best_plan = np.inf, None
    for C in np.unique(np.concatenate([a.pk, tr.ravel()])):
        allowed = a.pk <= C
        if not allowed.any():
            continue
        cost = np.where(allowed, a.w, np.inf)
        A = np.where(tr <= C, 0.0, np.inf)
        cur, back = cost.copy(), []
        for _ in range(1, L):
            M = cur[:, None] + A
            arg = M.argmin(0)
            back.append(arg)
            cur = M[arg, np.arange(a.K)] + cost
        if cur.min() + C < best:
            j = int(cur.argmin())
            plan = [j]
            for arg in reversed(back):
                j = int(arg[j])
                plan.append(j)
            best, best_plan = cur.min() + C, plan[::-1]
    return best_plan if best_plan is not None else [leanest_uniform(a)] * L


def byte_limit(budget_bytes: float) -> float:
    """The largest unrounded byte count that fits `budget_bytes` once rounded to whole bytes (a
    plan's bytes are whole bytes, `CostTable.plan_bytes`): searches that sum bytes in floats
    compare against this, so a budget equal to a plan's bytes admits that plan."""
    return float(np.floor(budget_bytes)) + 0.5
