"""Which plan runs each bucket: `parallel.plan` as a table from bucket length to plans.

`parallel.plan` is a strategy name or a written plan (every bucket), `auto` (the cost model's
choice per bucket, `dysejax.autoplan`), or a mapping from bucket lengths to any of those
(`{64: dp, 256: tp_sp, default: auto}`). Each bucket has a list of candidate plans in order of
preference; the program cache runs the first whose compiled program fits the memory budget.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from dysejax.errors import ConfigError
from sharding.plan import Plan, PlanSyntaxError, parse_plan


class PlanTable:
    """Candidate plans per bucket length."""

    def __init__(self, value: Any, buckets: Sequence[int], n_layers: int, known: Sequence[str],
                 auto: Optional[Callable[[int], Sequence[Plan]]] = None):
        """`auto(bucket)` gives the ranked plans of a bucket whose entry is `auto`."""
        self.buckets = list(buckets)
        self._auto = auto
        self.auto_buckets: list[int] = []
        try:
            if isinstance(value, dict):
                self.table = self._from_mapping(value, n_layers, known)
            else:
                self.table = {b: self._entry(value, b, n_layers, known, "parallel.plan") for b in self.buckets}
        except PlanSyntaxError as e:
            raise ConfigError(str(e)) from None

    def _entry(self, value: Any, bucket: int, n_layers: int, known, where: str) -> list[Plan]:
        if value == "auto":
            if self._auto is None:
                raise ConfigError(f"{where}: auto needs the cost model (pass `auto` to PlanTable)")
            self.auto_buckets.append(bucket)
            return list(self._auto(bucket))
        return [parse_plan(value, n_layers, known, where=where)]

    def _from_mapping(self, value: dict, n_layers: int, known) -> dict[int, list[Plan]]:
        default = value.get("default")
        for key in value:
            if key != "default" and key not in self.buckets:
                raise ConfigError(f"parallel.plan: {key!r} is not a bucket length (buckets: "
                                  f"{', '.join(map(str, self.buckets))}; or use the key 'default')")
        table = {}
        for b in self.buckets:
            chosen = value.get(b, default)
            if chosen is None:
                raise ConfigError(f"parallel.plan: no plan for bucket {b}: add `{b}: <plan>` or a `default` entry")
            table[b] = self._entry(chosen, b, n_layers, known, f"parallel.plan[{b}]")
        return table

    def candidates(self, bucket: int) -> list[Plan]:
        """Plans for this bucket, most preferred first."""
        return self.table[bucket]

    def distinct(self) -> list[Plan]:
        """Every plan that appears, once each."""
        return list({p.id: p for plans in self.table.values() for p in plans}.values())
