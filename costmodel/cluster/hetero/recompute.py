"""Recomputation-aware scheduling: does the recompute of memory-poor stages hide in their bubbles?

The partitioner turns recompute on only for stages that do not fit without it. The schedule
(`costmodel.cluster.pipeline.stage_ops`) starts each recompute as soon as the stage's previous operation
ends, so it runs while the stage waits for the next backward's gradient: free when that wait is
at least the recompute, on the critical path otherwise. This module measures which: the same
plan with recompute taking no time is the bound it is compared with.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from costmodel.cluster.hetero.stage import StageCost
from costmodel.cluster.pipeline import iteration_time

__all__ = ["RecomputeReport", "recompute_report"]


@dataclass(frozen=True)
class RecomputeReport:
    stages: tuple  # stage indices that recompute
    recompute_s: tuple  # per stage: recompute time per iteration (m x one micro-batch's)
    bubble_s: tuple  # per stage: idle time per iteration without the recompute
    extra_s: float  # iteration time the recompute adds (0 when the bubbles absorb it)

    @property
    def hidden(self) -> bool:
        return self.extra_s <= 1e-9 * max(sum(self.recompute_s), 1e-30)

    def describe(self) -> str:
        if not self.stages:
            return "none"
        where = f"stages {', '.join(map(str, self.stages))}: {sum(self.recompute_s):.3f} s of recompute"
        return (f"{where}, hidden in pipeline bubbles (+0 s)" if self.hidden
                else f"{where}, {self.extra_s:.4f} s not hidden by the bubbles (added to the iteration)")


def recompute_report(costs: Sequence[StageCost], send_s: Sequence[float], m: int, schedule: str) -> RecomputeReport:
    """Compare the plan's iteration with the same plan whose recompute costs nothing."""
    fwd = [c.fwd_s for c in costs]
    bwd = [c.bwd_s for c in costs]
    sync = [c.sync_s for c in costs]
    rec = [c.recompute_s for c in costs]
    with_rec = iteration_time(fwd, bwd, send_s, m, schedule, rec, sync)
    free = iteration_time(fwd, bwd, send_s, m, schedule, None, sync)
    idx = tuple(k for k, c in enumerate(costs) if c.recompute)
    return RecomputeReport(stages=idx, recompute_s=tuple(m * rec[k] for k in idx),
                           bubble_s=tuple(free - m * (fwd[k] + bwd[k]) - sync[k] for k in idx),
                           extra_s=max(0.0, with_rec - free))
