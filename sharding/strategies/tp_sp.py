"""`tp_sp`: Megatron tensor parallelism + sequence parallelism (see `tp.py`).

Between sub-layers activations are split along the sequence `[b, s/p, d]` (the unified
boundary layout); each sub-layer all-gathers its input along s and reduce-scatters its output.
"""
from sharding.strategies.description import BATCH_ROLE, MODEL_ROLE, Collective, Rules
from sharding.strategies.tp import TensorParallel


class TensorSequenceParallel(TensorParallel):
    name = "tp_sp"
    sequence_parallel = True
    boundary = Rules.of(batch=BATCH_ROLE, seq=MODEL_ROLE)

    def sublayer_collectives(self, shape, x_bytes):
        """2 gathers + 2 reduce-scatters forward; re-gathers and transposes backward."""
        return (Collective("all-gather", MODEL_ROLE, x_bytes, 6), Collective("reduce-scatter", MODEL_ROLE, x_bytes, 4))
