"""The solver of `exact_plan`: a label search over layers (no memory grid).

Layers are identical, so a plan is a multiset of choices arranged in runs. The incumbent is
the best plan of at most two runs (every choice, every ordered pair and split, vectorised).
The max-over-layers transient is handled by its value: transient caps C range over the
distinct transients (pk[j] and pk[j] + swb[i, j]); under a cap only the choices and
transitions within it may run. Caps whose node LP (closed form: at most two choices mixed)
or Lagrangian bound cannot beat the incumbent are dropped; per remaining cap the best
completions of r layers (time + lam x stored, fewest stored, at least one more switch) are
computed backwards once. Labels (last choice, cap index of the transient so far, time,
switches, stored bytes in exact integer units of 2^-k bytes) are extended layer by layer;
a child survives only if staying on its choice to the end fits and beats the incumbent, or
a switching completion may (Lagrangian bound); per (choice, cap) only the Pareto front of
(time + eps x switches, stored) is kept. It is exact for time + eps x switches, eps =
1e-11 x the plan time scale: the fastest plan, ties going to fewer runs (plan ids like
`fsdp:96`, not `dp:62,fsdp:34`). Above `max_labels` labels a layer it stops and returns
its incumbent (status "aborted"). On the 13b cost tables (96 layers, 5-7 strategies) it takes 0.3-20 ms.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from costmodel.search.arrays import TableArrays, plan_time

__all__ = ["LabelResult", "label_search"]

_INF = np.inf


@dataclass
class LabelResult:
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


def label_search(a: TableArrays, S_avail: float, *, max_labels: int = 20000) -> LabelResult:
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
        return LabelResult("infeasible", None, _INF, info)
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
            return LabelResult("infeasible" if status == "optimal" else status, None, _INF, info)
        return LabelResult(status, inc[1], inc[0], info)

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
            return LabelResult("optimal", plan, plan_time(a, plan), info)
    return finish("optimal")
