"""`dp`: data parallel. Each run's weights are gathered once, compute is replicated per batch shard."""
from sharding.strategies.base import BatchParallel, replicate


class DataParallel(BatchParallel):
    name = "dp"

    def run_weights(self, weights, mesh):
        return replicate(weights, mesh)
