"""A plan: which strategy (and remat policy) runs each layer, as data.

Written as runs of consecutive layers, e.g. `[["tp_sp", 20], ["metp", 12]]` or
`[{"strategy": "tp_sp", "layers": 20, "remat": "full"}, ...]`, or as the plan's id, the one line
every report prints: `tp_sp:20,metp:12@full` (runs `STRATEGY:LAYERS@REMAT`, the count and the
policy optional for a plan of one run: `ulysses`, `ulysses@selective`). Consecutive layers with
one strategy run under one scan.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from sharding.remat import NAMES as REMAT_NAMES


class PlanSyntaxError(ValueError):
    """A written plan is malformed or does not cover the model's layers."""


@dataclass(frozen=True)
class Run:
    """`n_layers` consecutive layers computed by `strategy` under `remat` (None: model default)."""

    strategy: str
    n_layers: int
    remat: Optional[str] = None


@dataclass(frozen=True)
class Plan:
    """Runs of layers covering the whole stack, in order."""

    runs: tuple[Run, ...]

    @property
    def n_layers(self) -> int:
        return sum(r.n_layers for r in self.runs)

    @property
    def id(self) -> str:
        """Short stable name: `dp`, or `tp_sp:20,metp:12` (remat appended as `@full`)."""
        if len(self.runs) == 1 and self.runs[0].remat is None:
            return self.runs[0].strategy
        return ",".join(f"{r.strategy}:{r.n_layers}" + (f"@{r.remat}" if r.remat else "")
                        for r in self.runs)

    def layer_strategies(self) -> list[str]:
        return [r.strategy for r in self.runs for _ in range(r.n_layers)]

    def strategies(self) -> list[str]:
        """Distinct strategy names in order of first use."""
        return list(dict.fromkeys(r.strategy for r in self.runs))

    def as_data(self) -> list[list]:
        """JSON-able form that `parse_plan` reads back."""
        return [[r.strategy, r.n_layers] + ([r.remat] if r.remat else []) for r in self.runs]

    def with_default_remat(self, remat: str) -> "Plan":
        return Plan(tuple(Run(r.strategy, r.n_layers, r.remat or remat) for r in self.runs))


def compress(layer_strategies: Sequence[str], remat: Optional[Sequence[Optional[str]]] = None) -> Plan:
    """A plan from one strategy (and remat policy) per layer, merging equal neighbours."""
    remat = list(remat) if remat is not None else [None] * len(layer_strategies)
    runs: list[Run] = []
    for name, policy in zip(layer_strategies, remat):
        if runs and runs[-1].strategy == name and runs[-1].remat == policy:
            runs[-1] = Run(name, runs[-1].n_layers + 1, policy)
        else:
            runs.append(Run(name, 1, policy))
    return Plan(tuple(runs))


def _parse_run(item: Any, where: str) -> Run:
    if isinstance(item, dict):
        unknown = set(item) - {"strategy", "layers", "remat"}
        if unknown or "strategy" not in item or "layers" not in item:
            raise PlanSyntaxError(f"{where}: a run is {{strategy: NAME, layers: N, remat: POLICY}}, got {item!r}")
        name, n, remat = item["strategy"], item["layers"], item.get("remat")
    elif isinstance(item, (list, tuple)) and len(item) in (2, 3):
        name, n, remat = item[0], item[1], (item[2] if len(item) == 3 else None)
    else:
        raise PlanSyntaxError(f"{where}: a run is [strategy, n_layers] or [strategy, n_layers, remat], got {item!r}")
    if not isinstance(name, str):
        raise PlanSyntaxError(f"{where}: strategy must be a name, got {name!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise PlanSyntaxError(f"{where}: layer count must be a positive integer, got {n!r}")
    if remat is not None and remat not in REMAT_NAMES:
        raise PlanSyntaxError(f"{where}: remat must be one of {', '.join(REMAT_NAMES)}, got {remat!r}")
    return Run(name, n, remat)


def _from_id(text: str, n_layers: int, where: str) -> Plan:
    """The plan an id names: `ring`, `ring@full`, `ring:3@selective,metp:1@full`."""
    parts = text.split(",")
    runs = []
    for part in parts:
        head, at, remat = part.strip().partition("@")
        name, colon, count = head.partition(":")
        if not name or (at and not remat) or (colon and not count.isdigit()) or (len(parts) > 1 and not colon):
            raise PlanSyntaxError(f"{where}: {text!r} is not a plan: write STRATEGY, STRATEGY@REMAT or runs "
                                  "STRATEGY:LAYERS[@REMAT] joined by commas, e.g. tp_sp:3@selective,metp:1@full")
        if remat and remat not in REMAT_NAMES:
            raise PlanSyntaxError(f"{where}: remat must be one of {', '.join(REMAT_NAMES)}, got {remat!r} in {text!r}")
        n = int(count) if colon else n_layers
        if n <= 0:
            raise PlanSyntaxError(f"{where}: layer count must be a positive integer, got {count!r} in {text!r}")
        runs.append(Run(name, n, remat or None))
    return Plan(tuple(runs))


def parse_plan(value: Any, n_layers: int, known: Sequence[str], where: str = "parallel.plan") -> Plan:
    """Read a strategy name or a written plan; check names and that it covers `n_layers`."""
    if isinstance(value, Plan):
        plan = value
    elif isinstance(value, str):
        plan = _from_id(value.strip(), n_layers, where)
    elif isinstance(value, (list, tuple)) and value:
        plan = Plan(tuple(_parse_run(item, f"{where}[{i}]") for i, item in enumerate(value)))
    else:
        raise PlanSyntaxError(f"{where}: expected a strategy name or a list of runs, got {value!r}")
    for r in plan.runs:
        if r.strategy not in known:
            raise PlanSyntaxError(f"{where}: unknown strategy {r.strategy!r} (known: {', '.join(known)})")
    if plan.n_layers != n_layers:
        raise PlanSyntaxError(f"{where}: runs cover {plan.n_layers} layers but the model has {n_layers} "
                              f"(model.n_layers)")
    return plan
