"""Ring attention: causal, segment-masked attention over a sequence split along a device ring.

Called inside ``shard_map``. Each device holds one chunk of the sequence: its queries
q [B, Sq, H, D], keys / values k, v [B, Skv, G, D] (G dividing H), their segment ids and absolute token
indices (any values: chunks need not be contiguous or balanced). The K/V blocks travel a
``ppermute`` ring of ``axis_size`` steps and every device folds each visiting block into an
online-softmax carry (``sharding.ops.online_softmax``). The schedule, forward::

    blk = own (k, v, kv_segment_ids, kv_index)
    for step in range(p - 1):
        nxt = shift(blk)                 # issued first: travels while we compute
        carry = attend(carry, q, blk)
        blk = nxt
    carry = attend(carry, q, blk)        # the last visitor; p - 1 hops in all

Backward (``jax.custom_vjp``; nothing of the forward ring is saved but q, k, v, out, lse)::

    for step in range(p):
        nxt = shift(blk)                 # k, v of the next visitor (not after the last step)
        dq_part, dk, dv = block_grads(q, blk, ...)
        acc = shift(acc + (dk, dv))      # dK / dV travel with their block ...
        blk = nxt
    dk, dv = acc                         # ... and arrive home after the p-th hop

Differentiating the forward loop by autodiff instead keeps every visiting block and its
per-tile residuals (``ring_attention_autodiff``, kept for tests and memory comparisons).
Visiting blocks (or tiles of them) with no allowed query-key pair, e.g. the causal upper
triangle, are skipped with ``lax.cond``. Contiguous chunks leave the ring unbalanced under a
causal mask (device 0 skips p - 1 blocks, device p - 1 none); zigzag chunking is not done here.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence, Union

import jax
import jax.numpy as jnp
from jax import lax

from sharding.ops.online_softmax import (
    _pvary,
    _varying_axes,
    attend_tiled,
    check_heads,
    compute_delta,
    default_scale,
    finish,
    grads_tiled,
    init_carry,
    materialize_ids,
)

AxisName = Union[str, Sequence[str]]
_F32 = jnp.float32


def _axes_tuple(axis_name: AxisName) -> tuple[str, ...]:
    return (axis_name,) if isinstance(axis_name, str) else tuple(axis_name)


def _ring_name(axis_name: AxisName):
    axes = _axes_tuple(axis_name)
    return axes[0] if len(axes) == 1 else axes


def chunk_index(batch: int, chunk_len: int, axis_name: AxisName) -> jax.Array:
    """Absolute token indices [batch, chunk_len] of this device's contiguous sequence chunk.

    Chunk r (r = ``axis_index`` along the ring) holds tokens r*chunk_len ... (r+1)*chunk_len-1.
    """
    r = lax.axis_index(_ring_name(axis_name))
    idx = r * chunk_len + jnp.arange(chunk_len, dtype=jnp.int32)
    return jnp.broadcast_to(idx[None], (batch, chunk_len))


def _shift(tree, axis_name: AxisName, axis_size: int):
    """Send to the next device on the ring (device i -> i + 1 mod p)."""
    perm = [(i, (i + 1) % axis_size) for i in range(axis_size)]
    return lax.ppermute(tree, _ring_name(axis_name), perm)


# --------------------------------------------------------------------------------------------
# Forward and backward rings
# --------------------------------------------------------------------------------------------
def _forward(q, k, v, qseg, kseg, qidx, kidx, axis_name, axis_size, causal, scale, bq, bk):
    """-> (out [B,Sq,H,D] in q.dtype, lse [B,Sq,H] f32) after p - 1 hops of the K/V ring."""
    axes = _varying_axes(q, k, v, qseg, kseg, qidx, kidx) + _axes_tuple(axis_name)
    axes = tuple(sorted(set(axes)))
    q_ids = _pvary((qseg, qidx), axes)
    blk = _pvary((k, v, kseg, kidx), axes)

    def attend(carry, blk):
        k_b, v_b, ks_b, ki_b = blk
        ids = (q_ids[0], ks_b, q_ids[1], ki_b)
        return attend_tiled(carry, q, k_b, v_b, ids, causal=causal, scale=scale, bq=bq, bk=bk)

    def step(state, _):
        carry, blk = state
        nxt = _shift(blk, axis_name, axis_size)
        return (attend(carry, blk), nxt), None

    carry = _pvary(init_carry(q), axes)
    (carry, blk), _ = lax.scan(step, (carry, blk), None, length=axis_size - 1)
    return finish(attend(carry, blk), dtype=q.dtype)


def _backward(q, k, v, qseg, kseg, qidx, kidx, out, lse, dout, axis_name, axis_size, causal,
              scale, bq, bk):
    """-> float32 (dq, dk, dv): the K/V ring again, dK / dV accumulators travelling along."""
    axes = _varying_axes(q, k, v, qseg, kseg, qidx, kidx, out, lse, dout) + _axes_tuple(axis_name)
    axes = tuple(sorted(set(axes)))
    q_ids = _pvary((qseg, qidx), axes)
    delta = compute_delta(out, dout)

    def grads(blk):
        k_b, v_b, ks_b, ki_b = blk
        ids = (q_ids[0], ks_b, q_ids[1], ki_b)
        return grads_tiled(q, k_b, v_b, lse, dout, delta, ids, causal=causal, scale=scale,
                           bq=bq, bk=bk)

    def step(state, _, last=False):
        dq, blk, (dk_acc, dv_acc) = state
        nxt = blk if last else _shift(blk, axis_name, axis_size)
        dq_part, dk_b, dv_b = grads(blk)
        acc = _shift((dk_acc + dk_b, dv_acc + dv_b), axis_name, axis_size)
        return (dq + dq_part, nxt, acc), None

    zeros_kv = jnp.zeros(k.shape, _F32)
    state = _pvary((jnp.zeros(q.shape, _F32), (k, v, kseg, kidx), (zeros_kv, zeros_kv)), axes)
    state, _ = lax.scan(step, state, None, length=axis_size - 1)
    (dq, _, (dk, dv)), _ = step(state, None, last=True)
    return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9, 10, 11, 12))
def _ring(q, k, v, qseg, kseg, qidx, kidx, axis_name, axis_size, causal, scale, bq, bk):
    return _forward(q, k, v, qseg, kseg, qidx, kidx, axis_name, axis_size, causal, scale, bq, bk)[0]


def _ring_fwd(q, k, v, qseg, kseg, qidx, kidx, axis_name, axis_size, causal, scale, bq, bk):
    out, lse = _forward(q, k, v, qseg, kseg, qidx, kidx, axis_name, axis_size, causal, scale, bq, bk)
    return out, (q, k, v, qseg, kseg, qidx, kidx, out, lse)


def _ring_bwd(axis_name, axis_size, causal, scale, bq, bk, res, dout):
    q, k, v, qseg, kseg, qidx, kidx, out, lse = res
    dq, dk, dv = _backward(q, k, v, qseg, kseg, qidx, kidx, out, lse, dout, axis_name, axis_size,
                           causal, scale, bq, bk)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None, None, None


_ring.defvjp(_ring_fwd, _ring_bwd)


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------
def _prepare(q, k, v, q_segment_ids, kv_segment_ids, q_index, kv_index, axis_name, axis_size,
             scale, q_block_size, kv_block_size):
    B, Sq, H, D = q.shape
    Skv = k.shape[1]
    check_heads(q, k, v)
    if axis_size is None:
        axis_size = lax.axis_size(_ring_name(axis_name))
    q_index = chunk_index(B, Sq, axis_name) if q_index is None else q_index
    kv_index = chunk_index(B, Skv, axis_name) if kv_index is None else kv_index
    ids = materialize_ids(B, Sq, Skv, q_segment_ids, kv_segment_ids, q_index, kv_index)
    scale = default_scale(D) if scale is None else float(scale)
    bq = Sq if q_block_size is None else max(1, min(int(q_block_size), Sq))
    bk = Skv if kv_block_size is None else max(1, min(int(kv_block_size), Skv))
    axis_name = _axes_tuple(axis_name)
    return ids, (axis_name, int(axis_size), scale, bq, bk)


def ring_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    axis_name: AxisName,
    axis_size: Optional[int] = None,
    q_segment_ids: Optional[jax.Array] = None,
    kv_segment_ids: Optional[jax.Array] = None,
    q_index: Optional[jax.Array] = None,
    kv_index: Optional[jax.Array] = None,
    causal: bool = True,
    scale: Optional[float] = None,
    q_block_size: Optional[int] = None,
    kv_block_size: Optional[int] = None,
) -> jax.Array:
    """Attention of this device's queries to the keys of every device on the ring (in shard_map).

    q [B, Sq, H, D], k / v [B, Skv, H, D]: this device's chunk. Segment ids [B, S*] (0 = padding;
    None = no segment masking) and absolute token indices [B, S*] for the causal rule
    kv_index <= q_index (None: contiguous chunks, ``chunk_index``). ``axis_name``: the mesh
    axis or axes forming the ring, ``axis_size`` their total size (None: looked up). Each
    visiting block is processed in (q_block_size x kv_block_size) tiles (None = whole chunk).
    Returns out [B, Sq, H, D] in q's dtype, equal to dense attention over the whole sequence;
    the custom VJP recomputes per block and runs the ring again.
    """
    ids, static = _prepare(q, k, v, q_segment_ids, kv_segment_ids, q_index, kv_index, axis_name,
                           axis_size, scale, q_block_size, kv_block_size)
    axis_name, axis_size, scale, bq, bk = static
    return _ring(q, k, v, *ids, axis_name, axis_size, bool(causal), scale, bq, bk)


def ring_attention_autodiff(q, k, v, *, axis_name: AxisName, axis_size: Optional[int] = None,
                            q_segment_ids=None, kv_segment_ids=None, q_index=None, kv_index=None,
                            causal: bool = True, scale: Optional[float] = None,
                            q_block_size: Optional[int] = None, kv_block_size: Optional[int] = None):
    """``ring_attention`` differentiated by plain autodiff through the ring (keeps every block).

    For tests and memory comparisons only.
    """
    ids, static = _prepare(q, k, v, q_segment_ids, kv_segment_ids, q_index, kv_index, axis_name,
                           axis_size, scale, q_block_size, kv_block_size)
    axis_name, axis_size, scale, bq, bk = static
    return _forward(q, k, v, *ids, axis_name, axis_size, bool(causal), scale, bq, bk)[0]


__all__ = ["chunk_index", "ring_attention", "ring_attention_autodiff"]
