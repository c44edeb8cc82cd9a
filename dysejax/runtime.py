"""Process-level JAX setup that must happen before the backend starts."""
from __future__ import annotations

import os

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

    os.makedirs(directory, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
