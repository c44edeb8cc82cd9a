"""The attention kernel every strategy runs on its local block: flash attention in XLA.

Layout. Strategies hold q [B, Sq, H, D] and k, v [B, Skv, G, D] (G dividing H: query head h
reads K/V head h // (H / G)). The kernel works on tiles, heads major, in the layout XLA's dot
produces: queries [nq, B, G, R, bq, D] (R = H / G; scaled by the softmax scale once), keys and
values [nk, B, G, bk, D], per-row statistics [nq, B, G, R, bq]. Scores of a tile are
[B, G, R, bq, bk] in the forward and [B, G, bk, R, bq] in the backward (so that two of the
backward's three products read them in place; the third reads one transposed copy).

Masks come from integer ids ([B, S] each; `materialize_ids`): attention only between equal
nonzero segment ids (0 = padding) and, when causal, to keys with kv_index <= q_index. Any ids
are allowed (a ring's visiting block, zigzag chunks, a block wholly in the future).

Schedule. Only the tile pairs that may hold an allowed (query, key) pair are visited: from
each tile's range of live segment ids and indices, a pair is kept where the ranges meet and,
causal, the key tile's first index is not after the query tile's last. For causal rows of
packed documents that is the lower triangle of each document's tiles; a ring block wholly in
the future is no pair at all. The kept pairs are visited in one `fori_loop` whose trip count is
their number (no grid of conds). A grid of one tile is computed straight, without a loop.

Statistics. The forward returns the output and its log-sum-exp; the backward recomputes each
tile's probabilities from that log-sum-exp (flash attention 2), so nothing score-sized is kept
between them. Fully masked query rows (padding) give out 0, lse -inf and no gradient, with
no NaN anywhere.

Tiles are cache-sized: a requested tile (the model's `attention_block`) is cut to `MAX_TILE`
a side, then halved while a tile's scores, B·H·bq·bk float32, exceed `TILE_ELEMENTS` (1 MiB),
down to `MIN_TILE`. Measured on one CPU thread (benchmarks/attention_tiles.py,
docs/attention.md): one 512 x 512 tile per row and head (what the B·H bound alone gives
ulysses' or METP's one head per device) ran 1.55x slower than 128 x 128 at 1 x 4,096. On two
threads no other bound was best at every shape; these were within 1.25x of the best at each.

`flash_forward` / `flash_backward` take and give the strategies' layout; the differentiable
entry over this or the Pallas kernel is `sharding.ops.kernels.flash_attention`.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax

from sharding.ops.varying import vary, varying_axes

_F32 = jnp.float32
_BIG = jnp.iinfo(jnp.int32).max
TILE_ELEMENTS = 1 << 18  # scores of one tile over batch and heads: 1 MiB of float32
MIN_TILE = 64
MAX_TILE = 128


def default_scale(head_dim: int) -> float:
    """Softmax scale 1/sqrt(D)."""
    return 1.0 / math.sqrt(head_dim)


def check_heads(q, k, v) -> None:
    """Raise ValueError unless k and v are [B, Skv, G, D] with G dividing q's H heads."""
    B, _, H, D = q.shape
    if k.ndim != 4 or k.shape[0] != B or k.shape[3] != D or H % k.shape[2] or v.shape != k.shape:
        raise ValueError(f"shape mismatch: q {q.shape}, k {k.shape}, v {v.shape} "
                         "(k and v [B, Skv, G, D] with G dividing q's heads)")


def materialize_ids(B, Sq, Skv, q_segment_ids=None, kv_segment_ids=None, q_index=None, kv_index=None):
    """int32 (q_seg [B,Sq], kv_seg [B,Skv], q_idx [B,Sq], kv_idx [B,Skv]); None -> ones / arange."""
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("pass both q_segment_ids and kv_segment_ids, or neither")
    i32 = jnp.int32

    def ids(x, n, default):
        return jnp.broadcast_to(default if x is None else jnp.asarray(x).astype(i32), (B, n))

    return (ids(q_segment_ids, Sq, jnp.ones((), i32)), ids(kv_segment_ids, Skv, jnp.ones((), i32)),
            ids(q_index, Sq, jnp.arange(Sq, dtype=i32)), ids(kv_index, Skv, jnp.arange(Skv, dtype=i32)))


def tile_sizes(bq: int, bk: int, sq: int, skv: int, batch_heads: int) -> tuple[int, int]:
    """The (query, key) tile the kernel uses for requested tiles bq x bk over sq x skv: each at
    most its length and MAX_TILE, then the larger (both when equal) halved while batch_heads x
    bq x bk > TILE_ELEMENTS, never below MIN_TILE."""
    bq, bk = (max(1, min(int(b), n, MAX_TILE)) for b, n in ((bq, sq), (bk, skv)))
    while batch_heads * bq * bk > TILE_ELEMENTS and max(bq, bk) > MIN_TILE:
        half = lambda b: max(MIN_TILE, -(-b // 2))  # noqa: E731
        bq, bk = (half(bq) if bq >= bk else bq), (half(bk) if bk >= bq else bk)
    return bq, bk


# --------------------------------------------------------------------------------------------
# Tiled layout
# --------------------------------------------------------------------------------------------
def _pad(x, total: int, value=0):
    pad = total - x.shape[1]
    if pad == 0:
        return x
    return jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2), constant_values=value)


def _n(s: int, b: int) -> int:
    return -(-s // b)


def query_tiles(x, groups: int, b: int):
    """[B, S, H, ...] -> [n, B, G, H/G, b, ...] (S padded to n*b)."""
    B, S, H = x.shape[:3]
    n = _n(S, b)
    x = _pad(x, n * b).reshape(B, n, b, groups, H // groups, *x.shape[3:])
    return jnp.moveaxis(x, (1, 2), (0, 4))


def from_query_tiles(x, length: int):
    """[n, B, G, R, b, ...] -> [B, length, G*R, ...]."""
    n, B, G, R, b = x.shape[:5]
    x = jnp.moveaxis(x, (0, 4), (1, 2)).reshape(B, n * b, G * R, *x.shape[5:])
    return x[:, :length]


def key_tiles(x, b: int):
    """[B, S, G, D] -> [n, B, G, b, D]."""
    B, S, G, D = x.shape
    n = _n(S, b)
    return jnp.moveaxis(_pad(x, n * b).reshape(B, n, b, G, D), (1, 2), (0, 3))


def from_key_tiles(x, length: int):
    """[n, B, G, b, D] -> [B, length, G, D]."""
    n, B, G, b, D = x.shape
    return jnp.moveaxis(x, (0, 3), (1, 2)).reshape(B, n * b, G, D)[:, :length]


def id_tiles(x, b: int):
    """[B, S] -> [n, B, b] (padding: segment id 0, i.e. masked)."""
    B, S = x.shape
    n = _n(S, b)
    return jnp.moveaxis(_pad(x, n * b).reshape(B, n, b), 1, 0)


class Ids(NamedTuple):
    """Tiled ids: query segments / indices [nq, B, bq], key segments / indices [nk, B, bk]."""

    q_seg: jax.Array
    k_seg: jax.Array
    q_idx: jax.Array
    k_idx: jax.Array

    @classmethod
    def of(cls, ids, bq: int, bk: int) -> "Ids":
        qseg, kseg, qidx, kidx = ids
        return cls(id_tiles(qseg, bq), id_tiles(kseg, bk), id_tiles(qidx, bq), id_tiles(kidx, bk))


# --------------------------------------------------------------------------------------------
# Which tile pairs to visit
# --------------------------------------------------------------------------------------------
def _ranges(seg, idx):
    """Per tile and row ([n, B]): any live token, min / max live segment id, min / max live index."""
    live = seg != 0
    lo = lambda x: jnp.min(jnp.where(live, x, _BIG), -1)  # noqa: E731
    hi = lambda x: jnp.max(jnp.where(live, x, -_BIG), -1)  # noqa: E731
    return jnp.any(live, -1), lo(seg), hi(seg), lo(idx), hi(idx)


def tile_pairs(ids: Ids, causal: bool):
    """([nq, nk] booleans: tile pairs that may hold an allowed (query, key) pair in some row,
    [nq, nk] booleans: pairs where every pair is allowed in every row (no mask needed))."""
    q_any, q_slo, q_shi, q_ilo, q_ihi = (x[:, None] for x in _ranges(ids.q_seg, ids.q_idx))
    k_any, k_slo, k_shi, k_ilo, k_ihi = (x[None] for x in _ranges(ids.k_seg, ids.k_idx))
    may = q_any & k_any & (q_slo <= k_shi) & (k_slo <= q_shi)
    whole = lambda seg: jnp.all(seg != 0, axis=-1)  # noqa: E731
    full = whole(ids.q_seg)[:, None] & whole(ids.k_seg)[None] & (q_slo == q_shi) & (k_slo == k_shi) & (q_slo == k_slo)
    if causal:
        may, full = may & (k_ilo <= q_ihi), full & (k_ihi <= q_ilo)
    return jnp.any(may, axis=-1), jnp.all(full, axis=-1)


def schedule(ids: Ids, causal: bool):
    """(query tile, key tile, whether unmasked, count): the active pairs first, in row-major
    order, and their number."""
    active, full = tile_pairs(ids, causal)
    nk = active.shape[1]
    flat = active.reshape(-1)
    order = jnp.nonzero(flat, size=flat.shape[0], fill_value=0)[0].astype(jnp.int32)
    return order // nk, order % nk, full.reshape(-1)[order], jnp.sum(flat, dtype=jnp.int32)


# --------------------------------------------------------------------------------------------
# One tile
# --------------------------------------------------------------------------------------------
def _mask(qs, ks, qi, ki, causal: bool, transposed: bool):
    """Allowed pairs of a tile: [B, 1, 1, bq, bk], or [B, 1, bk, 1, bq] transposed."""
    if transposed:
        m = (ks[:, :, None] == qs[:, None, :]) & (qs[:, None, :] != 0)
        if causal:
            m = m & (ki[:, :, None] <= qi[:, None, :])
        return m[:, None, :, None]
    m = (qs[:, :, None] == ks[:, None, :]) & (qs[:, :, None] != 0)
    if causal:
        m = m & (ki[:, None, :] <= qi[:, :, None])
    return m[:, None, None]


def _with_ones(v):
    """v [..., D] with a column of ones: p @ [v, 1] gives p @ v and the row sums of p at once."""
    return jnp.concatenate([v, jnp.ones((*v.shape[:-1], 1), v.dtype)], axis=-1)


def _forward_tile(state, q, k, v1, mask):
    """Fold one key tile into (running max, denominator, unnormalised output) of a query tile.

    The running max starts at the float32 minimum (never -inf), so exp never sees -inf - -inf."""
    m, l, o = state
    s = jnp.einsum("bgrqd,bgkd->bgrqk", q, k, preferred_element_type=_F32)
    if mask is not None:
        s = jnp.where(mask, s, -jnp.inf)
    m_new = jnp.maximum(m, jnp.max(s, axis=-1))
    p = jnp.exp(s - m_new[..., None])
    corr = jnp.exp(m - m_new)
    pv = jnp.einsum("bgrqk,bgkd->bgrqd", p.astype(v1.dtype), v1, preferred_element_type=_F32)
    return m_new, l * corr + pv[..., -1], o * corr[..., None] + pv[..., :-1]


def _backward_tile(q, k, v, lse, do, delta, mask_t):
    """(dq, dk, dv) float32 of one tile; scores transposed [B, G, bk, R, bq]; lse is +inf on
    rows that saw nothing (their probabilities are 0)."""
    s = jnp.einsum("bgkd,bgrqd->bgkrq", k, q, preferred_element_type=_F32)
    s = s - lse[:, :, None]
    p = jnp.exp(s if mask_t is None else jnp.where(mask_t, s, -jnp.inf))
    dv = jnp.einsum("bgkrq,bgrqd->bgkd", p.astype(do.dtype), do, preferred_element_type=_F32)
    dp = jnp.einsum("bgkd,bgrqd->bgkrq", v, do, preferred_element_type=_F32)
    ds = p * (dp - delta[:, :, None])
    dk = jnp.einsum("bgkrq,bgrqd->bgkd", ds.astype(q.dtype), q, preferred_element_type=_F32)
    dq = jnp.einsum("bgkd,bgkrq->bgrdq", k, ds.astype(k.dtype), preferred_element_type=_F32)
    return jnp.swapaxes(dq, -1, -2), dk, dv


def merge(out, lse, out_b, lse_b):
    """Two normalised partial attentions over disjoint keys (out [..., D] float32, lse [...])
    as one, by log-sum-exp; rows empty on both sides stay (0, -inf). Differentiable, with no
    NaN in value or gradient (jnp.logaddexp's gradient is NaN at (-inf, -inf))."""
    m = jnp.maximum(lse, lse_b)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    w, w_b = jnp.exp(lse - m), jnp.exp(lse_b - m)
    total = w + w_b
    seen = total > 0
    total = jnp.where(seen, total, 1.0)
    out = (w[..., None] * out + w_b[..., None] * out_b.astype(_F32)) / total[..., None]
    return out, jnp.where(seen, m + jnp.log(total), -jnp.inf)


def _one_tile(ids: Ids) -> bool:
    return ids.q_seg.shape[0] == 1 and ids.k_seg.shape[0] == 1


# --------------------------------------------------------------------------------------------
# All tiles
# --------------------------------------------------------------------------------------------
def forward_tiles(qt, kt, vt, ids: Ids, causal: bool):
    """(out [nq, B, G, R, bq, D] float32, lse [nq, B, G, R, bq]) of query tiles over key tiles
    (queries pre-scaled). Rows that saw no key: out 0, lse -inf."""
    axes = varying_axes(qt, kt, vt, ids)
    stat = qt.shape[:-1]
    state = vary((jnp.full(stat, jnp.finfo(_F32).min, _F32), jnp.zeros(stat, _F32), jnp.zeros(qt.shape, _F32)), axes)
    vt1 = _with_ones(vt)

    def tile(i, j, state, full=None):
        mask = _mask(ids.q_seg[i], ids.k_seg[j], ids.q_idx[i], ids.k_idx[j], causal, transposed=False)
        masked = lambda: vary(_forward_tile(state, qt[i], kt[j], vt1[j], mask), axes)  # noqa: E731
        if full is None:
            return masked()
        return lax.cond(full, lambda: vary(_forward_tile(state, qt[i], kt[j], vt1[j], None), axes), masked)

    if _one_tile(ids):
        first = jax.tree.map(lambda x: x[0], state)
        m, l, o = lax.cond(tile_pairs(ids, causal)[0][0, 0], lambda s: tile(0, 0, s), lambda s: s, first)
        m, l, o = m[None], l[None], o[None]
    else:
        qi, kj, full, count = schedule(ids, causal)

        def body(t, state):
            i, j = qi[t], kj[t]
            new = tile(i, j, jax.tree.map(lambda x: x[i], state), full[t])
            return jax.tree.map(lambda x, y: x.at[i].set(y), state, new)

        m, l, o = lax.fori_loop(0, count, body, state)
    seen = l > 0
    l_safe = jnp.where(seen, l, 1.0)
    return jnp.where(seen[..., None], o / l_safe[..., None], 0.0), jnp.where(seen, m + jnp.log(l_safe), -jnp.inf)


def backward_tiles(qt, kt, vt, ids: Ids, lse, dot, delta, causal: bool):
    """float32 (dq, dk, dv) in tiles, from the tiled log-sum-exp (`forward_tiles`), output
    cotangent and delta = rowsum(dout * out) - dlse; queries pre-scaled, so dq is too (multiply
    it by the scale) and dk is not."""
    axes = varying_axes(qt, kt, vt, ids, lse, dot, delta)
    lse = jnp.where(jnp.isfinite(lse), lse, jnp.inf)  # rows that saw nothing: probabilities 0
    zeros = vary(tuple(jnp.zeros(x.shape, _F32) for x in (qt, kt, vt)), axes)

    def tile(i, j, full=None):
        mask = _mask(ids.q_seg[i], ids.k_seg[j], ids.q_idx[i], ids.k_idx[j], causal, transposed=True)
        grads = lambda m: vary(_backward_tile(qt[i], kt[j], vt[j], lse[i], dot[i], delta[i], m), axes)  # noqa: E731
        return grads(mask) if full is None else lax.cond(full, lambda: grads(None), lambda: grads(mask))

    if _one_tile(ids):
        grads = lax.cond(tile_pairs(ids, causal)[0][0, 0], lambda: tile(0, 0),
                         lambda: tuple(z[0] for z in zeros))
        return tuple(g[None] for g in grads)
    qi, kj, full, count = schedule(ids, causal)

    def body(t, acc):
        i, j = qi[t], kj[t]
        dq, dk, dv = tile(i, j, full[t])
        return acc[0].at[i].add(dq), acc[1].at[j].add(dk), acc[2].at[j].add(dv)

    return lax.fori_loop(0, count, body, zeros)


# --------------------------------------------------------------------------------------------
# Public layout: [B, S, H, D]
# --------------------------------------------------------------------------------------------
class Tiling(NamedTuple):
    """How a call is tiled: its tile sizes and lengths (static)."""

    bq: int
    bk: int
    sq: int
    skv: int

    @classmethod
    def of(cls, q, k, bq: Optional[int], bk: Optional[int]) -> "Tiling":
        """Requested tiles (None: the whole length) made cache-sized (`tile_sizes`)."""
        B, sq, H = q.shape[:3]
        skv = k.shape[1]
        bq, bk = tile_sizes(sq if bq is None else bq, skv if bk is None else bk, sq, skv, B * H)
        return cls(bq, bk, sq, skv)


def flash_forward(q, k, v, ids, tiling: Tiling, *, causal: bool, scale: float):
    """(out [B, Sq, H, D] float32, lse [B, Sq, H] float32); not differentiable by itself."""
    G = k.shape[2]
    qt = query_tiles(q * jnp.asarray(scale, q.dtype), G, tiling.bq)
    out, lse = forward_tiles(qt, key_tiles(k, tiling.bk), key_tiles(v, tiling.bk),
                             Ids.of(ids, tiling.bq, tiling.bk), causal)
    return from_query_tiles(out, tiling.sq), from_query_tiles(lse, tiling.sq)


def flash_backward(q, k, v, ids, lse, dout, delta, tiling: Tiling, *, causal: bool, scale: float):
    """float32 (dq, dk, dv) from the log-sum-exp and delta = rowsum(dout * out) - dlse."""
    G = k.shape[2]
    bq, bk = tiling.bq, tiling.bk
    qt = query_tiles(q * jnp.asarray(scale, q.dtype), G, bq)
    dq, dk, dv = backward_tiles(qt, key_tiles(k, bk), key_tiles(v, bk), Ids.of(ids, bq, bk),
                                query_tiles(lse, G, bq), query_tiles(dout, G, bq), query_tiles(delta, G, bq), causal)
    return (from_query_tiles(dq, tiling.sq) * jnp.asarray(scale, _F32), from_key_tiles(dk, tiling.skv),
            from_key_tiles(dv, tiling.skv))
