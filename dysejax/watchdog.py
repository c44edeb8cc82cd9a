"""Peer watchdog: a process whose peers stop answering exits with `error: lost process N ...`.

A dead process leaves the others blocked in a collective that never completes. Each process
therefore beats a counter in jax.distributed's key-value store from a background thread and
watches the others' counters; one that stops changing for `timeout_s` (measured on the local
clock), or a coordinator that stops answering, ends this process with a one-line error and
exit status 1 — from the watchdog thread, since the main thread may be stuck inside XLA.
(When process 0, which hosts the coordination service, dies, JAX itself usually aborts the
others at once with its own message.)
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Callable

_KEY = "dysejax/heartbeat/"


def fail(message: str, status: int = 1) -> None:
    """Print `error: message` and end the process now, from any thread (no cleanup runs)."""
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    os._exit(status)


def _lost(process: int, n: int, why: str, timeout_s: float) -> None:
    fail(f"lost process {process} of {n}: {why} (see its log; train.peer_timeout_s={timeout_s:g}). Stopping this "
         "process too: restart every process with the same command to resume from the last complete checkpoint")


@contextlib.contextmanager
def exit_after(timeout_s: float, message: Callable[[], str], status: int):
    """End the process with `error: message()` if the block is still running after `timeout_s`."""
    timer = threading.Timer(timeout_s, lambda: fail(message(), status))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


class PeerWatchdog(threading.Thread):
    """Beats this process's heartbeat and exits the process when a peer's stops for `timeout_s`."""

    def __init__(self, client, process_id: int, num_processes: int, timeout_s: float):
        super().__init__(name="dysejax-peer-watchdog", daemon=True)
        self.client, self.process_id, self.num_processes = client, process_id, num_processes
        self.timeout_s = timeout_s
        self.interval_s = min(1.0, timeout_s / 10)
        self._done = threading.Event()

    def run(self) -> None:
        beat = 0
        start = time.monotonic()
        last = {p: (None, start) for p in range(self.num_processes) if p != self.process_id}
        while not self._done.wait(self.interval_s):
            beat += 1
            try:
                self.client.key_value_set(f"{_KEY}{self.process_id}", str(beat), allow_overwrite=True)
                seen = {k.rsplit("/", 1)[-1]: v for k, v in self.client.key_value_dir_get(_KEY)}
            except Exception as e:  # the store lives in process 0
                if self._done.is_set():
                    return
                _lost(0, self.num_processes, f"the coordinator stopped answering ({' '.join(str(e).split())[:120]})",
                      self.timeout_s)
            now = time.monotonic()
            for p, (value, since) in last.items():
                current = seen.get(str(p))
                if current != value:
                    last[p] = (current, now)
                elif now - since > self.timeout_s:
                    _lost(p, self.num_processes, f"no heartbeat for {now - since:.0f} s: it died, hung or "
                          "exited early", self.timeout_s)

    def excepthook(self, previous):
        """`previous`, after giving this watchdog time to name a lost peer when the uncaught error is an
        XLA runtime error (a collective whose peer died fails in the main thread, e.g. a reset socket)."""
        def hook(kind, value, tb):
            import jax

            if issubclass(kind, jax.errors.JaxRuntimeError) and self.is_alive():
                time.sleep(self.timeout_s + 2 * self.interval_s)
            previous(kind, value, tb)
        return hook

    def stop(self) -> None:
        """Stop beating and watching (before a deliberate exit)."""
        self._done.set()
