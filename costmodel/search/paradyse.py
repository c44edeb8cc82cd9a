"""ParaDySe's strategy selection (their Algorithm 1), per (batch, seq_len) bucket.

1. Drop dominated choices: a choice is dominated when another one is no slower per layer and
   no larger in stored and in peak bytes, and strictly better in one of the three.
2. If the fastest remaining choice fits on every layer, run it everywhere.
3. Otherwise try every two-segment plan: the first L-l layers the fastest choice, the last l
   layers one leaner choice (each lean choice, l = 1..L; l = L is the lean choice alone); the
   fastest plan that fits wins (the boundary switch between the segments is counted).
4. If none fits, fall back to the leanest all-layers plan (fits=False).

`ParaDySeSelector` adds the paper's runtime parts: a cache per (batch, seq_len) key and 5%
smoothing (keep the previous plan when it still fits this bucket and its predicted time is
within 5% of this bucket's own selection).
"""
from __future__ import annotations

import time as _time
from typing import Callable, Hashable, Optional

import numpy as np

from costmodel.search.arrays import TableArrays, byte_limit, evaluate, leanest_uniform, table_arrays
from costmodel.search.result import SearchResult, search_result

__all__ = ["non_dominated", "paradyse_plan", "ParaDySeSelector"]


def non_dominated(a: TableArrays) -> np.ndarray:
    """Indices of the choices no other choice dominates in (time, stored, peak)."""
    crit = np.stack([a.t, a.w, a.pk], axis=1)  # [K, 3]
    le = (crit[:, None, :] <= crit[None, :, :]).all(-1)  # le[b, a]: b no worse than a everywhere
    lt = (crit[:, None, :] < crit[None, :, :]).any(-1)
    dominated = (le & lt).any(axis=0)
    # exact duplicates: keep the first
    same = (crit[:, None, :] == crit[None, :, :]).all(-1)
    first = np.argmax(same, axis=0)
    dominated |= first != np.arange(a.K)
    return np.flatnonzero(~dominated)


def paradyse_plan(table, budget_bytes: float) -> SearchResult:
    """Algorithm 1 for one bucket: per-layer choice indices and predicted time/bytes."""
    t0 = _time.perf_counter()
    a = table_arrays(table)
    L = a.L
    keep = non_dominated(a)
    fast = int(keep[np.argmin(a.t[keep])])
    info = {"candidates": [table.choices[i].label if hasattr(table.choices[i], "label") else str(table.choices[i])
                           for i in keep], "pruned": int(a.K - keep.size)}

    uniform_fast = [fast] * L
    tf, bf = evaluate(a, uniform_fast)
    if bf <= budget_bytes:
        return search_result(table, a, uniform_fast, budget_bytes, "paradyse:fastest",
                           search_s=_time.perf_counter() - t0, info=info)

    # two-segment plans [fast]*(L-l) + [c]*l, vectorised over lean choices c and l = 1..L
    lean = keep[keep != fast]
    best = None
    if lean.size:
        ls = np.arange(1, L + 1)[None, :]  # [1, L]
        c = lean[:, None]  # [C, 1]
        mixed = ls < L  # both segments present
        time = a.base_t + (L - ls) * a.t[fast] + ls * a.t[c] + np.where(mixed, a.swt[fast, c], 0.0)
        stored = a.base_b + (L - ls) * a.w[fast] + ls * a.w[c]
        trans = np.where(mixed, np.maximum(a.pk[fast], a.pk[c] + a.swb[fast, c]), a.pk[c])
        nbytes = stored + trans
        ok = nbytes < byte_limit(budget_bytes)
        if ok.any():
            masked = np.where(ok, time, np.inf)
            ci, li = np.unravel_index(int(np.argmin(masked)), masked.shape)
            l = int(li) + 1
            best = [fast] * (L - l) + [int(lean[ci])] * l
            info.update(lean=int(lean[ci]), lean_layers=l)
    if best is not None:
        return search_result(table, a, best, budget_bytes, "paradyse:two-segment",
                           search_s=_time.perf_counter() - t0, info=info)
    lean_i = leanest_uniform(a)
    return search_result(table, a, [lean_i] * L, budget_bytes, "paradyse:leanest",
                       search_s=_time.perf_counter() - t0, info=info)


class ParaDySeSelector:
    """ParaDySe's per-input selection with a (batch, seq_len) cache and smoothing.

    `select(key, table)` returns the plan for the bucket `key` (e.g. `(batch, seq_len)`); the
    table may be omitted after the first call for a key, or produced by `table_fn(key)`.
    Smoothing: when the previously returned plan uses choices this table also has, still fits
    this bucket's budget and is predicted at most `smoothing` (5%) slower than this bucket's
    own selection, the previous plan is kept (method `paradyse:smoothed`).
    """

    def __init__(self, budget_bytes: float, *, smoothing: float = 0.05,
                 table_fn: Optional[Callable[[Hashable], object]] = None,
                 search: Callable = paradyse_plan):
        self.budget_bytes = float(budget_bytes)
        self.smoothing = float(smoothing)
        self.table_fn = table_fn
        self.search = search
        self.cache: dict = {}
        self.previous: Optional[SearchResult] = None
        self.hits = 0
        self.misses = 0
        self.smoothed = 0

    def _entry(self, key, table):
        if key in self.cache:
            self.hits += 1
            return self.cache[key]
        self.misses += 1
        if table is None:
            if self.table_fn is None:
                raise KeyError(f"no cost table for bucket {key!r} (pass table= or table_fn=)")
            table = self.table_fn(key)
        entry = (table, table_arrays(table), self.search(table, self.budget_bytes))
        self.cache[key] = entry
        return entry

    def select(self, key: Hashable, table=None) -> SearchResult:
        table, a, own = self._entry(key, table)
        chosen = own
        prev = self.previous
        if prev is not None and self.smoothing >= 0 and tuple(prev.choices) != tuple(own.choices) \
                and len(prev.choices) == a.L:
            try:
                idx = [table.choices.index(c) for c in prev.choices]
            except ValueError:
                idx = None
            if idx is not None:
                t, b = evaluate(a, idx)
                if b <= self.budget_bytes and t <= (1.0 + self.smoothing) * own.time_s:
                    self.smoothed += 1
                    chosen = search_result(table, a, idx, self.budget_bytes, "paradyse:smoothed",
                                         info={"own": own.plan_id, "own_time_s": own.time_s})
        self.previous = chosen
        return chosen

    def clear(self):
        self.cache.clear()
        self.previous = None
