"""The exact per-layer optimum of one cost table: minimise plan time under a byte budget.

    minimise   base_t + sum_l t[c_l] + sum_{l>=1} swt[c_{l-1}, c_l]
    subject to base_b + sum_l w[c_l] + max_l tr_l <= budget,
               tr_0 = pk[c_0],  tr_l = pk[c_l] + swb[c_{l-1}, c_l]

Two solvers that must agree:

`exact_plan` — by default a label search over layers (exact, no memory grid; the fast path),
falling back to dynamic programming over layers and discretised memory (`solver="dp"` forces it).
  * Label search (`costmodel.search.labels`): exact, in exact integer bytes; aborts above
    `max_labels` labels a layer and hands its incumbent to the grid solver.
  * Grid solver (`costmodel.search.grid_dp`): the max-over-layers transient handled exactly by
    enumerating its value (caps, branch and bound from the largest), a DP over layers and
    stored-byte units per cap (exact grid when the bytes allow, else a proven lower bound that
    is refined), Lagrangian bounds by min-plus matrix powers.
  * Exact pruning first (`costmodel.search.prune`): choices that others dominate in every
    term are dropped (e.g. 21 -> 3 on a structured 96-layer table).

`milp_plan` (`costmodel.search.milp`) finds the same optimum with HiGHS, as the cross-check.

All figures are model predictions of the cost table.
"""
from __future__ import annotations

import time as _time
from typing import Optional

import numpy as np

from costmodel.search._common import SearchResult, TableArrays, arrays, leanest_uniform, make_result, subset
from costmodel.search.grid_dp import choose_grid, solve_caps
from costmodel.search.labels import label_search
from costmodel.search.prune import prune_exact

__all__ = ["exact_plan", "prune_exact", "min_bytes_plan"]

_INF = np.inf


def min_bytes_plan(a: TableArrays) -> list:
    """A plan with the fewest bytes (exact: over transient caps, min stored path under the cap)."""
    L, tr = a.L, a.transient
    best, best_plan = _INF, None
    for C in np.unique(np.concatenate([a.pk, tr.ravel()])):
        allowed = a.pk <= C
        if not allowed.any():
            continue
        cost = np.where(allowed, a.w, _INF)
        A = np.where(tr <= C, 0.0, _INF)
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


def exact_plan(table, budget_bytes: float, *, solver: str = "auto", max_labels: int = 20000, bins: int = 1024,
               max_bins: int = 4096, exact_bins: int = 4096, rel_tol: float = 1e-3, scan: int = 16,
               prune: bool = True, fallback: Optional[str] = None, milp_time_limit: float = 120.0) -> SearchResult:
    """The fastest per-layer plan within `budget_bytes` (see module doc).

    solver: "auto" = the label search (exact, method `exact`), falling back to the DP over
    layers and memory (method `dp`) only when a layer holds more than `max_labels` labels;
    "dp" = the DP only (seeded with the ParaDySe plan, as before the label search existed);
    "labels" = the label search only (aborted: its incumbent, optimal=False).
    bins: grid units over the stored-byte span; while the plan is not proven within rel_tol
    of the optimum the grid is refined x4 up to max_bins. exact_bins: an exact integer grid
    (all stored-byte differences multiples of one unit) is used whenever it needs at most this
    many units. scan: final states checked per DP for a truly fitting plan. fallback="milp":
    settle a remaining gap with `milp_plan` (exact, much slower). The returned plan always
    fits when anything fits (fits=False: nothing fits, the fewest-bytes plan is returned).
    optimal: proven optimal; info: kept choices, unit_bytes, grid_exact, bins, DPs run, caps
    pruned / settled without a DP, lower_bound_s (a proven lower bound on the optimum), gap.
    """
    t0 = _time.perf_counter()
    full = arrays(table)
    keep = prune_exact(full) if prune else np.arange(full.K)
    a = subset(full, keep)
    S_avail = float(budget_bytes) - a.base_b
    wmin = float(a.w.min())
    e = a.w - wmin
    span = S_avail - float(a.pk.min()) - a.L * wmin
    info = {"kept": int(len(keep)), "choices": int(full.K), "dps": 0, "pruned": 0, "quick": 0}

    def done(plan, method="dp", optimal=True, **extra):
        if plan is None:
            plan, extra = min_bytes_plan(full), {**extra, "reason": "nothing fits"}
        else:
            plan = [int(keep[i]) for i in plan]
        return make_result(table, full, plan, budget_bytes, method, optimal=optimal,
                           search_s=_time.perf_counter() - t0, info={**info, **extra})

    if solver not in ("auto", "dp", "labels"):
        raise ValueError(f"solver must be 'auto', 'dp' or 'labels', got {solver!r}")
    if span < 0:
        return done(None)
    seed = None
    if solver != "dp":
        lab = label_search(a, S_avail, max_labels=max_labels)
        info.update(lab.info)
        if lab.status == "infeasible":
            return done(None)
        if lab.status == "optimal" or solver == "labels":
            opt = lab.status == "optimal"
            lb = lab.time + a.base_t if opt else -_INF
            return done(lab.plan, method="exact", optimal=opt, lower_bound_s=lb, gap=0.0 if opt else _INF)
        if lab.plan is not None:
            seed = (lab.time, list(lab.plan))
    if e.max() > 0:
        span = min(span, a.L * float(e.max()))
    if seed is None:
        # incumbent: the best uniform or ParaDySe two-segment plan that fits (prunes caps early)
        from costmodel.search.paradyse import paradyse_plan
        h = paradyse_plan(_SubTable(a), budget_bytes)
        if h.fits:
            seed = (h.time_s - a.base_t, list(h.per_layer))
    nb, lower = bins, -_INF
    while True:
        unit, exact = choose_grid(e, span, nb, exact_bins, a.L)
        info.update(unit_bytes=unit, grid_exact=exact, bins=nb)
        lo, plan, v = solve_caps(a, S_avail, unit, exact, info, seed, scan)
        lower = max(lower, lo)
        if plan is None and not np.isfinite(lo):
            return done(None)  # even the relaxation has nothing: provably nothing fits
        if plan is not None:
            seed = (v, plan)
        gap = (seed[0] - lower) / (seed[0] + a.base_t) if seed is not None else _INF
        if seed is not None and (exact or gap <= max(rel_tol, 1e-12)):
            return done(seed[1], optimal=exact or gap <= 1e-12, lower_bound_s=lower + a.base_t, gap=max(gap, 0.0))
        if nb * 4 > max_bins:
            break
        nb *= 4
    if fallback == "milp":
        from costmodel.search.milp import milp_plan  # (it imports this module)
        res = milp_plan(table, budget_bytes, time_limit=milp_time_limit)
        return make_result(table, full, res.per_layer, budget_bytes, "milp", optimal=res.optimal,
                           search_s=_time.perf_counter() - t0,
                           info={**info, **res.info, "fallback": "milp", "lower_bound_s": lower + a.base_t})
    return done(seed[1] if seed else None, optimal=False, lower_bound_s=lower + a.base_t, gap=gap)


class _SubTable:
    """TableArrays seen as a cost table (for running the heuristic on the pruned choices)."""

    def __init__(self, a: TableArrays):
        self.choices = tuple(range(a.K))
        self.n_layers = a.L
        self.layer_time_s, self.layer_stored_bytes, self.layer_peak_bytes = a.t, a.w, a.pk
        self.switch_time_s, self.switch_bytes = a.swt, a.swb
        self.base_bytes, self.base_time_s = a.base_b, a.base_t
