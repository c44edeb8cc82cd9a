"""`fsdp`: ZeRO-3. Weights stay sharded; each layer gathers its own just before use.

Gradients flow back through the gather as a reduce-scatter into the storage layout.
"""
from sharding.strategies.base import BatchParallel, replicate


class FullyShardedDataParallel(BatchParallel):
    name = "fsdp"

    def layer_weights(self, w, mesh):
        return replicate(w, mesh)
