"""Per-device attention: a dense reference and a memory-efficient blockwise (flash) kernel.

q, k, v: [B, S, H, D] / [B, Skv, G, D], G dividing H (grouped-query attention when G < H). Masks from integer arrays (see ``online_softmax``):
segment ids (0 = padding; attention only within equal nonzero ids; None = no segment masking)
and absolute token indices for the causal rule kv_index <= q_index (None = arange).
Softmax in float32 whatever the input dtype; the output has q's dtype. Fully masked query rows
(padding) output 0 and get 0 gradient.
"""
from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax

from sharding.ops.online_softmax import (
    attend_tiled,
    compute_delta,
    default_scale,
    finish,
    grads_tiled,
    init_carry,
    make_mask,
    materialize_ids,
    check_heads,
    scores,
    weigh_kv,
)
from sharding.remat import keep

_F32 = jnp.float32


def dense_attention(
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
    return_lse: bool = False,
):
    """Reference attention materialising the [B, S, H, Skv] scores (O(S·Skv) memory).

    Returns out [B, S, H, D] in q's dtype, or (out, lse [B, S, H] float32) with return_lse.
    """
    check_heads(q, k, v)
    scale = default_scale(q.shape[-1]) if scale is None else scale
    mask = make_mask(
        q.shape[1], k.shape[1], q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
        q_index=q_index, kv_index=kv_index, causal=causal,
    )
    s = scores(q, k, scale)
    if mask is not None:
        s = jnp.where(mask, s, -jnp.inf)
    m = lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.exp(s - m)
    l = jnp.sum(p, axis=-1)
    seen = l > 0
    l_safe = jnp.where(seen, l, 1.0)
    o = weigh_kv(p.astype(v.dtype), v)
    out = jnp.where(seen[..., None], o / l_safe[..., None], 0.0).astype(q.dtype)
    if not return_lse:
        return out
    lse = jnp.where(seen, m[..., 0] + jnp.log(l_safe), -jnp.inf)
    return out, lse


# --------------------------------------------------------------------------------------------
# Blockwise (flash) attention
# --------------------------------------------------------------------------------------------
@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9, 10))
def _flash(q, k, v, qseg, kseg, qidx, kidx, causal, scale, bq, bk):
    return _flash_fwd(q, k, v, qseg, kseg, qidx, kidx, causal, scale, bq, bk)[0]


def _flash_fwd(q, k, v, qseg, kseg, qidx, kidx, causal, scale, bq, bk):
    ids = (qseg, kseg, qidx, kidx)
    carry = attend_tiled(init_carry(q), q, k, v, ids, causal=causal, scale=scale, bq=bq, bk=bk)
    out, lse = keep(finish(carry, dtype=q.dtype))  # q, k, v are marked by whoever made them
    return out, (q, k, v, qseg, kseg, qidx, kidx, out, lse)


def _flash_bwd(causal, scale, bq, bk, res, dout):
    q, k, v, qseg, kseg, qidx, kidx, out, lse = res
    delta = compute_delta(out, dout)
    dq, dk, dv = grads_tiled(
        q, k, v, lse, dout, delta, (qseg, kseg, qidx, kidx),
        causal=causal, scale=scale, bq=bq, bk=bk,
    )
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def blockwise_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    q_segment_ids: Optional[jax.Array] = None,
    kv_segment_ids: Optional[jax.Array] = None,
    q_index: Optional[jax.Array] = None,
    kv_index: Optional[jax.Array] = None,
    causal: bool = True,
    block_size: int = 512,
    q_block_size: Optional[int] = None,
    scale: Optional[float] = None,
) -> jax.Array:
    """Memory-efficient attention: online softmax over K/V blocks, flash-style custom VJP.

    Same semantics as ``dense_attention``. Keys are processed ``block_size`` at a time and
    queries ``q_block_size`` at a time (None: same as block_size; pass q_block_size >= S to
    keep all queries in one tile), each a ``lax.scan``. The backward recomputes every
    (query tile, key tile) from the saved (q, k, v, out, logsumexp), so training memory is
    O(S·D + bq·bk) per (batch, head) instead of O(S·Skv). Tiles whose mask is entirely False
    (above the causal diagonal, other documents, padding) are skipped with ``lax.cond``; this
    stays O(S·D + bq·bk) inside a differentiated layer ``lax.scan`` too (see
    ``online_softmax.tie_ids``: the masks are not hoisted out of the scan as stacked residuals).
    Lengths that are not multiples of the tile sizes are padded internally (segment id 0)
    and sliced back.
    """
    B, Sq, H, D = q.shape
    Skv = k.shape[1]
    check_heads(q, k, v)
    scale = default_scale(D) if scale is None else float(scale)
    ids = materialize_ids(B, Sq, Skv, q_segment_ids, kv_segment_ids, q_index, kv_index)
    bk = max(1, min(int(block_size), Skv))
    bq = max(1, min(int(block_size if q_block_size is None else q_block_size), Sq))
    return _flash(q, k, v, *ids, bool(causal), scale, bq, bk)
