"""Event-driven pipeline simulator: replays a schedule's operations on the stages and links.

Each stage runs its `costmodel.cluster.pipeline.stage_ops` in order, one at a time; a forward waits for
its input, a backward for its gradient, each sent over the link between the two stages (one
transfer at a time per direction, in arrival order). Memory per device: the stage's static bytes,
+ kept activations from each forward's start until its backward ends, + the re-materialised
activations from a recompute's start until that backward ends. After its last backward a stage
runs its gradient sync; the iteration ends when every stage has.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence

from costmodel.cluster.hetero.stage import StageCost
from costmodel.cluster.pipeline import stage_ops

__all__ = ["SimResult", "simulate"]


@dataclass(frozen=True)
class SimResult:
    iteration_s: float
    busy_s: tuple  # per stage: compute + sync
    bubble_s: tuple  # per stage: idle time within the iteration
    peak_bytes: tuple  # per device of each stage
    events: int

    @property
    def bubble_fraction(self) -> float:
        """Idle share of all stages' time."""
        return sum(self.bubble_s) / (len(self.bubble_s) * self.iteration_s)


def simulate(costs: Sequence[StageCost], send_s: Sequence[float], m: int, schedule: str = "1f1b") -> SimResult:
    """Replay one iteration of m micro-batches (send_s[k]: one transfer between stage k and k + 1)."""
    p = len(costs)
    ops = [stage_ops(k, p, m, schedule, costs[k].recompute) for k in range(p)]
    dur = [{"F": c.fwd_s, "R": c.recompute_s, "B": c.bwd_s} for c in costs]
    ptr, running, arrived = [0] * p, [False] * p, set()
    mem = [c.static_bytes for c in costs]
    peak, busy, end = list(mem), [0.0] * p, [0.0] * p
    link_free = {}
    events, seq, count = [], 0, 0

    def push(t, kind, k, op, j):
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, k, op, j))
        seq += 1

    def try_start(k, t):
        if running[k] or ptr[k] == len(ops[k]):
            return
        op, j = ops[k][ptr[k]]
        if (op == "F" and k > 0 or op == "B" and k < p - 1) and (op, k, j) not in arrived:
            return
        running[k] = True
        mem[k] += {"F": costs[k].act_bytes, "R": costs[k].recompute_bytes, "B": 0.0}[op]
        peak[k] = max(peak[k], mem[k])
        push(t + dur[k][op], "done", k, op, j)

    def send(op, k, to, j, t):
        edge = min(k, to)
        start = max(t, link_free.get((op, edge), 0.0))
        link_free[(op, edge)] = start + send_s[edge]
        push(start + send_s[edge], "arrive", to, op, j)

    for k in range(p):
        try_start(k, 0.0)
    while events:
        t, _, kind, k, op, j = heapq.heappop(events)
        count += 1
        if kind == "arrive":
            arrived.add((op, k, j))
        else:
            running[k] = False
            busy[k] += dur[k][op]
            if op == "B":
                mem[k] -= costs[k].act_bytes + costs[k].recompute_bytes
            if op == "F" and k < p - 1:
                send("F", k, k + 1, j, t)
            if op == "B" and k > 0:
                send("B", k, k - 1, j, t)
            ptr[k] += 1
            end[k] = t
        try_start(k, t)
    if any(ptr[k] < len(ops[k]) for k in range(p)):
        raise RuntimeError("pipeline schedule deadlocked")  # cannot happen for gpipe / 1f1b
    finish = [end[k] + costs[k].sync_s for k in range(p)]
    total = max(finish)
    busy = [busy[k] + costs[k].sync_s for k in range(p)]
    return SimResult(iteration_s=total, busy_s=tuple(busy), bubble_s=tuple(total - b for b in busy),
                     peak_bytes=tuple(peak), events=count)
