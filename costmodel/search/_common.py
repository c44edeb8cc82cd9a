"""Shared pieces of the per-bucket plan search: the result type and plan evaluation.

The search reads a `costmodel.table.CostTable` (duck-typed: `choices`, `n_layers`,
`layer_time_s`, `layer_stored_bytes`, `layer_peak_bytes`, `base_bytes`, `base_time_s`,
`switch_time_s`, `switch_bytes`) and returns one choice index per layer. The cost of a plan
c = (c_0 .. c_{L-1}) is the table's:

    bytes(c) = base_bytes + sum_l stored[c_l] + max_l (peak[c_l] + switch_bytes[c_{l-1}, c_l])
    time(c)  = base_time  + sum_l time[c_l]   + sum_{l>=1} switch_time[c_{l-1}, c_l]

(layer 0 has no incoming switch). All figures are model predictions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np


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


def arrays(table) -> TableArrays:
    k = len(table.choices)
    return TableArrays(
        t=np.asarray(table.layer_time_s, dtype=float).reshape(k),
        w=np.asarray(table.layer_stored_bytes, dtype=float).reshape(k),
        pk=np.asarray(table.layer_peak_bytes, dtype=float).reshape(k),
        swt=np.asarray(table.switch_time_s, dtype=float).reshape(k, k),
        swb=np.asarray(table.switch_bytes, dtype=float).reshape(k, k),
        L=int(table.n_layers), base_b=float(table.base_bytes), base_t=float(table.base_time_s))


def evaluate(a: TableArrays, per_layer: Sequence[int]) -> tuple[float, float]:
    """(time_s, bytes) of a per-layer plan, as the table defines them."""
    idx = np.asarray(per_layer, dtype=int)
    if idx.size == 0:
        return a.base_t, a.base_b
    tr = a.pk[idx].copy()
    tr[1:] += a.swb[idx[:-1], idx[1:]]
    time = a.base_t + a.t[idx].sum() + (a.swt[idx[:-1], idx[1:]].sum() if idx.size > 1 else 0.0)
    return float(time), float(a.base_b + a.w[idx].sum() + tr.max())


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


@dataclass(frozen=True)
class SearchResult:
    """A per-layer plan for one bucket and what the cost table predicts for it.

    per_layer: choice index per layer (into the table's `choices`); choices: the Choice per
    layer; time_s / bytes: predicted step time and per-device bytes (model predictions);
    fits: bytes <= budget_bytes (when False, the plan is the closest (leanest) one found);
    method: which rule produced it (e.g. `paradyse:fastest`, `paradyse:two-segment`,
    `paradyse:leanest`, `paradyse:smoothed`, `exact` (label search), `dp`, `milp`); optimal: proven optimal for the
    table's objective; search_s: wall seconds the search took; info: method details.
    """

    per_layer: tuple[int, ...]
    choices: tuple[Any, ...]
    time_s: float
    bytes: float
    budget_bytes: float
    fits: bool
    method: str
    optimal: bool = False
    search_s: float = 0.0
    info: dict = field(default_factory=dict, compare=False)

    def plan(self):
        """The plan as `sharding.plan.Plan` runs (equal neighbours merged)."""
        from sharding.plan import compress
        return compress([c.strategy for c in self.choices], [getattr(c, "remat", None) for c in self.choices])

    @property
    def plan_id(self) -> str:
        return self.plan().id

    def summary(self) -> str:
        return (f"{self.method}: {self.plan_id}  time {self.time_s * 1e3:.3f} ms  bytes {self.bytes / 2**30:.3f} GiB"
                f" / {self.budget_bytes / 2**30:.3f} GiB  {'fits' if self.fits else 'DOES NOT FIT'}")


def make_result(table, a: TableArrays, per_layer: Sequence[int], budget: float, method: str, *,
                optimal: bool = False, search_s: float = 0.0, info: Optional[dict] = None) -> SearchResult:
    idx = tuple(int(i) for i in per_layer)
    time, nbytes = evaluate(a, idx)
    nbytes = float(round(nbytes))  # whole bytes, as CostTable.plan_bytes
    return SearchResult(per_layer=idx, choices=tuple(table.choices[i] for i in idx), time_s=time, bytes=nbytes,
                        budget_bytes=float(budget), fits=bool(nbytes <= budget), method=method, optimal=optimal,
                        search_s=search_s, info=dict(info or {}))


def leanest_uniform(a: TableArrays) -> int:
    """Index of the choice whose all-layers plan needs the fewest bytes (ties: faster)."""
    nbytes = a.L * a.w + a.pk
    order = np.lexsort((a.t, nbytes))
    return int(order[0])


class ConstraintRows:
    """Sparse rows lb <= sum_i v_i x_{c_i} <= ub, built one at a time for `scipy.optimize.milp`."""

    def __init__(self):
        self.rows, self.cols, self.vals, self.lo, self.hi = [], [], [], [], []

    def add(self, cols: Sequence[int], vals: Sequence[float], lb: float, ub: float) -> None:
        r = len(self.lo)
        self.rows.extend([r] * len(cols))
        self.cols.extend(cols)
        self.vals.extend(vals)
        self.lo.append(lb)
        self.hi.append(ub)

    def constraint(self, n_vars: int):
        """The rows as one `scipy.optimize.LinearConstraint` over `n_vars` variables."""
        from scipy.optimize import LinearConstraint
        from scipy.sparse import coo_matrix
        A = coo_matrix((self.vals, (self.rows, self.cols)), shape=(len(self.lo), n_vars)).tocsr()
        return LinearConstraint(A, self.lo, self.hi)
