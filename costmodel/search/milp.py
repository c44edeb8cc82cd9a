"""The exact per-bucket optimum as a mixed-integer program, by `scipy.optimize.milp` (HiGHS):
the cross-check of `costmodel.search.exact.exact_plan`.

`milp_plan` — `scipy.optimize.milp` (HiGHS), the flow formulation: binary x[l, i] (layer l
  runs choice i, sum_i x = 1), continuous y[l, i, j] >= 0 with sum_j y[l, i, j] = x[l, i] and
  sum_i y[l, i, j] = x[l+1, j] (y is then the indicator of the transition, integral without
  being declared so), a continuous z >= every layer's transient, and
  base_b + sum w x + z <= budget. Switch time enters the objective through y. With
  `compress=True` the rows i of y are merged per class of identical switch rows (exact: the
  costs of y depend on i only through its row).

All figures are model predictions of the cost table.
"""
from __future__ import annotations

import time as _time

import numpy as np

from costmodel.search._common import ConstraintRows, SearchResult, arrays, make_result
from costmodel.search.exact import min_bytes_plan, prune_exact

__all__ = ["milp_plan"]

_INF = np.inf


def milp_plan(table, budget_bytes: float, *, prune: bool = False, compress: bool = True,
              time_limit: float = 120.0, mip_rel_gap: float = 1e-9) -> SearchResult:
    """The same optimum by `scipy.optimize.milp` (flow formulation; see module doc)."""
    from scipy.optimize import Bounds, milp

    t0 = _time.perf_counter()
    full = arrays(table)
    keep = prune_exact(full) if prune else np.arange(full.K)
    t, w, pk = full.t[keep], full.w[keep], full.pk[keep]
    swt, tr = full.swt[np.ix_(keep, keep)], full.transient[np.ix_(keep, keep)]
    L, K = full.L, len(keep)
    # classes of identical source rows (swt and transient) for y
    if compress:
        _, first, inv = np.unique(np.concatenate([swt, tr], axis=1), axis=0, return_index=True, return_inverse=True)
        inv = np.asarray(inv).ravel()
        R = len(first)
        rep = np.asarray(first)
    else:
        R, inv, rep = K, np.arange(K), np.arange(K)
    # scaling: bytes relative to the budget, time relative to the fastest layer
    bscale = max(float(budget_bytes), 1.0)
    tscale = max(float(t.min()), 1e-30)
    nx, ny = L * K, max(L - 1, 0) * R * K
    nz = nx + ny
    nv = nz + 1

    def X(l, i):
        return l * K + i

    def Y(l, r, j):
        return nx + (l * R + r) * K + j

    c = np.zeros(nv)
    c[:nx] = np.tile(t / tscale, L)
    for l in range(L - 1):
        c[Y(l, 0, 0):Y(l, 0, 0) + R * K] = (swt[rep] / tscale).ravel()
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
        # z >= transient of layer l+1
        add([Y(l, g, j) for g in range(R) for j in range(K)] + [nz],
            [tr[rep[g], j] / bscale for g in range(R) for j in range(K)] + [-1.0], -_INF, 0.0)
    add([X(0, i) for i in range(K)] + [nz], list(pk / bscale) + [-1.0], -_INF, 0.0)
    # memory
    add(list(range(nx)) + [nz], list(np.tile(w / bscale, L)) + [1.0], -_INF,
        (float(budget_bytes) - full.base_b) / bscale)
    integrality = np.zeros(nv)
    integrality[:nx] = 1
    res = milp(c, constraints=rows.constraint(nv), integrality=integrality,
               bounds=Bounds(np.zeros(nv), np.concatenate([np.ones(nz), [_INF]])),
               options={"time_limit": time_limit, "mip_rel_gap": mip_rel_gap, "presolve": True})
    info = {"status": int(res.status), "message": str(res.message), "variables": int(nv), "constraints": len(rows.lo)}
    if res.x is None:
        plan = min_bytes_plan(full)
        return make_result(table, full, plan, budget_bytes, "milp", optimal=res.status == 2,
                           search_s=_time.perf_counter() - t0, info={**info, "reason": "infeasible or no solution"})
    xs = res.x[:nx].reshape(L, K)
    plan = [int(keep[i]) for i in xs.argmax(1)]
    info["objective_s"] = float(res.fun * tscale + full.base_t)
    return make_result(table, full, plan, budget_bytes, "milp", optimal=res.status == 0,
                       search_s=_time.perf_counter() - t0, info=info)
