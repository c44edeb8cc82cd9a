"""Counts JAX compilations in this process through `jax.monitoring` listeners.

Every new program is traced and lowered to MLIR (counted as `lowered`), then handed to the
backend (`backend`), which either finds it in the persistent cache (`cache_hits`) or has XLA
compile it (`xla_compiled` = backend - cache_hits). After warmup all must stay still: a
compilation on the training path is a bug the trainer reports. Across processes, a program
whose inputs are unchanged (a longer run, a new lr-schedule horizon) is a cache hit.
"""
from __future__ import annotations

import threading

import jax

LOWER_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
BACKEND_EVENT = "/jax/core/compile/backend_compile_duration"  # cache hits included
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


class _Counter:
    def __init__(self):
        self.lowered = 0
        self.backend = 0
        self.cache_hits = 0
        self._lock = threading.Lock()

    @property
    def xla_compiled(self) -> int:
        """Programs XLA compiled (handed to the backend and not found in the persistent cache)."""
        return self.backend - self.cache_hits

    def event(self, event: str, **kwargs) -> None:
        if event == CACHE_HIT_EVENT:
            with self._lock:
                self.cache_hits += 1

    def __call__(self, event: str, duration: float, **kwargs) -> None:
        if event == LOWER_EVENT:
            with self._lock:
                self.lowered += 1
        elif event == BACKEND_EVENT:
            with self._lock:
                self.backend += 1


_counter = None


def compile_counter() -> _Counter:
    """The process-wide counter (the listener is registered on first use)."""
    global _counter
    if _counter is None:
        _counter = _Counter()
        jax.monitoring.register_event_duration_secs_listener(_counter)
        jax.monitoring.register_event_listener(_counter.event)
    return _counter
