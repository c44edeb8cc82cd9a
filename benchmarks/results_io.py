"""What every benchmark does with its results: write them as JSON with their provenance.

`write_json` is the one place results are written: each file records where it came from (the
commit and whether the tree had uncommitted changes, the JAX, jaxlib and Python versions, the
platform, the devices and the command line), so a figure can be traced and re-run.
"""
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def provenance() -> dict:
    """Commit, dirty flag (changed tracked files other than results: a run that rewrites a
    committed result is not a run of changed code), versions, platform, devices, scheduling
    priority, the CPUs it may run on, XLA:CPU's pool threads and command line of this process."""
    out = {"commit": _git("rev-parse", "HEAD") or None,
           "dirty": bool(_git("status", "--porcelain", "--untracked-files=no", "--", ".",
                              ":(exclude)benchmarks/results")),
           "nice": os.nice(0) if hasattr(os, "nice") else None,
           "cpus_allowed": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
           "python": platform.python_version(), "platform": platform.platform(), "machine": platform.machine(),
           "cpu_count": os.cpu_count(), "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])
           if sys.argv and sys.argv[0] else None,
           "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if "jax" in sys.modules:  # a benchmark that never imported JAX does not start it here
        import jax
        import jaxlib
        out.update(jax=jax.__version__, jaxlib=jaxlib.__version__, device_count=jax.device_count(),
                   device_kind=jax.devices()[0].device_kind, backend=jax.default_backend(),
                   xla_flags=os.environ.get("XLA_FLAGS", ""),
                   # XLA:CPU sizes its thread pools (intra-op included) by these, else by the cores
                   cpu_pool_threads=os.environ.get("PJRT_NPROC") or os.environ.get("NPROC"))
    return out


def write_json(path: str, result) -> None:
    """Write `result` (a dict) to `path` as indented JSON, with its `provenance`."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if isinstance(result, dict):
        result = {**result, "provenance": provenance()}
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(result, fh, indent=1, default=_plain)
    os.replace(tmp, path)


def _plain(value):
    """NumPy scalars and arrays as JSON numbers and lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
