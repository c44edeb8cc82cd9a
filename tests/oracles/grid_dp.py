"""Test oracle: the per-bucket optimum by DP over layers and discretised memory, per transient cap.

`grid_dp_plan(table, budget)` must agree with `costmodel.search.exact_plan` (the label search)
and with HiGHS (`tests.oracles.milp.milp_plan`); it was the exact search's fallback before
the label search proved itself, and is kept as an independent solver for the tests and
benchmarks/search.py only.

The max-over-layers transient term is handled exactly by enumerating its value: the cap C
ranges over the distinct transients (pk[j] and pk[j] + swb[i, j]). Under a cap C only the
choices with pk <= C may run and only the transitions with pk[j] + swb[i, j] <= C are
allowed; the stored bytes must then fit in budget - base - C. The optimum is the best over
caps (the optimal plan's own transient is one of them, and the cap problem only changes
at them).

Caps are visited from the largest down (branch and bound). The DP of the last cap solved
allows a superset of every smaller cap's transitions, so it bounds each smaller cap from
below and offers its best plan (optimal for that cap when it fits it). A cap is pruned
when that bound, or its Lagrangian bound (max over lam of the fastest plan under
time + lam x stored bytes, a shortest path over identical layers computed by min-plus
matrix powers), is not below the incumbent; a new DP runs only for the caps left. The
incumbent starts as the ParaDySe plan, so the result is never worse than it.

Memory: every layer stores at least min(w); the DP counts the excess w - min(w) in grid
units. Exact grid: when all excesses are integer multiples of one unit g (bytes from shape
formulas usually are) and the budget spans at most `exact_bins` of them, the DP is exact.
Otherwise the unit is near the budget span / `bins`, excesses are rounded DOWN: the DP is a
relaxation, so its optimum (over caps) is a proven lower bound. Incumbents from each DP:
its best state with at most (budget - L x the largest rounding remainder) units (fits
for sure), then its fastest states up to the budget (`scan` of them) checked in true
bytes. The unit is chosen near span / bins so that every excess lies just above a whole
number of units (small remainders: tight bound). The plan is proven optimal when it
meets the bound; while the gap exceeds `rel_tol` the grid is
refined (x4 up to `max_bins`). The returned
plan always truly fits; `optimal` says whether it was proven, `info["gap"]` bounds how far
from the optimum it can be.

Cost per DP: L * R * K * G element operations (R = distinct rows of the switch matrix,
the number of boundary layouts in real tables; G grid units), numpy, one pass per layer.

Ties (DP): the plan is reconstructed preferring to stay on the same choice, so equal-cost
plans come out with few runs (one scan per run in dysejax).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import reduce
from typing import Optional

import numpy as np

import time as _time

from costmodel.search import paradyse_plan
from costmodel.search.arrays import TableArrays, fewest_bytes_plan, plan_time, plan_transient, subset, table_arrays
from costmodel.search.prune import prune_exact
from costmodel.search.result import SearchResult, search_result

__all__ = ["grid_dp_plan", "choose_grid", "solve_caps"]

_INF = np.inf


@dataclass
class _DP:
    """One DP run: min time per (layer, last choice, memory units used)."""

    t: np.ndarray
    eq: np.ndarray
    S: np.ndarray  # [K, K] switch time, inf = not allowed
    H: np.ndarray  # [L, K, G+1] min time per layer, last choice, units
    colmin: np.ndarray  # [G+1] best over last choice, per memory units
    pm: np.ndarray  # prefix min of colmin
    tr: np.ndarray  # [K, K] transients (for the plan's transient)
    pk: np.ndarray

    def best(self, b: int) -> float:
        if b < 0:
            return _INF
        return float(self.pm[min(b, len(self.pm) - 1)])

    def state_plans(self, js, ms) -> np.ndarray:
        """[n, L] plans of final states (js[i], ms[i]), reconstructed together (ties: stay)."""
        L = self.H.shape[0]
        j = np.asarray(js, dtype=np.int64).copy()
        m = np.asarray(ms, dtype=np.int64).copy()
        out = np.empty((j.size, L), dtype=np.int64)
        out[:, L - 1] = j
        cols = np.arange(j.size)
        for l in range(L - 1, 0, -1):
            m -= self.eq[j]
            vals = self.H[l - 1][:, m] + self.S[:, j]  # [K, n]
            i = vals.argmin(0)
            stay = vals[j, cols] <= vals[i, cols] + 1e-12 * np.abs(vals[i, cols])
            j = np.where(stay, j, i)
            out[:, l - 1] = j
        return out

    def state_plan(self, j: int, m: int) -> list:
        return [int(x) for x in self.state_plans([j], [m])[0]]

    def plan(self, b: int) -> list:
        b = min(b, len(self.pm) - 1)
        m = int(np.argmin(self.colmin[:b + 1]))
        return self.state_plan(int(np.argmin(self.H[-1, :, m])), m)

    def candidates(self, b: int, limit: int = 4):
        """Final states with at most b units, fastest first: (time, last choice, units)."""
        last = self.H[-1][:, :min(b, self.H.shape[2] - 1) + 1]
        flat = last.ravel()
        k = min(limit, flat.size)
        part = np.argpartition(flat, k - 1)[:k] if flat.size > k else np.arange(flat.size)
        part = part[np.argsort(flat[part], kind="stable")]
        return [(float(flat[f]), int(f // last.shape[1]), int(f % last.shape[1])) for f in part if np.isfinite(flat[f])]

    def transient(self, plan) -> float:
        idx = np.asarray(plan)
        tr = self.pk[idx[:1]].max()
        if idx.size > 1:
            tr = max(tr, self.tr[idx[:-1], idx[1:]].max())
        return float(tr)


def _run_dp(t, eq, S, L, G, tr, pk) -> _DP:
    """min time over plans of L layers, per (last choice, stored units); transitions S (inf = no)."""
    K = len(t)
    # group source rows with identical switch rows: the min over i runs per group first
    _, first, inv = np.unique(S, axis=0, return_index=True, return_inverse=True)
    inv = np.asarray(inv).ravel()
    R = len(first)
    H = np.empty((L, K, G + 1))
    cur = H[0]
    cur.fill(_INF)
    ok = eq <= G
    cur[np.flatnonzero(ok), eq[ok]] = t[ok]
    # shifted gather: new[j, m] = Mp[j, m - eq[j] + 1] (Mp[:, 0] = inf)
    cols = np.arange(G + 1)[None, :] - eq[:, None] + 1
    cols[cols < 1] = 0
    flat = (np.arange(K)[:, None] * (G + 2) + cols).ravel()
    Mp = np.empty((K, G + 2))
    Mp[:, 0] = _INF
    Mv = Mp[:, 1:]
    tcol = t[:, None]
    grouped = R < K
    if grouped:
        groups = [np.flatnonzero(inv == r) for r in range(R)]
        slices = [(int(g[0]), int(g[-1]) + 1) if np.all(np.diff(g) == 1) else g for g in groups]
        Sc = S[first][:, :, None]
        src = np.empty((R, G + 1))
    else:
        Sc = S[:, :, None]
    tmp = np.empty((R, K, G + 1))
    for l in range(1, L):
        if grouped:
            for r, sl in enumerate(slices):
                if isinstance(sl, tuple):
                    if sl[1] - sl[0] == 1:
                        src[r] = cur[sl[0]]
                    else:
                        np.min(cur[sl[0]:sl[1]], axis=0, out=src[r])
                else:
                    np.min(cur[sl], axis=0, out=src[r])
        else:
            src = cur
        np.add(src[:, None, :], Sc, out=tmp)
        np.min(tmp, axis=0, out=Mv)
        Mv += tcol
        cur = H[l]
        np.take(Mp, flat, out=cur.reshape(-1))
    colmin = cur.min(axis=0)
    return _DP(t=t, eq=eq, S=S, H=H, colmin=colmin, pm=np.minimum.accumulate(colmin), tr=tr, pk=pk)


def choose_grid(e: np.ndarray, span: float, bins: int, max_exact_bins: int, L: int = 1):
    """(unit bytes, exact) for stored-byte excesses e over a budget span of `span` bytes.

    Exact: an integer unit dividing every excess within `max_exact_bins` units. Otherwise a
    unit near span / bins (between 1/4 and 4x the units) chosen so that every excess is
    close above a whole number of units: the rounded-down DP then loses at most
    L x max remainder bytes, which bounds how loose its lower bound can be.
    """
    pos = e[e > 0]
    if pos.size == 0:
        return max(span, 1.0) / max(bins, 1), True
    if np.all(e == np.rint(e)) and np.all(e < 2**53):
        g = reduce(math.gcd, (int(v) for v in pos))
        if span / g <= max_exact_bins:
            return float(g), True
    u0 = max(span, float(pos.min()) * 1e-9) / bins
    cands = [u0]
    for v in np.unique(pos):
        lo, hi = max(1, int(np.ceil(v / (4 * u0)))), int(np.floor(v * 4 / u0))
        ns = np.arange(lo, max(lo, hi) + 1)
        if ns.size > 400:
            ns = np.unique(np.geomspace(lo, max(lo, hi), 400).astype(int))
        cands.extend(v / ns)
    u = np.asarray(cands)
    inside = (span / u <= 4 * bins) & (span / u >= bins / 4)
    u = u[inside] if inside.any() else u[:1]
    q = pos[None, :] / u[:, None]
    rem = (q - np.floor(q + 1e-9)).clip(min=0).max(axis=1) * u  # worst remainder in bytes
    loose = L * rem  # the rounded-down DP's worst under-count
    cost = span / u  # grid size
    best = int(np.lexsort((cost, np.round(loose / max(u0, 1e-30), 3)))[0])
    return float(u[best]), False


def solve_caps(a: TableArrays, S_avail: float, unit: float, exact: bool, stats: dict,
                incumbent: Optional[tuple] = None, scan: int = 16):
    """Best plan over transient caps on a grid of `unit` bytes.

    Excesses are rounded down (exact=False: a relaxation) or exact. Returns (lower bound, best
    truly fitting plan found or None, its time); times exclude base_t. With exact=True the
    bound is the optimum and the plan attains it.
    """
    L = a.L
    wmin = float(a.w.min())
    e = a.w - wmin
    eq = (np.rint(e / unit) if exact else np.floor(e / unit + 1e-9)).astype(np.int64)
    rmax = np.maximum(e - eq * unit, 0.0)  # bytes each layer of a choice may be under-counted
    tr = a.transient
    caps = np.unique(np.concatenate([a.pk, tr.ravel()]))
    Eb = S_avail - caps - L * wmin  # stored excess allowed under each cap
    bcap = np.floor(Eb / unit + (0.0 if exact else 1e-9))
    sel = (Eb >= 0) & (bcap >= 0)
    caps, Eb, bcap = caps[sel], Eb[sel], bcap[sel].astype(np.int64)
    if caps.size == 0:
        return _INF, None, _INF
    G = max(int(min(bcap.max(), L * max(int(eq.max()), 0))), 0)
    inc_v, inc_plan = (incumbent if incumbent is not None else (_INF, None))
    lower = _INF
    relax = None  # (DP, index map) of the last cap solved: a relaxation of every smaller cap

    def fits(plan, C):
        idx = np.asarray(plan)
        return a.w[idx].sum() - L * wmin <= Eb_c + 1e-6 and plan_transient(a, idx) <= C

    for ci in range(caps.size - 1, -1, -1):
        C, b, Eb_c = float(caps[ci]), int(bcap[ci]), float(Eb[ci])
        cap_lb = -_INF  # a lower bound on this cap's optimum
        if relax is not None:
            dp, idx = relax
            cap_lb = dp.best(b)
            if not cap_lb < inc_v * (1 - 1e-12):
                stats["pruned"] += 1
                lower = min(lower, cap_lb)
                continue
            plan = [int(idx[i]) for i in dp.plan(b)]
            if fits(plan, C):  # the relaxation's optimum fits this cap: optimal for it
                stats["quick"] += 1
                inc_v, inc_plan = cap_lb, plan
                lower = min(lower, cap_lb)
                continue
        allowed = np.flatnonzero(a.pk <= C)
        if allowed.size == 0:
            continue
        sub_tr = tr[np.ix_(allowed, allowed)]
        S = np.where(sub_tr <= C, a.swt[np.ix_(allowed, allowed)], _INF)
        if np.isfinite(inc_v):
            # Lagrangian bound of this cap (at lam = 0: its fastest plan, memory ignored)
            lb = _lagrange_bound(a.t[allowed], e[allowed], S, L, Eb_c)
            if not lb < inc_v * (1 - 1e-12):
                stats["pruned"] += 1
                lower = min(lower, max(cap_lb, lb))
                continue
        dp = _run_dp(a.t[allowed], eq[allowed], S, L, G, sub_tr, a.pk[allowed])
        stats["dps"] += 1
        relax = (dp, allowed)
        lower = min(lower, dp.best(b))
        # states with at most m_safe units fit for sure: true excess <= m u + L x max remainder
        m_safe = int(np.floor((Eb_c - L * rmax[allowed].max()) / unit)) if not exact else b
        if 0 <= m_safe and dp.best(m_safe) < inc_v * (1 - 1e-12):
            plan = [int(allowed[i]) for i in dp.plan(m_safe)]
            if fits(plan, C):
                inc_v, inc_plan = plan_time(a, plan), plan
        cand = [c for c in dp.candidates(b, scan) if c[0] < inc_v * (1 - 1e-12)]
        if cand:
            plans = allowed[dp.state_plans([c[1] for c in cand], [c[2] for c in cand])]  # [n, L]
            st = a.w[plans].sum(1) - L * wmin
            trs = np.maximum(a.pk[plans].max(1), tr[plans[:, :-1], plans[:, 1:]].max(1) if L > 1 else 0.0)
            ok = np.flatnonzero((st <= Eb_c + 1e-6) & (trs <= C))
            if ok.size:
                plan = [int(x) for x in plans[ok[0]]]
                inc_v, inc_plan = plan_time(a, plan), plan
    return min(lower, inc_v), inc_plan, inc_v


def _minplus(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    return (A[:, :, None] + B[None, :, :]).min(axis=1)


def _path_bound(t: np.ndarray, S: np.ndarray, L: int) -> float:
    """Fastest plan of L layers over these choices/transitions, memory ignored (min-plus power)."""
    A = S + t[None, :]  # switch into j, then run j
    v = t[None, :]
    n, P = L - 1, A
    while n:
        if n & 1:
            v = _minplus(v, P)
        n >>= 1
        if n:
            P = _minplus(P, P)
    return float(v.min())


def _lagrange_bound(t: np.ndarray, e: np.ndarray, S: np.ndarray, L: int, E: float, iters: int = 14) -> float:
    """max over lam >= 0 of min_plan [time + lam (stored excess - E)] (a valid lower bound).

    The inner minimum is a shortest path over identical layers (min-plus power, no memory
    dimension); the dual is concave in lam, maximised by golden-section search.
    """
    de = e[None, :] - e[:, None]
    dt = t[:, None] - t[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        rates = np.where(de > 0, dt / de, 0.0)
    hi = float(max(rates.max(), 0.0)) * 1.01 + 1e-30

    def val(lam):
        return _path_bound(t + lam * e, S, L) - lam * E

    g = (np.sqrt(5) - 1) / 2
    lo_, hi_ = 0.0, hi
    x1, x2 = hi_ - g * (hi_ - lo_), lo_ + g * (hi_ - lo_)
    f1, f2 = val(x1), val(x2)
    best = max(val(0.0), f1, f2)
    for _ in range(iters):
        if f1 < f2:
            lo_, x1, f1 = x1, x2, f2
            x2 = lo_ + g * (hi_ - lo_)
            f2 = val(x2)
        else:
            hi_, x2, f2 = x2, x1, f1
            x1 = hi_ - g * (hi_ - lo_)
            f1 = val(x1)
        best = max(best, f1, f2)
    return best


def grid_dp_plan(table, budget_bytes: float, *, bins: int = 1024, max_bins: int = 4096, exact_bins: int = 4096,
                 rel_tol: float = 1e-3, scan: int = 16, prune: bool = True) -> SearchResult:
    """The fastest per-layer plan within `budget_bytes` by the grid DP (method `dp`).

    bins: grid units over the stored-byte span; while the plan is not proven within rel_tol
    of the optimum the grid is refined x4 up to max_bins. exact_bins: an exact integer grid
    (all stored-byte differences multiples of one unit) is used whenever it needs at most this
    many units. scan: final states checked per DP for a truly fitting plan. The returned plan
    fits when anything fits (fits=False: nothing fits, the fewest-bytes plan is returned).
    optimal: proven optimal; info: kept choices, unit_bytes, grid_exact, bins, DPs run, caps
    pruned / settled without a DP, lower_bound_s (a proven lower bound on the optimum), gap.
    """
    t0 = _time.perf_counter()
    full = table_arrays(table)
    keep = prune_exact(full) if prune else np.arange(full.K)
    a = subset(full, keep)
    S_avail = float(budget_bytes) - a.base_b
    wmin = float(a.w.min())
    e = a.w - wmin
    span = S_avail - float(a.pk.min()) - a.L * wmin
    info = {"kept": int(len(keep)), "choices": int(full.K), "dps": 0, "pruned": 0, "quick": 0}

    def done(plan, optimal=True, **extra):
        if plan is None:
            plan, extra = fewest_bytes_plan(full), {**extra, "reason": "nothing fits"}
        else:
            plan = [int(keep[i]) for i in plan]
        return search_result(table, full, plan, budget_bytes, "dp", optimal=optimal,
                             search_s=_time.perf_counter() - t0, info={**info, **extra})

    if span < 0:
        return done(None)
    if e.max() > 0:
        span = min(span, a.L * float(e.max()))
    seed = None
    # incumbent: the best uniform or ParaDySe two-segment plan that fits (prunes caps early)
    h = paradyse_plan(_SubTable(a), budget_bytes)
    if h.fits:
        seed = (h.time_s - a.base_t, list(h.per_layer))
    nb, lower, gap = bins, -_INF, _INF
    while True:
        unit, exact = choose_grid(e, span, nb, exact_bins, a.L)
        info.update(unit_bytes=unit, grid_exact=exact, bins=nb)
        lo, plan, v = solve_caps(a, S_avail, unit, exact, info, seed, scan)
        lower = max(lower, lo)
        if plan is None and not np.isfinite(lo):
            return done(None)  # even the relaxation has nothing: provably nothing fits
        if plan is not None:
            seed = (v, plan)
        gap = (seed[0] - lower) / (seed[0] + a.base_t) if seed is not None else _INF
        if seed is not None and (exact or gap <= max(rel_tol, 1e-12)):
            return done(seed[1], optimal=exact or gap <= 1e-12, lower_bound_s=lower + a.base_t, gap=max(gap, 0.0))
        if nb * 4 > max_bins:
            break
        nb *= 4
    return done(seed[1] if seed else None, optimal=False, lower_bound_s=lower + a.base_t, gap=gap)


class _SubTable:
    """TableArrays seen as a cost table (for running the heuristic on the pruned choices)."""

    def __init__(self, a: TableArrays):
        self.choices = tuple(range(a.K))
        self.n_layers = a.L
        self.layer_time_s, self.layer_stored_bytes, self.layer_peak_bytes = a.t, a.w, a.pk
        self.switch_time_s, self.switch_bytes = a.swt, a.swb
        self.base_bytes, self.base_time_s = a.base_b, a.base_t
