"""What a plan search returns for one bucket: the per-layer plan and the table's prediction for it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from costmodel.search.arrays import TableArrays, evaluate

__all__ = ["SearchResult", "search_result"]


@dataclass(frozen=True)
class SearchResult:
    """A per-layer plan for one bucket and what the cost table predicts for it.

    per_layer: choice index per layer (into the table's `choices`); choices: the Choice per
    layer; time_s / bytes: predicted step time and per-device bytes (model predictions);
    fits: bytes <= budget_bytes (when False, the plan is the closest (leanest) one found);
    method: which rule produced it (`exact`, `leanest`, `paradyse:fastest`,
    `paradyse:two-segment`, `paradyse:leanest`, `paradyse:smoothed`; the test oracles `dp`,
    `milp`); optimal: proven optimal for the table's objective; search_s: wall seconds the
    search took; info: method details.
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


def search_result(table, a: TableArrays, per_layer: Sequence[int], budget: float, method: str, *,
                  optimal: bool = False, search_s: float = 0.0, info: Optional[dict] = None) -> SearchResult:
    """The result of a per-layer plan of `table` (whose arrays are `a`) under `budget` bytes."""
    idx = tuple(int(i) for i in per_layer)
    time, nbytes = evaluate(a, idx)  # bytes in whole bytes, as CostTable.plan_bytes
    return SearchResult(per_layer=idx, choices=tuple(table.choices[i] for i in idx), time_s=time, bytes=nbytes,
                        budget_bytes=float(budget), fits=bool(nbytes <= budget), method=method, optimal=optimal,
                        search_s=search_s, info=dict(info or {}))
