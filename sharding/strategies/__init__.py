"""Strategy registry: one file per strategy, looked up by name or by its layouts."""
from typing import Optional

from sharding.strategies.base import Strategy, StrategyShapeError
from sharding.strategies.description import Rules
from sharding.strategies.dp import DataParallel
from sharding.strategies.fsdp import FullyShardedDataParallel
from sharding.strategies.metp import MemoryEfficientTensorParallel
from sharding.strategies.ring import RingAttention
from sharding.strategies.tp import TensorParallel
from sharding.strategies.tp_sp import TensorSequenceParallel
from sharding.strategies.ulysses import Ulysses

STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    DataParallel(), FullyShardedDataParallel(), TensorParallel(), TensorSequenceParallel(),
    RingAttention(), Ulysses(), MemoryEfficientTensorParallel(),
)}


def get_strategy(name: str) -> Strategy:
    """The registered strategy called `name`."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise KeyError(f"unknown strategy {name!r} (known: {', '.join(STRATEGIES)})") from None


def find_strategy(boundary: Rules, compute: Rules) -> Optional[str]:
    """The registered strategy whose boundary and compute layouts are these (None if none): how
    a planner names a configuration it defines by layout, e.g. Megatron's tensor parallelism."""
    for name, strategy in STRATEGIES.items():
        if (dict(strategy.boundary.roles), dict(strategy.compute.roles)) == (dict(boundary.roles), dict(compute.roles)):
            return name
    return None


__all__ = ["STRATEGIES", "Strategy", "StrategyShapeError", "find_strategy", "get_strategy"]
