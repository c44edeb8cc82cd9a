"""Test oracle: per-layer plans of a cost table by HiGHS (`scipy.optimize.milp`), flow formulation.

Binary x[l, i] (layer l runs choice i, sum_i x = 1), continuous y[l, r, j] >= 0 with
sum_j y[l, r, j] = sum_{i in r} x[l, i] and sum_r y[l, r, j] = x[l+1, j] (y is then the
indicator of the transition, integral without being declared so), and a continuous
z >= every layer's transient (z >= pk[c_0], z >= pk[j] + swb[i, j] through y). The source rows
r are classes of choices with identical switch rows (time and transient; exact: y's costs
depend on i only through its row), so real tables with a few boundary layouts stay small.

    time(c)  = base_t + sum t x + sum swt y
    bytes(c) = base_b + sum w x + z

`milp_plan(table, budget)`: the fastest plan within the byte budget (must agree with
`costmodel.search.exact_plan`); `table_milp(table, minimise="bytes", max_time=T)`: the leanest
plan within a time budget (must agree with `costmodel.cluster.ilp.leanest_within`). Used by the
tests and benchmarks/search.py only. All figures are model predictions.
"""
from __future__ import annotations

import time as _time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from costmodel.cluster.rows import ConstraintRows
from costmodel.search import SearchResult, prune_exact, table_arrays
from costmodel.search.arrays import fewest_bytes_plan
from costmodel.search.result import search_result

__all__ = ["milp_plan", "MilpResult", "table_milp"]


@dataclass
class MilpResult:
    """The solver's plan (None: infeasible or no solution within the time limit)."""

    per_layer: Optional[list]
    optimal: bool
    info: dict = field(default_factory=dict)


def table_milp(table, *, minimise: str = "time", max_bytes: Optional[float] = None,
               max_time: Optional[float] = None, time_limit: float = 120.0, mip_rel_gap: float = 1e-9,
               choices: Optional[np.ndarray] = None) -> MilpResult:
    """The per-layer plan minimising `minimise` ("time" or "bytes") within `max_bytes` and
    `max_time` (either may be None: no limit), over `choices` (indices; default all)."""
    from scipy.optimize import Bounds, milp

    if minimise not in ("time", "bytes"):
        raise ValueError(f"minimise must be 'time' or 'bytes', got {minimise!r}")
    full = table_arrays(table)
    keep = np.arange(full.K) if choices is None else np.asarray(choices, dtype=int)
    t, w, pk = full.t[keep], full.w[keep], full.pk[keep]
    swt, tr = full.swt[np.ix_(keep, keep)], full.transient[np.ix_(keep, keep)]
    L, K = full.L, len(keep)
    _, first, inv = np.unique(np.concatenate([swt, tr], axis=1), axis=0, return_index=True, return_inverse=True)
    inv, rep = np.asarray(inv).ravel(), np.asarray(first)
    R = len(rep)
    # scaling: bytes relative to the largest layer, time relative to the fastest layer
    bscale = max(float(max_bytes or 0.0), float(w.max() + pk.max()), 1.0)
    tscale = max(float(t.min()), 1e-30)
    nx, ny = L * K, max(L - 1, 0) * R * K
    nz = nx + ny
    nv = nz + 1

    def X(l, i):
        return l * K + i

    def Y(l, r, j):
        return nx + (l * R + r) * K + j

    t_coef, b_coef = np.zeros(nv), np.zeros(nv)
    t_coef[:nx] = np.tile(t / tscale, L)
    for l in range(L - 1):
        t_coef[Y(l, 0, 0):Y(l, 0, 0) + R * K] = (swt[rep] / tscale).ravel()
    b_coef[:nx] = np.tile(w / bscale, L)
    b_coef[nz] = 1.0
    rows = ConstraintRows()
    add = rows.add
    for l in range(L):
        add([X(l, i) for i in range(K)], [1.0] * K, 1.0, 1.0)
    for l in range(L - 1):
        for g in range(R):
            members = np.flatnonzero(inv == g)
            add([Y(l, g, j) for j in range(K)] + [X(l, int(i)) for i in members], [1.0] * K + [-1.0] * len(members),
                0.0, 0.0)
        for j in range(K):
            add([Y(l, g, j) for g in range(R)] + [X(l + 1, j)], [1.0] * R + [-1.0], 0.0, 0.0)
        add([Y(l, g, j) for g in range(R) for j in range(K)] + [nz],  # z >= transient of layer l+1
            [tr[rep[g], j] / bscale for g in range(R) for j in range(K)] + [-1.0], -np.inf, 0.0)
    if L:
        add([X(0, i) for i in range(K)] + [nz], list(pk / bscale) + [-1.0], -np.inf, 0.0)
    if max_bytes is not None:
        nzc = np.flatnonzero(b_coef)
        add(list(nzc), list(b_coef[nzc]), -np.inf, (float(max_bytes) - full.base_b) / bscale)
    if max_time is not None:
        nzc = np.flatnonzero(t_coef)
        add(list(nzc), list(t_coef[nzc]), -np.inf, (float(max_time) - full.base_t) / tscale)
    integrality = np.zeros(nv)
    integrality[:nx] = 1
    res = milp(t_coef if minimise == "time" else b_coef, constraints=rows.constraint(nv), integrality=integrality,
               bounds=Bounds(np.zeros(nv), np.concatenate([np.ones(nz), [np.inf]])),
               options={"time_limit": time_limit, "mip_rel_gap": mip_rel_gap, "presolve": True})
    info = {"status": int(res.status), "message": str(res.message), "variables": int(nv), "constraints": len(rows.lo)}
    if res.x is None:
        return MilpResult(None, res.status == 2, {**info, "reason": "infeasible or no solution"})
    plan = [int(keep[i]) for i in res.x[:nx].reshape(L, K).argmax(1)]
    scale, base = (tscale, full.base_t) if minimise == "time" else (bscale, full.base_b)
    info["objective"] = float(res.fun * scale + base)
    return MilpResult(plan, res.status == 0, info)


def milp_plan(table, budget_bytes: float, *, prune: bool = False, time_limit: float = 120.0,
              mip_rel_gap: float = 1e-9) -> SearchResult:
    """The fastest per-layer plan within `budget_bytes` by HiGHS (method `milp`; nothing fits:
    the fewest-bytes plan, fits=False). prune: on the exactly pruned choices only."""
    t0 = _time.perf_counter()
    full = table_arrays(table)
    res = table_milp(table, minimise="time", max_bytes=budget_bytes, time_limit=time_limit, mip_rel_gap=mip_rel_gap,
                     choices=prune_exact(full) if prune else None)
    plan = res.per_layer if res.per_layer is not None else fewest_bytes_plan(full)
    info = dict(res.info)
    if "objective" in info:
        info["objective_s"] = info.pop("objective")
    return search_result(table, full, plan, budget_bytes, "milp", optimal=res.optimal,
                         search_s=_time.perf_counter() - t0, info=info)
