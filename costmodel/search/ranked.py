"""The per-bucket plan search: ranked plans for one cost table under a byte budget.

`ranked_plans(table, budget)` is what a trainer asks: the plan to run and the fallbacks to try
in order when the compiled program of one does not fit (a prediction that was too low):

    1. the optimum within the budget (method `exact`, or ParaDySe's Algorithm 1 with
       method="paradyse");
    2. a ladder of fallbacks: the optimum under `step` (5%) fewer bytes than the candidate before
       it, `rungs` times (or until nothing fits), so each rung is the fastest plan that needs at
       least 5% less than the one before it;
    3. the plan with the fewest bytes (`leanest`), always last.

Why steps relative to the previous candidate, not fractions of the budget: a prediction is off
by a few per cent, so the fallback that matters most is the fastest plan just below the one
that missed. Budget fractions (0.9, 0.8, ...) skipped it whenever the optimum sat near the
budget: at 98% the next rung was the optimum under 90%, so the next-fastest plans, at 90.3% and
92%, were never compiled (docs/headline.md, GRCh38-like held-out runs).

Plans that repeat an earlier one are dropped. When nothing fits the budget, the ranking is the
leanest plan alone (`best.fits` is False). With no budget (None), the budget is one every plan
of the table meets.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from costmodel.search.exact import exact_plan, leanest_plan
from costmodel.search.paradyse import paradyse_plan
from costmodel.search.result import SearchResult

__all__ = ["Ranking", "ranked_plans", "METHODS", "STEP", "RUNGS", "unlimited_budget"]

METHODS = {"exact": exact_plan, "paradyse": paradyse_plan}
STEP = 0.05  # each fallback needs at least this share fewer bytes than the candidate before it
RUNGS = 6  # fallbacks before the leanest plan (0.95^6: down to 74% of the optimum's bytes)


@dataclass(frozen=True)
class Ranking:
    """The plans of one bucket in the order to try them (`candidates[0]` is `best`'s plan)."""

    best: SearchResult  # the optimum within the budget; when nothing fits, the leanest plan
    candidates: tuple[SearchResult, ...]  # distinct plans, best first, the leanest last
    budget_bytes: float

    @property
    def fits(self) -> bool:
        return self.best.fits


def unlimited_budget(table) -> float:
    """A byte budget every plan of `table` meets (whole bytes, rounded up as plans' bytes are)."""
    return float(np.ceil(table.base_bytes + table.n_layers * table.layer_stored_bytes.max()
                 + table.layer_peak_bytes.max() + table.switch_bytes.max()))


def ranked_plans(table, budget_bytes: Optional[float], *, method: str = "exact",
                 step: float = STEP, rungs: int = RUNGS) -> Ranking:
    """The ranked plans of one bucket's cost table within `budget_bytes` (see module doc)."""
    if method not in METHODS:
        raise ValueError(f"unknown plan search method {method!r} (known: {', '.join(METHODS)})")
    search = METHODS[method]
    if not 0.0 < step < 1.0:
        raise ValueError(f"step {step}: the share of bytes each fallback saves must be in (0, 1)")
    budget = unlimited_budget(table) if budget_bytes is None else float(budget_bytes)
    best = search(table, budget)
    lean = leanest_plan(table, budget)
    if not best.fits:
        return Ranking(best=lean, candidates=(lean,), budget_bytes=budget)
    ranked = [best]
    for _ in range(rungs):
        rung = search(table, ranked[-1].bytes * (1.0 - step))
        if not rung.fits:
            break
        ranked.append(rung)
    ranked.append(lean)
    distinct = {}
    for r in ranked:
        distinct.setdefault(r.plan_id, r)
    return Ranking(best=best, candidates=tuple(distinct.values()), budget_bytes=budget)
