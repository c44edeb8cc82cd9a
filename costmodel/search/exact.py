"""The exact per-layer optimum of one cost table: minimise plan time under a byte budget.

    minimise   base_t + sum_l t[c_l] + sum_{l>=1} swt[c_{l-1}, c_l]
    subject to base_b + sum_l w[c_l] + max_l tr_l <= budget,
               tr_0 = pk[c_0],  tr_l = pk[c_l] + swb[c_{l-1}, c_l]

Two solvers that must agree:

`exact_plan` — by default a label search over layers (exact, no memory grid; the fast path),
falling back to dynamic programming over layers and discretised memory (`solver="dp"` forces it).
  * Label search (`_label_search`): layers are identical, so a plan is a multiset of choices
    arranged in runs. The incumbent is the best plan of at most two runs (every choice, every
    ordered pair and split, vectorised). Caps (below) whose node LP (closed form: at most two
    choices mixed) or Lagrangian bound cannot beat it are dropped; per remaining cap the best
    completions of r layers (time + lam x stored, fewest stored, at least one more switch) are
    computed backwards once. Labels (last choice, cap index of the transient so far, time,
    switches, stored bytes in exact integer units of 2^-k bytes) are extended layer by layer;
    a child survives only if staying on its choice to the end fits and beats the incumbent, or
    a switching completion may (Lagrangian bound); per (choice, cap) only the Pareto front of
    (time + eps x switches, stored) is kept. It is exact for time + eps x switches, eps =
    1e-11 x the plan time scale: the fastest plan, ties going to fewer runs (plan ids like
    `fsdp:96`, not `dp:62,fsdp:34`). Above `max_labels` labels a layer it hands its incumbent
    to the DP. On the 13b cost tables (96 layers, 5-7 strategies) it takes 0.3-20 ms.
  * The max-over-layers transient term is handled exactly by enumerating its value: the cap C
    ranges over the distinct transients (pk[j] and pk[j] + swb[i, j]). Under a cap C only the
    choices with pk <= C may run and only the transitions with pk[j] + swb[i, j] <= C are
    allowed; the stored bytes must then fit in budget - base - C. The optimum is the best over
    caps (the optimal plan's own transient is one of them, and the cap problem only changes
    at them).
  * Caps are visited from the largest down (branch and bound). The DP of the last cap solved
    allows a superset of every smaller cap's transitions, so it bounds each smaller cap from
    below and offers its best plan (optimal for that cap when it fits it). A cap is pruned
    when that bound, or its Lagrangian bound (max over lam of the fastest plan under
    time + lam x stored bytes, a shortest path over identical layers computed by min-plus
    matrix powers), is not below the incumbent; a new DP runs only for the caps left. The
    incumbent starts as the ParaDySe plan (below), so the result is never worse than it.
  * Memory: every layer stores at least min(w); the DP counts the excess w - min(w) in grid
    units. Exact grid: when all excesses are integer multiples of one unit g (bytes from shape
    formulas usually are) and the budget spans at most `exact_bins` of them, the DP is exact.
    Otherwise the unit is near the budget span / `bins`, excesses are rounded DOWN: the DP is a
    relaxation, so its optimum (over caps) is a proven lower bound. Incumbents from each DP:
    its best state with at most (budget - L x the largest rounding remainder) units (fits
    for sure), then its fastest states up to the budget (`scan` of them) checked in true
    bytes. The unit is chosen near span / bins so that every excess lies just above a whole
    number of units (small remainders: tight bound). The plan is proven optimal when it
    meets the bound; while the gap exceeds `rel_tol` the grid is
    refined (x4 up to `max_bins`), then `fallback="milp"` can settle the rest. The returned
    plan always truly fits; `optimal` says whether it was proven, `info["gap"]` bounds how far
    from the optimum it can be.
  * Exact pruning first: a choice (or a whole boundary-layout class) is dropped when
    replacing it everywhere by another kept choice never increases time, stored bytes, any
    transient or any switch (see `prune_exact`); this keeps the optimum and usually leaves
    a handful of choices (e.g. 21 -> 3 on a structured 96-layer table).
  * Cost per DP: L * R * K * G element operations (R = distinct rows of the switch matrix,
    the number of boundary layouts in real tables; G grid units), numpy, one pass per layer.
  * Ties (DP): the plan is reconstructed preferring to stay on the same choice, so equal-cost
    plans come out with few runs (one scan per run in dysejax).

`milp_plan` (`costmodel.search.milp`) finds the same optimum with HiGHS, as the cross-check.

All figures are model predictions of the cost table.
"""
from __future__ import annotations

import math
import time as _time
from dataclasses import dataclass
from functools import reduce
from typing import Optional

import numpy as np

from costmodel.search._common import SearchResult, TableArrays, arrays, evaluate, leanest_uniform, make_result

__all__ = ["exact_plan", "prune_exact", "min_bytes_plan"]

_INF = np.inf


# ------------------------------------------------------------------------------------------
# exact dominance pruning
# ------------------------------------------------------------------------------------------
def _dominance(t, w, pk, swt, tr) -> np.ndarray:
    """D[b, a]: replacing choice a by b everywhere never increases time, stored or transient."""
    K = len(t)
    ar = np.arange(K)
    base = (t[:, None] <= t[None, :]) & (w[:, None] <= w[None, :]) & (pk[:, None] <= pk[None, :])
    excl = (ar[:, None, None] == ar[None, :, None]) | (ar[:, None, None] == ar[None, None, :])  # [k, b, a]
    ok = base
    for m in (swt, tr):
        into = (m[:, :, None] <= m[:, None, :]) | excl  # m[k, b] <= m[k, a]
        out = (m.T[:, :, None] <= m.T[:, None, :]) | excl  # m[b, k] <= m[a, k]
        diag = np.diag(m)
        selfc = (diag[:, None] <= diag[None, :]) & (diag[:, None] <= m.T) & (diag[:, None] <= m)  # [b, a]
        ok = ok & into.all(0) & out.all(0) & selfc
    np.fill_diagonal(ok, False)
    return ok


def _mapping_ok(a: TableArrays, phi: np.ndarray, tr: np.ndarray) -> bool:
    """Replacing every choice i by phi[i] at once never increases any term of any plan."""
    if not (np.all(a.t[phi] <= a.t) and np.all(a.w[phi] <= a.w) and np.all(a.pk[phi] <= a.pk)):
        return False
    P = np.ix_(phi, phi)
    return bool(np.all(a.swt[P] <= a.swt) and np.all(tr[P] <= tr))


def _sub(a: TableArrays, keep: np.ndarray) -> TableArrays:
    return TableArrays(t=a.t[keep], w=a.w[keep], pk=a.pk[keep], swt=a.swt[np.ix_(keep, keep)],
                       swb=a.swb[np.ix_(keep, keep)], L=a.L, base_b=a.base_b, base_t=a.base_t)


def prune_exact(a: TableArrays) -> np.ndarray:
    """Indices of the choices kept after dropping choices that others dominate (exactly).

    A set of choices may be dropped when a map phi sends each of them to a kept choice and
    replacing every choice i by phi(i) at once never makes a plan slower or larger: phi(i) is
    no slower, stores no more and peaks no higher than i, and for every pair (i, j)
    swt[phi i, phi j] <= swt[i, j] and transient[phi i, phi j] <= transient[i, j] (this covers
    the first layer, every switch and every layer's transient). Two kinds of maps are tried
    until nothing changes: one choice to another (best first by time, stored, peak), and a
    whole boundary-layout class (choices with identical switch rows and columns) to the
    choices of other classes that dominate them one by one (e.g. every `dp` remat variant to
    the matching `metp` one when `metp` is as fast, as lean and has the smaller transient).
    """
    keep = np.arange(a.K)
    while keep.size > 1:
        b = _sub(a, keep)
        tr = b.transient
        K = b.K
        removed = None
        # (1) single choices: one pass best first; a choice goes when a kept one dominates it
        # (dropping several at once is safe: e.g. k -> a with both dropped becomes b_k -> b_a and
        # swt[b_k, b_a] <= swt[k, b_a] <= swt[k, a] by the two single relations)
        D = _dominance(b.t, b.w, b.pk, b.swt, tr)
        kept = []
        for i in np.lexsort((b.pk, b.w, b.t)):
            if not any(D[j, i] for j in kept):
                kept.append(int(i))
        if len(kept) < K:
            removed = sorted(set(range(K)) - set(kept))
        # (2) whole layout classes
        if removed is None:
            sig = [b.swt[i].tobytes() + b.swt[:, i].tobytes() + b.swb[i].tobytes() + b.swb[:, i].tobytes()
                   for i in range(K)]
            classes = {}
            for i, sgn in enumerate(sig):
                classes.setdefault(sgn, []).append(i)
            groups = list(classes.values())
            if len(groups) > 1:
                node = ((b.t[:, None] <= b.t[None, :]) & (b.w[:, None] <= b.w[None, :])
                        & (b.pk[:, None] <= b.pk[None, :]))
                for g in groups:
                    others = np.array([i for i in range(K) if i not in g])
                    phi = np.arange(K)
                    ok = True
                    for i in g:
                        dom = others[node[others, i]]
                        if dom.size == 0:
                            ok = False
                            break
                        phi[i] = dom[np.lexsort((b.pk[dom], b.w[dom], b.t[dom]))[0]]
                    if ok and _mapping_ok(b, phi, tr):
                        removed = list(g)
                        break
        if not removed:
            break
        keep = np.delete(keep, removed)
    return keep


# ------------------------------------------------------------------------------------------
# DP over layers and memory units
# ------------------------------------------------------------------------------------------
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


def _grid(e: np.ndarray, span: float, bins: int, max_exact_bins: int, L: int = 1):
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


def _solve_caps(a: TableArrays, S_avail: float, unit: float, exact: bool, stats: dict,
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
        return a.w[idx].sum() - L * wmin <= Eb_c + 1e-6 and _transient(a, idx) <= C

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
                inc_v, inc_plan = _plan_time(a, plan), plan
        cand = [c for c in dp.candidates(b, scan) if c[0] < inc_v * (1 - 1e-12)]
        if cand:
            plans = allowed[dp.state_plans([c[1] for c in cand], [c[2] for c in cand])]  # [n, L]
            st = a.w[plans].sum(1) - L * wmin
            trs = np.maximum(a.pk[plans].max(1), tr[plans[:, :-1], plans[:, 1:]].max(1) if L > 1 else 0.0)
            ok = np.flatnonzero((st <= Eb_c + 1e-6) & (trs <= C))
            if ok.size:
                plan = [int(x) for x in plans[ok[0]]]
                inc_v, inc_plan = _plan_time(a, plan), plan
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


def _transient(a: TableArrays, idx: np.ndarray) -> float:
    tr = float(a.pk[idx[0]])
    if idx.size > 1:
        tr = max(tr, float((a.pk[idx[1:]] + a.swb[idx[:-1], idx[1:]]).max()))
    return tr


def _plan_time(a: TableArrays, plan) -> float:
    return evaluate(a, plan)[0] - a.base_t


def min_bytes_plan(a: TableArrays) -> list:
    """A plan with the fewest bytes (exact: over transient caps, min stored path under the cap)."""
    L, tr = a.L, a.transient
    best, best_plan = _INF, None
    for C in np.unique(np.concatenate([a.pk, tr.ravel()])):
        allowed = a.pk <= C
        if not allowed.any():
            continue
        cost = np.where(allowed, a.w, _INF)
        A = np.where(tr <= C, 0.0, _INF)
        cur, back = cost.copy(), []
        for _ in range(1, L):
            M = cur[:, None] + A
            arg = M.argmin(0)
            back.append(arg)
            cur = M[arg, np.arange(a.K)] + cost
        if cur.min() + C < best:
            j = int(cur.argmin())
            plan = [j]
            for arg in reversed(back):
                j = int(arg[j])
                plan.append(j)
            best, best_plan = cur.min() + C, plan[::-1]
    return best_plan if best_plan is not None else [leanest_uniform(a)] * L


# ------------------------------------------------------------------------------------------
# label search over layers (the fast exact path: no memory grid)
# ------------------------------------------------------------------------------------------
@dataclass
class _LabelResult:
    status: str  # "optimal" | "infeasible" (proven: nothing fits) | "aborted" (label limit)
    plan: Optional[list]  # best plan found (None: none)
    time: float  # its time without base_t (inf: none)
    info: dict


def _tie_scales(a: TableArrays) -> tuple[float, float]:
    """(eps, tol): eps = time charged per switch to break ties towards fewer runs, tol = slack
    on time comparisons (float noise); tol < eps << any real time difference."""
    tscale = max(float(a.L * np.abs(a.t).max() + np.abs(a.swt).max()), 1e-300)
    return 1e-11 * tscale, 1e-12 * tscale


def _two_run_incumbent(a: TableArrays, E: float, eps: float, tol_b: float):
    """The best plan of at most two runs, (time without base_t, plan, switches) or None.

    Every single choice and every ordered pair (i, j) with every split i^n j^(L-n), by the
    objective time + eps x switches (so a uniform plan wins ties). E: the stored excess
    (over L x min stored) plus the transient allowed. Vectorised over [K, K, L-1].
    """
    L, K = a.L, a.K
    e = a.w - a.w.min()
    tr = a.transient
    ds, trs = np.diag(a.swt), np.diag(tr)
    T1 = L * a.t + (L - 1) * ds
    X1 = np.maximum(a.pk, trs) if L > 1 else a.pk
    v1 = np.where(L * e + X1 <= E + tol_b, T1, _INF)
    k = int(np.argmin(v1))
    best = (float(v1[k]), [k] * L, 0) if np.isfinite(v1[k]) else None
    if L >= 2 and K >= 2:
        n = np.arange(1, L, dtype=float)  # layers of the first run
        Ti = n * a.t[:, None] + (n - 1) * ds[:, None]  # [K, L-1]: first run of i, n layers
        Tj = (L - n) * a.t[:, None] + (L - n - 1) * ds[:, None]  # second run of j, L-n layers
        T = Ti[:, None, :] + Tj[None, :, :] + a.swt[:, :, None]
        Xi = np.maximum(a.pk[:, None], np.where(n >= 2, trs[:, None], -_INF))
        Xj = np.where(L - n >= 2, trs[:, None], -_INF)
        X = np.maximum(np.maximum(Xi[:, None, :], tr[:, :, None]), Xj[None, :, :])
        M = (n * e[:, None])[:, None, :] + ((L - n) * e[:, None])[None, :, :]
        ok = M + X <= E + tol_b
        ok[np.arange(K), np.arange(K)] = False
        v = np.where(ok, T, _INF)
        f = int(np.argmin(v))
        if np.isfinite(v.flat[f]) and (best is None or v.flat[f] + eps < best[0]):
            i, j, m = np.unravel_index(f, v.shape)
            nn = int(m) + 1
            best = (float(v.flat[f]), [int(i)] * nn + [int(j)] * (L - nn), 1)
    return best


def _node_lp(a: TableArrays, caps: np.ndarray, E: float):
    """Per cap C: the LP bound min sum n_k t_k, sum n_k = L, sum n_k e_k <= E - C (switches and
    order ignored: valid when switch times are >= 0) over the choices usable under C, and its
    memory multiplier lam >= 0. Returns (bound [nc], lam [nc])."""
    L = a.L
    e = a.w - a.w.min()
    t = a.t
    tr = a.transient
    usable = (a.pk[None, :] <= caps[:, None]) | (tr.min(0)[None, :] <= caps[:, None])  # [nc, K]
    eb = (E - caps) / L  # average excess allowed per layer
    single = np.where(usable & (e[None, :] <= eb[:, None]), t[None, :], _INF).min(1)  # [nc]
    de = e[None, :] - e[:, None]  # [i, j]: e_j - e_i
    with np.errstate(divide="ignore", invalid="ignore"):
        th = (eb[:, None, None] - e[None, :, None]) / de[None]  # [nc, i, j]
        pair_ok = (de[None] > 0) & (th >= 0) & (th <= 1) & usable[:, :, None] & usable[:, None, :]
        val = np.where(pair_ok, t[None, :, None] + th * (t[None, None, :] - t[None, :, None]), _INF)
    flat = val.reshape(len(caps), -1)
    pi = flat.argmin(1)
    pv = flat[np.arange(len(caps)), pi]
    ii, jj = np.unravel_index(pi, (a.K, a.K))
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(np.isfinite(pv), (t[ii] - t[jj]) / (e[jj] - e[ii]), 0.0)
    lam = np.where(pv < single, np.maximum(slope, 0.0), 0.0)
    lam = np.where(np.isfinite(lam), lam, 0.0)
    return L * np.minimum(single, pv), lam


def _rev_cummin(x: np.ndarray, axis: int) -> np.ndarray:
    """y[..., c, ...] = min over c' >= c of x[..., c', ...]."""
    return np.flip(np.minimum.accumulate(np.flip(x, axis), axis=axis), axis)


def _label_search(a: TableArrays, S_avail: float, *, max_labels: int = 20000) -> _LabelResult:
    """The optimum of one table by a label search over layers (exact; see `exact_plan`).

    Labels are partial plans (first l layers): last choice, the cap index of their transient so
    far, time (+ eps per switch), stored excess in exact integer units. Per layer every label
    is extended by every allowed choice; a child is dropped when no completion can fit
    (memory bound) or beat the incumbent (per-cap Lagrangian bound: min over the caps >= its
    transient of time + lam_c x (stored + cap - budget) of a best completion under that cap,
    computed backwards once); among the children with the same (choice, cap) only the Pareto
    front of (time, stored) is kept. Completed with fewer than `max_labels` labels per layer
    the result is optimal (for time + eps x switches, i.e. the fastest plan, ties to fewer runs).
    """
    L, K = a.L, a.K
    wmin = float(a.w.min())
    e = a.w - wmin
    E = S_avail - L * wmin  # budget for stored excess + transient
    tr = a.transient
    eps, tol_t = _tie_scales(a)
    emax = float(e.max())
    # exact integer stored units: 2^-s bytes with L x max excess < 2^50 (resolution far below a byte)
    scale = 2.0 ** np.floor(np.log2(2.0**50 / (L * emax))) if emax > 0 else 1.0
    ei = np.rint(e * scale).astype(np.int64)
    inv = 1.0 / scale
    tol_b = 1e-4 + L * 0.5 * inv + 1e-15 * abs(E) * L
    info = {"solver": "labels", "eps_s": eps}
    inc = _two_run_incumbent(a, E, eps, tol_b)
    UB = inc[0] if inc is not None else _INF
    thr = UB - tol_t  # a completion must be able to reach time <= thr to matter (see docstring)
    caps = np.unique(np.concatenate([a.pk, tr.ravel()]))
    caps = caps[caps <= E + tol_b]
    info.update(caps=int(caps.size), incumbent_runs=(inc[2] + 1) if inc else 0)
    if caps.size == 0:
        return _LabelResult("infeasible", None, _INF, info)
    if np.all(a.swt >= 0):
        lp, lam = _node_lp(a, caps, E)
        alive = (lp <= thr) & np.isfinite(lp)
    else:  # negative switch times: the node LP is no bound
        lam = np.zeros(caps.size)
        alive = np.ones(caps.size, bool)
    caps, lam = caps[alive], lam[alive]
    info["caps_lp"] = int(caps.size)

    def finish(status):
        if inc is None:
            return _LabelResult("infeasible" if status == "optimal" else status, None, _INF, info)
        return _LabelResult(status, inc[1], inc[0], info)

    if caps.size == 0:
        return finish("optimal")
    nc = caps.size
    arK = np.arange(K)
    allowed = tr[None, :, :] <= caps[:, None, None]  # [nc, K, K]
    step = a.t[None, :] + a.swt  # [K, K]: run j after i
    A = np.empty((2, nc, K, K))
    A[0] = np.where(allowed, step[None] + lam[:, None, None] * e[None, None, :], _INF)
    A[1] = np.where(allowed, e[None, None, :], _INF)
    # backwards, per cap: H[r, 0] best time + lam x stored of r more layers after a layer running
    # k, H[r, 1] fewest stored bytes of them; HS[r]: as H[r, 0] but switching at least once
    Aoff = A[0].copy()
    Aoff[:, arK, arK] = _INF
    Adiag = A[0][:, arK, arK]  # [nc, K]
    H = np.empty((L, 2, nc, K))
    HS = np.empty((L, nc, K))
    H[0] = 0.0
    HS[0] = _INF
    for r in range(1, L):
        np.min(A + H[r - 1][:, :, None, :], axis=-1, out=H[r])
        np.minimum(np.min(Aoff + H[r - 1, 0][:, None, :], axis=-1), Adiag + HS[r - 1], out=HS[r])
    # root bounds per cap: kill caps whose every plan is provably no better / does not fit
    start = a.pk[None, :] <= caps[:, None]  # [nc, K]
    lb = np.where(start, a.t[None, :] + lam[:, None] * e[None, :] + H[L - 1, 0], _INF).min(1) + lam * (caps - E)
    mb = np.where(start, e[None, :] + H[L - 1, 1], _INF).min(1) + caps
    alive = (lb <= thr) & (mb <= E + tol_b)
    info["caps_alive"] = int(alive.sum())
    if not alive.any():
        return finish("optimal")
    # bound tables indexed [r, cap index (nc = none), choice]: min over the alive caps >= it
    FS = np.full((L, nc + 1, K), _INF)
    FS[:, :nc] = _rev_cummin(np.where(alive[None, :, None], caps[None, :, None] + H[:, 1], _INF), 1)
    lams = np.unique(lam[alive])
    GS = np.full((len(lams), L, nc + 1, K), _INF)  # switching completions, per distinct lam
    for q, v in enumerate(lams):
        m = alive & (lam == v)
        GS[q, :, :nc] = _rev_cummin(np.where(m[None, :, None], HS + (v * (caps - E))[None, :, None], _INF), 1)
    TRI = np.searchsorted(caps, tr, side="left")  # [K, K] cap index of each transition (nc: none)
    XI0 = np.searchsorted(caps, a.pk, side="left")
    capx = np.append(np.where(alive, caps, _INF), _INF)  # cap bytes per index (dead / none: inf)
    capx = _rev_cummin(capx, 0)
    self_t = a.t + np.diag(a.swt)
    self_xi = np.diag(TRI)
    Etol = E + tol_b

    def keep_mask(nT, nM, nxi, j, r):
        """Children with a completion that may fit and beat thr (pure time): either staying on
        j to the end (checked exactly) or switching at least once more (Lagrangian bound)."""
        nMf = nM * inv
        sxi = np.maximum(nxi, self_xi[j]) if r else nxi
        ok = (nMf + r * e[j] + capx[sxi] <= Etol) & (nT + r * self_t[j] <= thr)
        if r:
            sw_ok = nMf + FS[r][nxi, j] <= Etol
            bnd = GS[0, r][nxi, j] + lams[0] * nMf
            for q in range(1, len(lams)):
                bnd = np.minimum(bnd, GS[q, r][nxi, j] + lams[q] * nMf)
            ok |= sw_ok & (nT + bnd <= thr)
        return ok

    # layer 0
    node, xi, T, M = arK.copy(), np.minimum(XI0, nc), a.t.copy(), ei.copy()
    sw = np.zeros(K, np.int64)
    ok = keep_mask(T, M, xi, node, L - 1)
    node, xi, T, M, sw = node[ok], xi[ok], T[ok], M[ok], sw[ok]
    parents, nodes = [np.full(node.size, -1)], [node]
    peak = node.size
    for l in range(1, L):
        if node.size == 0:
            break
        r = L - 1 - l
        nxi = np.maximum(xi[:, None], TRI[node])  # [N, K]
        nT = T[:, None] + step[node]
        nM = M[:, None] + ei[None, :]
        ok = keep_mask(nT, nM, nxi, arK[None, :], r)
        idx = np.flatnonzero(ok)
        if idx.size == 0:
            node = idx
            break
        p, j = np.divmod(idx, K)
        T, M, xi = nT.ravel()[idx], nM.ravel()[idx], nxi.ravel()[idx]
        sw = sw[p] + (node[p] != j)
        # Pareto front of (time + eps x switches, stored) per (choice, cap): sort by group then
        # time, keep a label when its stored is below every earlier one's of its group (exact units)
        g = j * nc + xi
        order = np.lexsort((T + eps * sw, g))
        g, T, M, xi, p, j, sw = g[order], T[order], M[order], xi[order], p[order], j[order], sw[order]
        m0 = M.min()
        span = int(M.max() - m0) + 1
        if span * (int(g[-1]) + 1) < 2**62:
            adj = (M - m0) - g.astype(np.int64) * span
        else:  # dense ranks instead of raw units
            adj = np.unique(M, return_inverse=True)[1].ravel().astype(np.int64) - g.astype(np.int64) * idx.size
        cm = np.minimum.accumulate(adj)
        keep = np.empty(adj.size, bool)
        keep[0] = True
        np.less(adj[1:], cm[:-1], out=keep[1:])
        T, M, xi, p, node, sw = T[keep], M[keep], xi[keep], p[keep], j[keep], sw[keep]
        parents.append(p)
        nodes.append(node)
        peak = max(peak, node.size)
        if node.size > max_labels:
            info["labels_peak"] = int(peak)
            return finish("aborted")
    info["labels_peak"] = int(peak)
    if node.size and len(nodes) == L:
        # completed labels: time + eps x switches; the incumbent counts eps x its switches
        Tq = T + eps * sw
        b = int(np.argmin(Tq))
        if inc is None or Tq[b] < inc[0] + eps * inc[2]:
            plan = [0] * L
            for l in range(L - 1, -1, -1):
                plan[l] = int(nodes[l][b])
                b = int(parents[l][b])
            return _LabelResult("optimal", plan, _plan_time(a, plan), info)
    return finish("optimal")


def exact_plan(table, budget_bytes: float, *, solver: str = "auto", max_labels: int = 20000, bins: int = 1024,
               max_bins: int = 4096, exact_bins: int = 4096, rel_tol: float = 1e-3, scan: int = 16,
               prune: bool = True, fallback: Optional[str] = None, milp_time_limit: float = 120.0) -> SearchResult:
    """The fastest per-layer plan within `budget_bytes` (see module doc).

    solver: "auto" = the label search (exact, method `exact`), falling back to the DP over
    layers and memory (method `dp`) only when a layer holds more than `max_labels` labels;
    "dp" = the DP only (seeded with the ParaDySe plan, as before the label search existed);
    "labels" = the label search only (aborted: its incumbent, optimal=False).
    bins: grid units over the stored-byte span; while the plan is not proven within rel_tol
    of the optimum the grid is refined x4 up to max_bins. exact_bins: an exact integer grid
    (all stored-byte differences multiples of one unit) is used whenever it needs at most this
    many units. scan: final states checked per DP for a truly fitting plan. fallback="milp":
    settle a remaining gap with `milp_plan` (exact, much slower). The returned plan always
    fits when anything fits (fits=False: nothing fits, the fewest-bytes plan is returned).
    optimal: proven optimal; info: kept choices, unit_bytes, grid_exact, bins, DPs run, caps
    pruned / settled without a DP, lower_bound_s (a proven lower bound on the optimum), gap.
    """
    t0 = _time.perf_counter()
    full = arrays(table)
    keep = prune_exact(full) if prune else np.arange(full.K)
    a = _sub(full, keep)
    S_avail = float(budget_bytes) - a.base_b
    wmin = float(a.w.min())
    e = a.w - wmin
    span = S_avail - float(a.pk.min()) - a.L * wmin
    info = {"kept": int(len(keep)), "choices": int(full.K), "dps": 0, "pruned": 0, "quick": 0}

    def done(plan, method="dp", optimal=True, **extra):
        if plan is None:
            plan, extra = min_bytes_plan(full), {**extra, "reason": "nothing fits"}
        else:
            plan = [int(keep[i]) for i in plan]
        return make_result(table, full, plan, budget_bytes, method, optimal=optimal,
                           search_s=_time.perf_counter() - t0, info={**info, **extra})

    if solver not in ("auto", "dp", "labels"):
        raise ValueError(f"solver must be 'auto', 'dp' or 'labels', got {solver!r}")
    if span < 0:
        return done(None)
    seed = None
    if solver != "dp":
        lab = _label_search(a, S_avail, max_labels=max_labels)
        info.update(lab.info)
        if lab.status == "infeasible":
            return done(None)
        if lab.status == "optimal" or solver == "labels":
            opt = lab.status == "optimal"
            lb = lab.time + a.base_t if opt else -_INF
            return done(lab.plan, method="exact", optimal=opt, lower_bound_s=lb, gap=0.0 if opt else _INF)
        if lab.plan is not None:
            seed = (lab.time, list(lab.plan))
    if e.max() > 0:
        span = min(span, a.L * float(e.max()))
    if seed is None:
        # incumbent: the best uniform or ParaDySe two-segment plan that fits (prunes caps early)
        from costmodel.search.paradyse import paradyse_plan
        h = paradyse_plan(_SubTable(a), budget_bytes)
        if h.fits:
            seed = (h.time_s - a.base_t, list(h.per_layer))
    nb, lower = bins, -_INF
    while True:
        unit, exact = _grid(e, span, nb, exact_bins, a.L)
        info.update(unit_bytes=unit, grid_exact=exact, bins=nb)
        lo, plan, v = _solve_caps(a, S_avail, unit, exact, info, seed, scan)
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
    if fallback == "milp":
        from costmodel.search.milp import milp_plan  # (it imports this module)
        res = milp_plan(table, budget_bytes, time_limit=milp_time_limit)
        return make_result(table, full, res.per_layer, budget_bytes, "milp", optimal=res.optimal,
                           search_s=_time.perf_counter() - t0,
                           info={**info, **res.info, "fallback": "milp", "lower_bound_s": lower + a.base_t})
    return done(seed[1] if seed else None, optimal=False, lower_bound_s=lower + a.base_t, gap=gap)


class _SubTable:
    """TableArrays seen as a cost table (for running the heuristic on the pruned choices)."""

    def __init__(self, a: TableArrays):
        self.choices = tuple(range(a.K))
        self.n_layers = a.L
        self.layer_time_s, self.layer_stored_bytes, self.layer_peak_bytes = a.t, a.w, a.pk
        self.switch_time_s, self.switch_bytes = a.swt, a.swb
        self.base_bytes, self.base_time_s = a.base_b, a.base_t
