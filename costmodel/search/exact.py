"""The exact per-layer optimum of one cost table: minimise plan time under a byte budget.

    minimise   base_t + sum_l t[c_l] + sum_{l>=1} swt[c_{l-1}, c_l]
    subject to base_b + sum_l w[c_l] + max_l tr_l <= budget,
               tr_0 = pk[c_0],  tr_l = pk[c_l] + swb[c_{l-1}, c_l]

Exact pruning first (`costmodel.search.prune`: choices that others dominate in every term are
dropped, e.g. 21 -> 3 on a structured 96-layer table), then a label search over layers in exact
integer bytes (`costmodel.search.labels`; no memory grid). The label search stops above
`max_labels` labels a layer and returns its incumbent (the best plan of at most two runs), not
proven optimal; on the project's tables it never does (0.3-20 ms a bucket).

Test oracles that must agree (tests/oracles/): a DP over layers and discretised memory
(`grid_dp_plan`) and HiGHS on the flow formulation (`milp_plan`).

All figures are model predictions of the cost table.
"""
from __future__ import annotations

import time as _time

import numpy as np

from costmodel.search.arrays import byte_limit, fewest_bytes_plan, subset, table_arrays
from costmodel.search.labels import label_search
from costmodel.search.prune import prune_exact
from costmodel.search.result import SearchResult, search_result

__all__ = ["exact_plan", "leanest_plan"]


def exact_plan(table, budget_bytes: float, *, max_labels: int = 20000, prune: bool = True) -> SearchResult:
    """The fastest per-layer plan within `budget_bytes` (see module doc), method `exact`.

    The returned plan fits whenever anything fits (fits=False: nothing fits, the plan with the
    fewest bytes is returned). optimal: proven optimal (False only when the label search hit
    `max_labels`); info: kept choices, label counts, lower_bound_s, gap.
    """
    t0 = _time.perf_counter()
    full = table_arrays(table)
    keep = prune_exact(full) if prune else np.arange(full.K)
    a = subset(full, keep)
    info = {"kept": int(len(keep)), "choices": int(full.K)}

    def done(plan, optimal=True, **extra):
        if plan is None:  # nothing fits, or the label limit struck before any plan fitted
            plan, extra = fewest_bytes_plan(full), {"reason": "nothing fits", **extra}
        else:
            plan = [int(keep[i]) for i in plan]
        return search_result(table, full, plan, budget_bytes, "exact", optimal=optimal,
                             search_s=_time.perf_counter() - t0, info={**info, **extra})

    S_avail = byte_limit(budget_bytes) - a.base_b
    if S_avail - float(a.pk.min()) - a.L * float(a.w.min()) < 0:
        return done(None)
    lab = label_search(a, S_avail, max_labels=max_labels)
    info.update(lab.info)
    if lab.status == "infeasible":
        return done(None)
    if lab.status == "optimal":
        return done(lab.plan, lower_bound_s=lab.time + a.base_t, gap=0.0)
    return done(lab.plan, optimal=False, reason="label limit", lower_bound_s=-np.inf, gap=np.inf)  # aborted


def leanest_plan(table, budget_bytes: float) -> SearchResult:
    """The plan with the fewest bytes (method `leanest`; fits when anything fits)."""
    t0 = _time.perf_counter()
    a = table_arrays(table)
    return search_result(table, a, fewest_bytes_plan(a), budget_bytes, "leanest", optimal=True,
                         search_s=_time.perf_counter() - t0)
