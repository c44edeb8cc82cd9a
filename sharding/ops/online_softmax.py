"""Online-softmax building blocks for attention over K/V blocks (flash / ring attention).

Layout: q [B, Sq, H, D]; a K/V block k, v [B, Skv, G, D] with G dividing H (G < H is
grouped-query attention: query head h reads K/V head h // (H / G)). Scores are kept as [B, Sq, H, Skv]
and per-row statistics (running max, denominator, logsumexp, delta) as [B, Sq, H], i.e. the
leading axes of q, so a strategy that shards q over batch/sequence/heads shards them alike.

Masking comes from integer arrays, never from the block's position:
  * ``q_segment_ids`` [B, Sq], ``kv_segment_ids`` [B, Skv]: attention only between equal
    nonzero ids; 0 is padding (a padded query attends to nothing). Pass both or neither.
  * ``q_index`` [B, Sq], ``kv_index`` [B, Skv]: absolute token indices within the row; with
    ``causal=True`` a query attends to keys with ``kv_index <= q_index``. ``None`` means
    ``arange`` of the respective length.
So a ring strategy can feed any visiting block (indices not contiguous with q, or a block that
is entirely masked out) and get the right answer.

Forward over blocks::

    carry = init_carry(q)
    for k_blk, v_blk, (ids...) in blocks:
        carry = attend_block(carry, q, k_blk, v_blk, **ids)
    out, lse = finish(carry, dtype=q.dtype)

Backward over blocks (flash-attention style, recomputing the probabilities)::

    delta = compute_delta(out, dout)
    dq = 0
    for each block:
        dq_part, dk_blk, dv_blk = block_grads(q, k_blk, v_blk, lse, dout, delta, **ids)
        dq += dq_part        # dk_blk / dv_blk belong to (and travel with) the block

All statistics and partial gradients are float32 whatever the input dtype. Rows that see no
key at all carry m = -inf, l = 0 and finish with out = 0, lse = -inf; nothing here produces NaN
for them (forward or under autodiff of ``attend_block``).

``attend_block`` / ``block_grads`` take optional ``q_block_size`` / ``kv_block_size``: the
visiting block is then processed in (bq x bk) tiles by lax.scan (fully masked tiles skipped
with lax.cond), so scratch is O(bq * bk) instead of O(Sq * Skv). Everything type-checks inside
``shard_map(check_vma=True)`` (fresh scan carries are pcast to the inputs' varying axes).
The ids pass an ``optimization_barrier`` with the data (``tie_ids``) so that, inside a
differentiated layer scan, the masks / skip predicates are not hoisted out of the loop as
loop-invariant residuals (which would stack one mask per tile: O(Sq * Skv) memory).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax

from sharding.ops.varying import vary, varying_axes

_F32 = jnp.float32


class Carry(NamedTuple):
    """Running online-softmax state for one set of queries (all float32).

    m: [B, Sq, H] running max of the (scaled, masked) scores; -inf while no key was seen.
    l: [B, Sq, H] running denominator sum(exp(s - m)).
    o: [B, Sq, H, D] unnormalised output sum(exp(s - m) v).
    """

    m: jax.Array
    l: jax.Array
    o: jax.Array


def default_scale(head_dim: int) -> float:
    """Softmax scale 1/sqrt(D)."""
    return 1.0 / math.sqrt(head_dim)


# --------------------------------------------------------------------------------------------
# Masks
# --------------------------------------------------------------------------------------------
def make_mask(
    q_len: int,
    kv_len: int,
    *,
    q_segment_ids: Optional[jax.Array] = None,
    kv_segment_ids: Optional[jax.Array] = None,
    q_index: Optional[jax.Array] = None,
    kv_index: Optional[jax.Array] = None,
    causal: bool = True,
) -> Optional[jax.Array]:
    """Boolean mask broadcastable to scores [B, Sq, H, Skv], shape [B or 1, Sq, 1, Skv].

    Returns None when nothing is masked (no segment ids and not causal).
    """
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("pass both q_segment_ids and kv_segment_ids, or neither")
    mask = None
    if q_segment_ids is not None:
        qs = jnp.asarray(q_segment_ids)[:, :, None]  # [B, Sq, 1]
        ks = jnp.asarray(kv_segment_ids)[:, None, :]  # [B, 1, Skv]
        mask = (qs == ks) & (qs != 0)
    if causal:
        qi = jnp.arange(q_len, dtype=jnp.int32)[None] if q_index is None else jnp.asarray(q_index)
        ki = jnp.arange(kv_len, dtype=jnp.int32)[None] if kv_index is None else jnp.asarray(kv_index)
        c = ki[:, None, :] <= qi[:, :, None]  # [B or 1, Sq, Skv]
        mask = c if mask is None else mask & c
    if mask is None:
        return None
    return mask[:, :, None, :]


# --------------------------------------------------------------------------------------------
# Core math on an explicit mask (used by attend_block / block_grads and by the blockwise kernel)
# --------------------------------------------------------------------------------------------
# Grouped-query attention: K/V carry G heads, q carries H = G x R; query head h reads K/V head
# h // R. The three products below view the head axis of q-side arrays as [G, R] (a free
# reshape) so K/V are never repeated. With G = H they are the plain per-head einsums (the
# grouped form would make XLA keep another copy of the probabilities for the backward).
def _grouped(x, groups: int):
    """[B, S, H, ...] -> [B, S, G, H/G, ...]."""
    return x.reshape(*x.shape[:2], groups, x.shape[2] // groups, *x.shape[3:])


def _ungrouped(x):
    """[B, S, G, R, ...] -> [B, S, G*R, ...]."""
    return x.reshape(*x.shape[:2], x.shape[2] * x.shape[3], *x.shape[4:])


def head_dot(a, kv):
    """sum_d a[b,q,h,d] kv[b,k,g(h),d] -> [B, Sq, H, Skv] float32 (q . k, dout . v)."""
    if a.shape[2] == kv.shape[2]:
        return jnp.einsum("bqhd,bkhd->bqhk", a, kv, preferred_element_type=_F32)
    out = jnp.einsum("bqgrd,bkgd->bqgrk", _grouped(a, kv.shape[2]), kv, preferred_element_type=_F32)
    return _ungrouped(out)


def weigh_kv(w, kv):
    """sum_k w[b,q,h,k] kv[b,k,g(h),d] -> [B, Sq, H, D] float32 (p v, ds k)."""
    if w.shape[2] == kv.shape[2]:
        return jnp.einsum("bqhk,bkhd->bqhd", w, kv, preferred_element_type=_F32)
    out = jnp.einsum("bqgrk,bkgd->bqgrd", _grouped(w, kv.shape[2]), kv, preferred_element_type=_F32)
    return _ungrouped(out)


def to_kv(w, a, groups: int):
    """sum_{q, h in g} w[b,q,h,k] a[b,q,h,d] -> [B, Skv, G, D] float32 (p^T dout, ds^T q)."""
    if w.shape[2] == groups:
        return jnp.einsum("bqhk,bqhd->bkhd", w, a, preferred_element_type=_F32)
    return jnp.einsum("bqgrk,bqgrd->bkgd", _grouped(w, groups), _grouped(a, groups), preferred_element_type=_F32)


def check_heads(q, k, v) -> None:
    """Raise ValueError unless k and v are [B, Skv, G, D] with G dividing q's H heads."""
    B, _, H, D = q.shape
    if k.ndim != 4 or k.shape[0] != B or k.shape[3] != D or H % k.shape[2] or v.shape != k.shape:
        raise ValueError(f"shape mismatch: q {q.shape}, k {k.shape}, v {v.shape} "
                         "(k and v [B, Skv, G, D] with G dividing q's heads)")


def scores(q: jax.Array, k: jax.Array, scale: float) -> jax.Array:
    """Scaled scores [B, Sq, H, Skv] in float32 (matmul accumulates in f32)."""
    return head_dot(q, k) * jnp.asarray(scale, _F32)


def _safe(x):
    """Replace -inf (row saw nothing) by 0 so that x - safe(x) never forms -inf - -inf."""
    return jnp.where(jnp.isfinite(x), x, 0.0)


def attend_block_masked(carry: Carry, q, k, v, mask: Optional[jax.Array], scale: float) -> Carry:
    """One online-softmax step with an explicit boolean mask (or None)."""
    s = scores(q, k, scale)
    if mask is not None:
        s = jnp.where(mask, s, -jnp.inf)
    # The result is invariant to the choice of m, so no gradient needs to flow through it.
    m_new = lax.stop_gradient(jnp.maximum(carry.m, jnp.max(s, axis=-1)))
    m_ref = _safe(m_new)
    p = jnp.exp(s - m_ref[..., None])  # masked entries: exp(-inf) = 0
    corr = jnp.exp(carry.m - m_ref)  # carry.m = -inf -> 0
    l_new = carry.l * corr + jnp.sum(p, axis=-1)
    pv = weigh_kv(p.astype(v.dtype), v)
    o_new = carry.o * corr[..., None] + pv
    return Carry(m_new, l_new, o_new)


def block_grads_masked(q, k, v, lse, dout, delta, mask: Optional[jax.Array], scale: float):
    """(dq_part, dk_blk, dv_blk) in float32 for one K/V block, explicit mask (or None)."""
    s = scores(q, k, scale)
    if mask is not None:
        s = jnp.where(mask, s, -jnp.inf)
    finite = jnp.isfinite(lse)
    p = jnp.exp(s - _safe(lse)[..., None])
    p = jnp.where(finite[..., None], p, 0.0)  # rows that saw nothing anywhere
    dv = to_kv(p.astype(dout.dtype), dout, v.shape[2])
    dp = head_dot(dout, v)
    ds = p * (dp - delta[..., None].astype(_F32))
    sc = jnp.asarray(scale, _F32)
    dq = weigh_kv(ds.astype(k.dtype), k) * sc
    dk = to_kv(ds.astype(q.dtype), q, k.shape[2]) * sc
    return dq, dk, dv


# --------------------------------------------------------------------------------------------
# Tiling: the same math over (query tile x key tile) grids, skipping fully masked tiles
# --------------------------------------------------------------------------------------------
def materialize_ids(B, Sq, Skv, q_segment_ids=None, kv_segment_ids=None, q_index=None, kv_index=None):
    """int32 (q_seg [B,Sq], kv_seg [B,Skv], q_idx [B,Sq], kv_idx [B,Skv]); None -> ones / arange."""
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("pass both q_segment_ids and kv_segment_ids, or neither")
    i32 = jnp.int32
    if q_segment_ids is None:
        qseg, kseg = jnp.ones((B, Sq), i32), jnp.ones((B, Skv), i32)
    else:
        qseg = jnp.broadcast_to(jnp.asarray(q_segment_ids).astype(i32), (B, Sq))
        kseg = jnp.broadcast_to(jnp.asarray(kv_segment_ids).astype(i32), (B, Skv))
    qidx = jnp.arange(Sq, dtype=i32)[None] if q_index is None else jnp.asarray(q_index).astype(i32)
    kidx = jnp.arange(Skv, dtype=i32)[None] if kv_index is None else jnp.asarray(kv_index).astype(i32)
    return qseg, kseg, jnp.broadcast_to(qidx, (B, Sq)), jnp.broadcast_to(kidx, (B, Skv))


def _pad_seq(x, total, value=0):
    pad = total - x.shape[1]
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, pad)
    return jnp.pad(x, widths, constant_values=value)


def _to_tiles(x, b):
    """[B, n*b, ...] -> [n, B, b, ...]."""
    return jnp.moveaxis(x.reshape(x.shape[0], x.shape[1] // b, b, *x.shape[2:]), 1, 0)


def _from_tiles(x, length):
    """[n, B, b, ...] -> [B, length, ...] (dropping padding)."""
    x = jnp.moveaxis(x, 0, 1)
    x = x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])
    return x[:, :length] if x.shape[1] != length else x


def tie_ids(ids, data, axes):
    """``ids`` returned through an ``optimization_barrier`` together with ``data``.

    The mask of every tile (and the skip predicate of its ``lax.cond``) is a function of the ids
    alone, and ids are usually loop-invariant in a model's layer scan (segment ids and positions
    are the same for every layer; ``None`` ids are constants). When that scan is differentiated,
    its partial evaluation hoists loop-invariant residuals out of the loop: it re-partial-evaluates
    the known body with the scan's constants known and its carry unknown, so every tile loop here
    is split into a known part (masks from ids, the cond's predicate and its branches' id-only
    values) and an unknown part, and the known part's per-tile values become stacked residuals:
    O(n_q_tiles * n_k_tiles * bq * bk) bytes, i.e. O(Sq * Skv) like dense attention. Routing the
    ids through a barrier with the data makes everything derived from them depend on the data,
    so nothing here is loop-invariant any more (a no-op at run time; ``data`` is stop-gradient'ed
    so autodiff through the kernel sees no extra dependence)."""
    present = tuple(jnp.asarray(x) for x in ids if x is not None)
    if not present:
        return tuple(ids)
    anchors = tuple(lax.stop_gradient(x) for x in jax.tree.leaves(data))
    tied, _ = lax.optimization_barrier((vary(present, axes), vary(anchors, axes)))
    tied = iter(tied)
    return tuple(None if x is None else next(tied) for x in ids)


def _tile_size(b, n):
    return n if b is None else max(1, min(int(b), n))


def _tile_mask(qs, ks, qi, ki, causal):
    return make_mask(
        qs.shape[1], ks.shape[1], q_segment_ids=qs, kv_segment_ids=ks, q_index=qi, kv_index=ki,
        causal=causal,
    )


def attend_tiled(carry: Carry, q, k, v, ids, *, causal: bool, scale: float, bq=None, bk=None) -> Carry:
    """``attend_block`` over a grid of (bq x bk) tiles; ids from ``materialize_ids``.

    Any lengths: q / k are padded internally (segment id 0) and the carry is sliced back.
    Memory per step is O(bq * bk) per (batch, head). Tiles with no allowed pair are skipped.
    """
    qseg, kseg, qidx, kidx = ids
    Sq, Skv = q.shape[1], k.shape[1]
    bq, bk = _tile_size(bq, Sq), _tile_size(bk, Skv)
    sq_p, skv_p = -(-Sq // bq) * bq, -(-Skv // bk) * bk
    axes = varying_axes(carry, q, k, v, ids)
    carry = vary(carry, axes)
    qseg, kseg, qidx, kidx = tie_ids(ids, (carry, q, k, v), axes)
    kt = tuple(_to_tiles(_pad_seq(x, skv_p), bk) for x in (k, v, kseg, kidx))
    qt = tuple(_to_tiles(_pad_seq(x, sq_p), bq) for x in (q, qseg, qidx))
    ct = (
        _to_tiles(_pad_seq(carry.m, sq_p, -jnp.inf), bq),
        _to_tiles(_pad_seq(carry.l, sq_p), bq),
        _to_tiles(_pad_seq(carry.o, sq_p), bq),
    )

    def q_step(_, xs):
        (qb, qs, qi), c = xs

        def k_step(c, ys):
            kb, vb, ks, ki = ys
            mask = _tile_mask(qs, ks, qi, ki, causal)
            c = lax.cond(
                jnp.any(mask),
                lambda c: vary(attend_block_masked(c, qb, kb, vb, mask, scale), axes),
                lambda c: c,
                c,
            )
            return c, None

        c, _ = lax.scan(k_step, Carry(*c), kt)
        return None, tuple(c)

    _, (m, l, o) = lax.scan(q_step, None, (qt, ct))
    return Carry(_from_tiles(m, Sq), _from_tiles(l, Sq), _from_tiles(o, Sq))


def grads_tiled(q, k, v, lse, dout, delta, ids, *, causal: bool, scale: float, bq=None, bk=None):
    """``block_grads`` over a grid of (bq x bk) tiles; returns float32 (dq_part, dk, dv)."""
    qseg, kseg, qidx, kidx = ids
    Sq, Skv = q.shape[1], k.shape[1]
    bq, bk = _tile_size(bq, Sq), _tile_size(bk, Skv)
    sq_p, skv_p = -(-Sq // bq) * bq, -(-Skv // bk) * bk
    axes = varying_axes(q, k, v, lse, dout, delta, ids)
    qseg, kseg, qidx, kidx = tie_ids(ids, (q, k, v, lse, dout, delta), axes)
    kt = tuple(_to_tiles(_pad_seq(x, skv_p), bk) for x in (k, v, kseg, kidx))
    qt = tuple(
        _to_tiles(_pad_seq(x, sq_p, val), bq)
        for x, val in ((q, 0), (dout, 0), (lse, -jnp.inf), (delta, 0), (qseg, 0), (qidx, 0))
    )

    def q_step(acc, xs):
        qb, dob, lseb, deltab, qs, qi = xs

        def k_step(dq, ys):
            kb, vb, ks, ki = ys
            mask = _tile_mask(qs, ks, qi, ki, causal)

            def skip(_):
                z = jnp.zeros(kb.shape, _F32)
                return vary((jnp.zeros(qb.shape, _F32), z, z), axes)

            dq_p, dk_b, dv_b = lax.cond(
                jnp.any(mask),
                lambda _: vary(
                    block_grads_masked(qb, kb, vb, lseb, dob, deltab, mask, scale), axes
                ),
                skip,
                None,
            )
            return dq + dq_p, (dk_b, dv_b)

        dq0 = vary(jnp.zeros(qb.shape, _F32), axes)
        dq, (dk_b, dv_b) = lax.scan(k_step, dq0, kt)
        return (acc[0] + dk_b, acc[1] + dv_b), dq

    zeros = vary(jnp.zeros(kt[0].shape, _F32), axes)
    (dk, dv), dq = lax.scan(q_step, (zeros, zeros), qt)
    return _from_tiles(dq, Sq), _from_tiles(dk, Skv), _from_tiles(dv, Skv)


# --------------------------------------------------------------------------------------------
# Public pieces
# --------------------------------------------------------------------------------------------
def init_carry(q: jax.Array) -> Carry:
    """Empty state for queries q [B, Sq, H, D]."""
    B, S, H, D = q.shape
    return Carry(
        m=jnp.full((B, S, H), -jnp.inf, _F32),
        l=jnp.zeros((B, S, H), _F32),
        o=jnp.zeros((B, S, H, D), _F32),
    )


def attend_block(
    carry: Carry,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    q_segment_ids: Optional[jax.Array] = None,
    kv_segment_ids: Optional[jax.Array] = None,
    q_index: Optional[jax.Array] = None,
    kv_index: Optional[jax.Array] = None,
    causal: bool = True,
    scale: Optional[float] = None,
    q_block_size: Optional[int] = None,
    kv_block_size: Optional[int] = None,
) -> Carry:
    """Fold one K/V block (k, v [B, Skv, H, D]) into the running state for q [B, Sq, H, D].

    ``kv_segment_ids`` / ``kv_index`` describe this block's keys; any values are allowed
    (non-contiguous with q, or a block that is entirely masked: the carry is then unchanged).
    With ``q_block_size`` / ``kv_block_size`` (either may be None = whole length) the block is
    processed in tiles (scan, fully masked tiles skipped), so a ring step over long local
    sequences needs O(tile) rather than O(Sq * Skv) scratch. Untiled, it is differentiable by
    ordinary autodiff, though strategies should prefer ``block_grads`` in a custom VJP.
    """
    scale = default_scale(q.shape[-1]) if scale is None else scale
    if q_block_size is not None or kv_block_size is not None:
        ids = materialize_ids(
            q.shape[0], q.shape[1], k.shape[1], q_segment_ids, kv_segment_ids, q_index, kv_index
        )
        return attend_tiled(
            carry, q, k, v, ids, causal=causal, scale=scale, bq=q_block_size, bk=kv_block_size
        )
    data, ids = (carry, q, k, v), (q_segment_ids, kv_segment_ids, q_index, kv_index)
    q_segment_ids, kv_segment_ids, q_index, kv_index = tie_ids(ids, data, varying_axes(data, ids))
    mask = make_mask(
        q.shape[1], k.shape[1], q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
        q_index=q_index, kv_index=kv_index, causal=causal,
    )
    return attend_block_masked(carry, q, k, v, mask, scale)


def finish(carry: Carry, dtype=None):
    """-> (out [B, Sq, H, D], lse [B, Sq, H] float32).

    out is cast to ``dtype`` if given (else float32). Rows that saw no key: out = 0, lse = -inf.
    """
    seen = carry.l > 0
    l_safe = jnp.where(seen, carry.l, 1.0)
    out = jnp.where(seen[..., None], carry.o / l_safe[..., None], 0.0)
    lse = jnp.where(seen, carry.m + jnp.log(l_safe), -jnp.inf)
    if dtype is not None:
        out = out.astype(dtype)
    return out, lse


def compute_delta(out: jax.Array, dout: jax.Array) -> jax.Array:
    """delta = sum(dout * out, -1) in float32, [B, Sq, H]."""
    return jnp.sum(out.astype(_F32) * dout.astype(_F32), axis=-1)


def block_grads(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    lse: jax.Array,
    dout: jax.Array,
    delta: jax.Array,
    *,
    q_segment_ids: Optional[jax.Array] = None,
    kv_segment_ids: Optional[jax.Array] = None,
    q_index: Optional[jax.Array] = None,
    kv_index: Optional[jax.Array] = None,
    causal: bool = True,
    scale: Optional[float] = None,
    q_block_size: Optional[int] = None,
    kv_block_size: Optional[int] = None,
):
    """Gradient contributions of one K/V block, recomputing probabilities from ``lse``.

    ``lse`` is the final logsumexp of the full attention (from ``finish``), ``dout`` the output
    cotangent, ``delta = compute_delta(out, dout)``. Returns float32
    ``(dq_part [B, Sq, H, D], dk_blk [B, Skv, H, D], dv_blk [B, Skv, H, D])``: summing dq_part
    over all blocks gives dq; dk_blk / dv_blk are this block's complete gradients if q covers
    every query (else sum them over the query shards that visit the block). Tiling arguments
    as in ``attend_block``.
    """
    scale = default_scale(q.shape[-1]) if scale is None else scale
    if q_block_size is not None or kv_block_size is not None:
        ids = materialize_ids(
            q.shape[0], q.shape[1], k.shape[1], q_segment_ids, kv_segment_ids, q_index, kv_index
        )
        return grads_tiled(
            q, k, v, lse, dout, delta, ids, causal=causal, scale=scale,
            bq=q_block_size, bk=kv_block_size,
        )
    data, ids = (q, k, v, lse, dout, delta), (q_segment_ids, kv_segment_ids, q_index, kv_index)
    q_segment_ids, kv_segment_ids, q_index, kv_index = tie_ids(ids, data, varying_axes(data, ids))
    mask = make_mask(
        q.shape[1], k.shape[1], q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
        q_index=q_index, kv_index=kv_index, causal=causal,
    )
    return block_grads_masked(q, k, v, lse, dout, delta, mask, scale)
