"""Process-level setup: simulated devices and XLA:CPU's workaround flags (before JAX's backend starts),
joining a multi-process run, agreement between processes, stop signals, the persistent compile
cache and the per-device memory budget."""
from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import socket
import sys
from typing import Optional

from dysejax.errors import ConfigError

# XLA:CPU workarounds, all in one place (XLA_FLAGS is read once, when the backend starts):
# - the pass cse_barrier_expander strips optimisation barriers, after which CSE merges
#   recomputed values with the forward ones and jax.checkpoint silently does nothing. Disabling
#   it makes remat (and so the compiled memory figures) behave as on GPU/TPU.
# - each simulated device's collective blocks a thread of the client's pool until every device
#   arrives, and a device can run two independent collectives at once. The pool has NPROC
#   threads (else the core count) or one per device: with 8 devices on 2 cores, two devices in
#   two collectives each left the last two devices no thread to arrive on, a deadlock
#   ("only 6 of 8 arrived": `ring` and `ring:3,ring:1@full` at 64 x 256 on
#   configs/dynamic.yaml). NPROC keeps threads to spare (never fewer than the cores).
# - a collective aborts the process when some device has not arrived after 40 s. Sharing two
#   cores, eight devices can drift apart by more than that on long steps (a 16,384-token step
#   of configs/dynamic.yaml takes ~70 s), so the limit is 5 minutes.
# - programs with collectives on several CPU devices are not loaded from the persistent compile
#   cache (`persistent_cache_refusal`): loaded, they lose the order of a loop's collectives and
#   deadlock. This was the "rare" deadlock once noted here: it struck every run that loaded
#   the program from a warm cache, and none that compiled it.
CPU_FLAGS = ("--xla_disable_hlo_passes=cse_barrier_expander",
             "--xla_cpu_collective_call_terminate_timeout_seconds=300",
             "--xla_cpu_collective_call_warn_stuck_timeout_seconds=120")
CPU_THREADS_PER_DEVICE = 4
_COUNT_FLAG = "xla_force_host_platform_device_count"


def _write_cpu_environment(flags: str, n_devices: int) -> None:
    """XLA_FLAGS = `flags` plus every CPU workaround it does not name; NPROC (unless set) for the
    simulated devices `flags` names, else `n_devices`."""
    named = re.search(_COUNT_FLAG + r"=(\d+)", flags)
    devices = int(named.group(1)) if named else n_devices
    os.environ.setdefault("NPROC", str(max(os.cpu_count() or 1, CPU_THREADS_PER_DEVICE * devices)))
    os.environ["XLA_FLAGS"] = " ".join(flags.split() + [f for f in CPU_FLAGS if f.split("=")[0] not in flags])


def without_device_count(flags: str) -> str:
    """XLA_FLAGS `flags` without a simulated-device count, for a child process that sets its own
    (`parallel.cpu_devices`)."""
    return " ".join(f for f in flags.split() if _COUNT_FLAG not in f)


def simulate_host_devices(n_devices: int = 8) -> None:
    """For tests and scripts that set XLA up before importing JAX (imports no JAX): `n_devices`
    simulated CPU devices in XLA_FLAGS unless it names a count, and the CPU workarounds."""
    flags = os.environ.get("XLA_FLAGS", "")
    if _COUNT_FLAG not in flags:
        flags = f"{flags} --{_COUNT_FLAG}={n_devices}"
    _write_cpu_environment(flags, n_devices)


def configure_host_devices(n_devices: int = 8) -> bool:
    """Give XLA:CPU `n_devices` simulated devices (`jax_num_cpu_devices`) and the CPU
    workarounds (XLA_FLAGS, NPROC), whatever XLA_FLAGS holds; a device count named there is kept.

    Returns True when the count was set here, False once JAX's backend has started (then
    nothing changes). Must run before the first JAX computation; on a machine with accelerators
    the host-device count is harmless (JAX uses the accelerators).
    """
    import jax

    flags = os.environ.get("XLA_FLAGS", "")
    try:
        if _COUNT_FLAG not in flags:
            jax.config.update("jax_num_cpu_devices", n_devices)
    except RuntimeError:  # the backend has started: the devices are what they are
        return False
    _write_cpu_environment(flags, n_devices)  # read when the backend starts, i.e. still in time
    return True


def detected_cluster() -> Optional[str]:
    """The cluster environment JAX can read process count and id from (SLURM, Open MPI, TPU VM, ...)."""
    from jax._src.clusters import ClusterEnv  # the registry jax.distributed.initialize() consults

    env = next((e for e in ClusterEnv._cluster_types if not e.opt_in_only_method and e.is_env_present()), None)
    return env.__name__ if env else None


def _check_process_flags(coordinator: Optional[str], num_processes: Optional[int], process_id: Optional[int]) -> None:
    if coordinator is None:
        if num_processes not in (None, 1) or process_id not in (None, 0):
            raise ConfigError(f"--num-processes {num_processes} / --process-id {process_id} need --coordinator "
                              "HOST:PORT (the address process 0 listens on)")
        return
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--coordinator {coordinator!r}: expected HOST:PORT, e.g. 10.0.0.1:1234")
    if num_processes is None or process_id is None:
        raise ConfigError("--coordinator needs --num-processes N and --process-id I (0 on the coordinator's host)")
    if num_processes < 1:
        raise ConfigError(f"--num-processes must be positive, got {num_processes}")
    if not 0 <= process_id < num_processes:
        raise ConfigError(f"--process-id must be in 0..{num_processes - 1} for --num-processes {num_processes}, "
                          f"got {process_id}")


def _join_failure(where: str, process_id: Optional[int], timeout_s: float) -> str:
    host, _, port = where.rpartition(":")
    if process_id != 0 and port.isdigit():
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
        except OSError as e:
            return (f"cannot reach the coordinator {where} ({e.strerror or e}) within train.peer_timeout_s="
                    f"{timeout_s:g} s: start process 0 first and check the address and port from this host")
    return (f"not every process joined through {where} within train.peer_timeout_s={timeout_s:g} s: start all "
            "--num-processes processes with the same --coordinator, or raise train.peer_timeout_s")


def initialize_distributed(coordinator: Optional[str] = None, num_processes: Optional[int] = None,
                           process_id: Optional[int] = None, peer_timeout_s: float = 120.0) -> bool:
    """Join a multi-process run with jax.distributed; must run before JAX's backend starts.

    Initializes with the given coordinator (HOST:PORT of process 0), process count and id, or
    from the cluster environment when no flag is given and JAX detects one; otherwise this is a
    single process and nothing happens (returns False). Waits up to `peer_timeout_s` for every
    process to join, then watches the peers (see dysejax.watchdog).
    """
    _check_process_flags(coordinator, num_processes, process_id)
    cluster = detected_cluster() if coordinator is None else None
    if coordinator is None and cluster is None:
        return False
    import jax
    from jax._src import distributed

    from dysejax.watchdog import PeerWatchdog, exit_after

    timeout = max(1, int(peer_timeout_s))
    where = coordinator or f"the coordinator of the {cluster} environment"
    # JAX aborts the process when joining times out; the timer reports it first, as a usage error.
    with exit_after(peer_timeout_s, lambda: _join_failure(where, process_id, peer_timeout_s), status=2):
        jax.distributed.initialize(coordinator, num_processes, process_id, initialization_timeout=timeout + 30,
                                   heartbeat_timeout_seconds=2 * timeout + 10, shutdown_timeout_seconds=timeout)
    state = distributed.global_state
    watchdog = PeerWatchdog(state.client, state.process_id, state.num_processes, peer_timeout_s)
    watchdog.start()
    sys.excepthook = watchdog.excepthook(sys.excepthook)

    def finish():  # before the interpreter exits: stop watching, then leave through JAX's barrier
        watchdog.stop()
        jax.distributed.shutdown()
    atexit.register(finish)
    return True


def disagreeing_processes(value) -> list[int]:
    """The processes whose JSON-able `value` differs from process 0's (a collective; [] alone)."""
    import jax

    if jax.process_count() == 1:
        return []
    import hashlib
    import json

    import numpy as np
    from jax.experimental import multihost_utils

    digest = hashlib.sha256(json.dumps(value, default=str).encode()).digest()
    rows = multihost_utils.process_allgather(np.frombuffer(digest[:16], np.int32))
    return [i for i in range(len(rows)) if not np.array_equal(rows[i], rows[0])]


def agreed_signal(signum: Optional[int]) -> Optional[int]:
    """A stop signal any process has seen, so that every process stops after the same step."""
    import jax

    if jax.process_count() == 1:
        return signum
    import numpy as np
    from jax.experimental import multihost_utils

    return int(multihost_utils.process_allgather(np.int32(signum or 0)).max()) or None


class _StopFlag:
    signum: Optional[int] = None


@contextlib.contextmanager
def stop_signals():
    """Turn SIGTERM/SIGINT into a flag (`.signum`) the loop checks after each step (main thread only)."""
    flag = _StopFlag()
    handled = (signal.SIGTERM, signal.SIGINT)
    try:
        previous = {s: signal.signal(s, lambda signum, frame: setattr(flag, "signum", signum)) for s in handled}
    except ValueError:  # not the main thread: leave signals alone
        previous = {}
    try:
        yield flag
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def user_cache_dir(*parts: str) -> str:
    """dysejax's cache shared by every run of this user: $DYSEJAX_CACHE_DIR, else
    $XDG_CACHE_HOME/dysejax, else ~/.cache/dysejax (joined with `parts`)."""
    root = os.environ.get("DYSEJAX_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "dysejax")
    return os.path.join(root, *parts)


def persistent_cache_refusal() -> Optional[str]:
    """Why compiled programs must not be loaded from JAX's persistent cache in this process, or
    None where they may.

    XLA:CPU (jaxlib 0.10.2) orders a program's collectives through one shared resource, and
    starts each only after the previous one has started; a loop or branch holding collectives
    counts as one of them. An executable loaded from the persistent cache gets a resource of
    its own for each loop body, so a loop's collectives are no longer ordered with those
    around it: one simulated device starts the gather after a loop while the others still
    wait in the loop's permute, and every device blocks for good (`only 7 of 8 arrived`). The
    same program compiled in the process runs; loaded from the cache it deadlocks on every run
    (`dp:2@selective,tp:2@selective` at 16 x 64 on configs/dynamic.yaml; docs/architecture.md)."""
    import jax

    if jax.default_backend() == "cpu" and jax.device_count() > 1:
        return (f"XLA:CPU with {jax.device_count()} devices: its cached programs lose the order of the "
                f"collectives inside loops and can deadlock")
    return None


def enable_compilation_cache(directory: str) -> Optional[str]:
    """Turn on JAX's persistent compilation cache in `directory`, small programs included.
    Returns None, or why it stays off in this process (`persistent_cache_refusal`)."""
    import jax
    from jax._src import compilation_cache

    refusal = persistent_cache_refusal()
    if refusal:
        jax.config.update("jax_enable_compilation_cache", False)  # also against JAX_COMPILATION_CACHE_DIR
        return refusal
    directory = os.path.abspath(directory)  # JAX creates it at the first compilation
    if jax.config.jax_compilation_cache_dir != directory:
        jax.config.update("jax_compilation_cache_dir", directory)
        compilation_cache.reset_cache()  # re-read the directory on next use
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return None


# JAX's GPU allocator takes this fraction of device memory unless told otherwise.
DEFAULT_GPU_MEM_FRACTION = 0.75


def allocator_fraction() -> float:
    """The fraction of an accelerator's memory JAX's allocator can use: XLA_PYTHON_CLIENT_MEM_FRACTION,
    else JAX's default (0.75); 1.0 when preallocation is off and no fraction is set."""
    value = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    if value:
        try:
            return min(1.0, max(0.0, float(value)))
        except ValueError:
            pass
    if os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "").lower() in ("false", "0"):
        return 1.0
    return DEFAULT_GPU_MEM_FRACTION


def usable_bytes(device_bytes: int, headroom: float) -> int:
    """The budget of a device of `device_bytes` when planned from elsewhere: what JAX's
    allocator would get there, less the `headroom` fraction of it."""
    return int(device_bytes * allocator_fraction() * (1.0 - headroom))


def memory_budget_bytes(budget_gb: Optional[float], headroom: float = 0.0) -> Optional[int]:
    """Per-device byte budget: the configured GiB, else what JAX's allocator can use on the
    accelerator (`memory_stats()['bytes_limit']`, the smallest over processes) less the
    `headroom` fraction of it; None on CPU (unlimited)."""
    if budget_gb is not None:
        return int(budget_gb * 2**30)
    import jax

    device = jax.local_devices()[0]
    if device.platform == "cpu":
        return None
    limit = (device.memory_stats() or {}).get("bytes_limit")
    if limit is None:
        return None
    if jax.process_count() > 1:  # every process must select the same programs
        import numpy as np
        from jax.experimental import multihost_utils

        limit = int(multihost_utils.process_allgather(np.int32(limit // 2**20)).min()) * 2**20
    return int(limit * (1.0 - headroom))
