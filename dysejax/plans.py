"""`parallel.plan` read per bucket: a written plan, or `auto` (the cost model chooses, `dysejax.planner`).

`parallel.plan` is a strategy name or a written plan (every bucket), `auto`, or a mapping from
bucket lengths to any of those (`{64: dp, 256: tp_sp, default: auto}`).
"""
from __future__ import annotations

from typing import Any, Sequence, Union

from dysejax.errors import ConfigError
from sharding.plan import Plan, PlanSyntaxError, parse_plan

AUTO = "auto"


def plan_entries(value: Any, buckets: Sequence[int], n_layers: int, known: Sequence[str]
                 ) -> dict[int, Union[Plan, str]]:
    """Per bucket length, its written Plan or AUTO; ConfigError for a bad plan or bucket key."""
    try:
        if isinstance(value, dict):
            return _from_mapping(value, buckets, n_layers, known)
        return {b: _entry(value, n_layers, known, "parallel.plan") for b in buckets}
    except PlanSyntaxError as e:
        raise ConfigError(str(e)) from None


def _entry(value: Any, n_layers: int, known, where: str) -> Union[Plan, str]:
    return AUTO if value == AUTO else parse_plan(value, n_layers, known, where=where)


def _from_mapping(value: dict, buckets: Sequence[int], n_layers: int, known) -> dict[int, Union[Plan, str]]:
    default = value.get("default")
    for key in value:
        if key != "default" and key not in buckets:
            raise ConfigError(f"parallel.plan: {key!r} is not a bucket length (buckets: "
                              f"{', '.join(map(str, buckets))}; or use the key 'default')")
    entries = {}
    for b in buckets:
        chosen = value.get(b, default)
        if chosen is None:
            raise ConfigError(f"parallel.plan: no plan for bucket {b}: add `{b}: <plan>` or a `default` entry")
        entries[b] = _entry(chosen, n_layers, known, f"parallel.plan[{b}]")
    return entries
