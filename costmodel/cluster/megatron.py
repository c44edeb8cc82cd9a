"""Megatron-LM's tensor parallelism, the cluster planners' baseline, defined by its layouts.

Attention heads and MLP columns split over the model-parallel group, batch rows over the batch
axes; activations between sub-layers whole on the group, or split along the sequence with
sequence parallelism (Korthikanti et al. 2022). Whichever registered strategy computes with
these layouts is the baseline.
"""
from __future__ import annotations

from costmodel.cluster.workload import ClusterError
from sharding.strategies import find_strategy
from sharding.strategies.description import BATCH_ROLE, MODEL_ROLE, Rules

COMPUTE = Rules.of(batch=BATCH_ROLE, heads=MODEL_ROLE, kv_heads=MODEL_ROLE, mlp=MODEL_ROLE)


def tensor_parallel(sequence_parallel: bool = False) -> str:
    """The registered strategy computing as Megatron's tensor parallelism (with or without
    sequence parallelism)."""
    boundary = Rules.of(batch=BATCH_ROLE, seq=MODEL_ROLE) if sequence_parallel else Rules.of(batch=BATCH_ROLE)
    name = find_strategy(boundary, COMPUTE)
    if name is None:
        raise ClusterError("no registered strategy computes as Megatron's tensor parallelism"
                           f"{' with sequence parallelism' if sequence_parallel else ''}: register one")
    return name
