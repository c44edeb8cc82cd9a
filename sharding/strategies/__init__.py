"""Strategy registry: one file per strategy, looked up by name."""
from sharding.strategies.base import Strategy, StrategyShapeError
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


__all__ = ["STRATEGIES", "Strategy", "StrategyShapeError", "get_strategy"]
