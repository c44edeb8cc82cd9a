"""Exact dominance pruning of a cost table's choices (keeps the optimum, drops the rest).

Exact pruning first: a choice (or a whole boundary-layout class) is dropped when
replacing it everywhere by another kept choice never increases time, stored bytes, any
transient or any switch (see `prune_exact`); this keeps the optimum and usually leaves
a handful of choices (e.g. 21 -> 3 on a structured 96-layer table).
"""
from __future__ import annotations

import numpy as np

from costmodel.search.arrays import TableArrays, subset

__all__ = ["prune_exact"]


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
        b = subset(a, keep)
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
