"""Counts JAX compilations in this process through `jax.monitoring` listeners.

Every new program is traced and lowered to MLIR (counted as `lowered`); XLA then compiles it,
unless the persistent cache already holds it (`backend`). After warmup both must stay still:
a compilation on the training path is a bug the trainer reports.
"""
from __future__ import annotations

import threading

import jax

LOWER_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
BACKEND_EVENT = "/jax/core/compile/backend_compile_duration"


class _Counter:
    def __init__(self):
        self.lowered = 0
        self.backend = 0
        self._lock = threading.Lock()

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
    return _counter
