"""`tp_sp`: Megatron tensor parallelism + sequence parallelism (see `tp.py`).

Between sub-layers activations are split along the sequence `[b, s/p, d]` (the unified
boundary layout); each sub-layer all-gathers its input along s and reduce-scatters its output.
"""
from sharding.strategies.tp import TensorParallel


class TensorSequenceParallel(TensorParallel):
    name = "tp_sp"
    sequence_parallel = True
