"""Progress of long phases: a tqdm bar on a terminal, plain lines otherwise (logs, pipes, notebooks).

A run's output is read two ways: live on a terminal, where a bar redraws in place, and later in
a log file or CI output, where a redrawn bar is noise. `on_terminal()` decides which; `Phase`
shows a bar, or a line when the phase starts and one when it ends (with its duration).
"""
from __future__ import annotations

import contextlib
import sys
import time
from typing import Callable, Optional


def on_terminal() -> bool:
    """Whether a progress bar can redraw in place (stderr, where tqdm writes, is a terminal)."""
    return sys.stderr.isatty()


LINE_EVERY_S = 30.0  # without a bar, a long phase prints where it is this often


class Phase:
    """`with Phase("warmup", total=10, log=print) as p: ... p.update(1, note)`: a bar, or lines: one
    when the phase starts, one every LINE_EVERY_S seconds of it, one when it ends.

    With `lazy`, nothing shows until the first `update` (a phase served from a cache stays silent)."""

    def __init__(self, desc: str, total: Optional[int] = None, unit: str = "it", enabled: bool = True,
                 log: Callable[[str], None] = print, bar: Optional[bool] = None, lazy: bool = True):
        self.desc, self.total, self.unit, self.enabled, self.log = desc, total, unit, enabled, log
        self.lazy, self._started = lazy, False
        self.bar_on = enabled and (on_terminal() if bar is None else bar)
        self.count, self._bar, self._t0, self._last_line = 0, None, 0.0, 0.0

    def __enter__(self) -> "Phase":
        self._t0 = time.perf_counter()
        if not self.lazy:
            self._start()
        return self

    def _start(self) -> None:
        self._started, self._last_line = True, time.perf_counter()
        if self.bar_on:
            from tqdm import tqdm
            self._bar = tqdm(total=self.total, desc=self.desc, unit=self.unit, file=sys.stderr, dynamic_ncols=True)
        elif self.enabled:
            of = f" ({self.total} {self.unit}s)" if self.total else ""
            self.log(f"{self.desc}{of} ...")

    def update(self, n: int = 1, note: Optional[str] = None) -> None:
        if not self._started:
            self._start()
        self.count += n
        if self._bar is not None:
            if note:
                self._bar.set_postfix_str(note, refresh=False)
            self._bar.update(n)
        elif self.enabled and time.perf_counter() - self._last_line >= LINE_EVERY_S:
            self._last_line = time.perf_counter()
            of = f"/{self.total}" if self.total else ""
            self.log(f"{self.desc}: {self.count}{of} {self.unit}s{f' ({note})' if note else ''}, "
                     f"{self._last_line - self._t0:.0f} s")

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.enabled and self.count and exc[0] is None:
            self.log(f"{self.desc}: {self.count} {self.unit}s in {time.perf_counter() - self._t0:.1f} s")


@contextlib.contextmanager
def step_bar(enabled: bool, start: int, target: int):
    """A tqdm bar of training steps showing loss, tokens/s, bucket and plan; `.update(row)` per step."""
    from tqdm import tqdm

    bar = tqdm(total=target, initial=start, disable=not enabled, unit="step", file=sys.stderr,
               dynamic_ncols=True, mininterval=0.5)

    class Bar:
        def update(self, row):
            bar.set_postfix(loss=f"{row['loss']:.3f}", tok_s=f"{row['tokens_per_s']:.0f}",
                            bucket=row["bucket"], plan=row["plan"], refresh=False)
            bar.update(1)
    try:
        yield Bar()
    finally:
        bar.close()
