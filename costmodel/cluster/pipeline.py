"""Pipeline-parallel cost terms: bubbles, in-flight activations, transfers, schedules.

Small pure functions shared by the planners (`costmodel.cluster.ptip`, `costmodel.cluster.hetero`).
Stage k of p (0 = first) runs m micro-batches per iteration. Schedules:
  gpipe  every forward, then every backward; each stage keeps all m micro-batches' activations.
  1f1b   min(p - k - 1, m) warm-up forwards, then one forward / one backward alternately, then
         the remaining backwards; stage k keeps min(p - k, m) micro-batches in flight.
Both have the same fill/drain bubble: (p - 1) / (m + p - 1) of the iteration for equal stages.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

SCHEDULES = ("gpipe", "1f1b")


def _check(schedule: str) -> None:
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r} (known: {', '.join(SCHEDULES)})")


def bubble_fraction(p: int, m: int) -> float:
    """Idle share of an iteration of p equal stages and m micro-batches (GPipe and 1F1B)."""
    return (p - 1) / (m + p - 1)


def in_flight(k: int, p: int, m: int, schedule: str = "1f1b") -> int:
    """Micro-batches whose activations stage k holds at its peak."""
    _check(schedule)
    return m if schedule == "gpipe" else min(p - k, m)


def transfer_time(nbytes: float, bandwidth: float, latency: float) -> float:
    """Seconds to move `nbytes` over a link of `bandwidth` bytes/s and `latency` s."""
    return nbytes / bandwidth + latency


def boundary_bytes(micro_batch: int, seq_len: int, d_model: int, act_bytes: int = 2) -> float:
    """Bytes of one micro-batch's activations (or their gradients) crossing a stage boundary."""
    return float(micro_batch * seq_len * d_model * act_bytes)


def flowshop_time(stage_time_s: Sequence[float], m: int) -> float:
    """Iteration of m micro-batches through stages of these per-micro-batch times: sum + (m - 1) max.

    Exact for m identical jobs in a flow shop (each stage's forward + backward one unit); the
    usual analytical estimate for GPipe / 1F1B."""
    t = np.asarray(stage_time_s, dtype=float)
    return t.sum() + (m - 1) * t.max()


def fill_drain_time(stage_time_s: Sequence[float]) -> float:
    """The flow-shop iteration's time beyond m x the bottleneck stage: sum - max."""
    t = np.asarray(stage_time_s, dtype=float)
    return float(t.sum() - t.max())


def stage_ops(k: int, p: int, m: int, schedule: str = "1f1b", recompute: bool = False) -> list:
    """Stage k's operations in execution order: ("F" | "R" | "B", micro-batch).

    With `recompute` the stage stores only its input per micro-batch and re-runs the forward
    ("R") just before each backward: the stage starts it as soon as its previous operation ends,
    so it fills the time the stage would otherwise wait for the backward's gradient."""
    _check(schedule)
    warm = m if schedule == "gpipe" else min(p - k - 1, m)
    ops = [("F", j) for j in range(warm)]
    for j in range(m):
        if warm + j < m:
            ops.append(("F", warm + j))
        if recompute:
            ops.append(("R", j))
        ops.append(("B", j))
    return ops


def iteration_time(fwd_s: Sequence[float], bwd_s: Sequence[float], send_s: Sequence[float], m: int,
                   schedule: str = "1f1b", recompute_s: Sequence[float] | None = None,
                   sync_s: Sequence[float] | None = None) -> float:
    """Exact iteration time of `stage_ops` with these per-micro-batch durations (max-plus recurrence).

    fwd_s/bwd_s/recompute_s: per stage (recompute 0 = none); send_s[k]: one transfer between stage
    k and k + 1 (each direction its own link, transfers in order); sync_s: per stage, after its
    last backward (gradient all-reduce)."""
    p = len(fwd_s)
    rec = [0.0] * p if recompute_s is None else list(recompute_s)
    sync = [0.0] * p if sync_s is None else list(sync_s)
    ops = [stage_ops(k, p, m, schedule, rec[k] > 0) for k in range(p)]
    dur = {"F": fwd_s, "B": bwd_s, "R": rec}
    arrive = {("F", 0, j): 0.0 for j in range(m)}  # (kind, stage, micro-batch) -> input ready
    arrive.update({("B", p - 1, j): 0.0 for j in range(m)})
    link_free = {}
    free, ptr, done = [0.0] * p, [0] * p, 0
    total = sum(len(o) for o in ops)
    while done < total:
        progressed = False
        for k in range(p):
            while ptr[k] < len(ops[k]):
                kind, j = ops[k][ptr[k]]
                ready = 0.0 if kind == "R" else arrive.get((kind, k, j))
                if ready is None:
                    break
                free[k] = max(free[k], ready) + dur[kind][k]
                to = k + 1 if kind == "F" else k - 1
                if kind != "R" and 0 <= to < p:
                    edge = min(k, to)
                    start = max(free[k], link_free.get((kind, edge), 0.0))
                    link_free[(kind, edge)] = arrive[(kind, to, j)] = start + send_s[edge]
                ptr[k] += 1
                done += 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked")  # cannot happen for gpipe / 1f1b
    return max(free[k] + sync[k] for k in range(p))
