"""`fsdp`: ZeRO-3. Weights stay sharded; each layer gathers its own just before use.

Gradients flow back through the gather as a reduce-scatter into the storage layout.
"""
from sharding.strategies.description import gather_per_layer, gathered_weights
from sharding.strategies.dp import DataParallel


class FullyShardedDataParallel(DataParallel):
    name = "fsdp"

    def run_weights(self, weights, mesh):
        return weights

    def layer_weights(self, w, mesh):
        return self.gather(w, mesh)

    def weight_bytes(self, shape, remat):
        return gathered_weights(shape, remat)

    def weight_collectives(self, shape, remat):
        return gather_per_layer(shape, remat)
