"""Process-level JAX setup that must happen before the backend starts."""
from __future__ import annotations

import os
from typing import Optional

# On XLA:CPU the pass cse_barrier_expander strips optimisation barriers, after which CSE merges
# recomputed values with the forward ones and jax.checkpoint silently does nothing. Disabling
# it makes remat (and so the compiled memory figures) behave as on GPU/TPU.
CPU_REMAT_FLAG = "--xla_disable_hlo_passes=cse_barrier_expander"


def configure_host_devices(n_devices: int = 8) -> bool:
    """Give XLA:CPU `n_devices` simulated devices unless the user set XLA_FLAGS or JAX started.

    Returns True when the flags were set here. Must run before the first JAX computation; on a
    machine with accelerators the host-device count is harmless (JAX uses the accelerators).
    """
    if "XLA_FLAGS" in os.environ:
        return False
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        return False
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n_devices} {CPU_REMAT_FLAG}"
    return True


def enable_compilation_cache(directory: str) -> None:
    """Turn on JAX's persistent compilation cache in `directory`, small programs included."""
    import jax
    from jax._src import compilation_cache

    directory = os.path.abspath(directory)
    os.makedirs(directory, exist_ok=True)
    if jax.config.jax_compilation_cache_dir != directory:
        jax.config.update("jax_compilation_cache_dir", directory)
        compilation_cache.reset_cache()  # re-read the directory on next use
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def memory_budget_bytes(budget_gb: Optional[float]) -> Optional[int]:
    """Per-device byte budget: the configured GiB, else the accelerator's memory (None on CPU)."""
    if budget_gb is not None:
        return int(budget_gb * 2**30)
    import jax

    device = jax.devices()[0]
    if device.platform == "cpu":
        return None
    stats = device.memory_stats() or {}
    return stats.get("bytes_limit")
