"""dysejax.sharding: per-device compute kernels and parallel strategies (imports only jax/numpy)."""
