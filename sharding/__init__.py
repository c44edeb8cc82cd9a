"""dysejax.sharding: per-device compute kernels and parallel strategies (imports only jax/numpy)."""
from sharding.ops.ordering import unique_collective_channels

unique_collective_channels()  # before any program is lowered: see sharding/ops/ordering.py
