"""Batches prepared on a background thread while the devices run the previous step.

`Prefetcher(produce, depth)` calls `produce()` on its own thread and keeps at most `depth`
results waiting (host memory: `depth` batches). `next()` returns them in order and re-raises
whatever `produce` raised, in the caller's thread. Each result carries what the caller needs to
checkpoint it (the data position after it), so stopping early loses nothing: batches made but
not taken are made again after a resume.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable


class Prefetcher:
    """See the module docstring; use as a context manager or call `close()`."""

    def __init__(self, produce: Callable[[], Any], depth: int = 2):
        self._produce = produce
        self._ready: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dysejax-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item = (True, self._produce())
            except BaseException as e:  # handed to the consumer, who raises it
                item = (False, e)
            while not self._stop.is_set():
                try:
                    self._ready.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if not item[0]:
                return

    def next(self) -> Any:
        """The next result of `produce()` (raises what it raised)."""
        ok, value = self._ready.get()
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """Stop the thread (after its current `produce()` call) and drop what is waiting."""
        self._stop.set()
        self._thread.join()
        while not self._ready.empty():
            self._ready.get_nowait()

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
