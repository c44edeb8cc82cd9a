"""Ring attention: causal, segment-masked attention over a sequence split along a device ring.

Called inside ``shard_map``. Each device holds one chunk of the sequence: its queries
q [B, Sq, H, D], keys / values k, v [B, Skv, G, D] (G dividing H), their segment ids and
absolute token indices (any values: chunks need not be contiguous or balanced). The K/V blocks,
with their ids, travel the ring (`sharding.ops.ring`), and every device merges each visiting
block's attention (a local `sharding.ops.kernels.Kernel`: the XLA flash kernel or Pallas's)
into its output by log-sum-exp::

    forward:  ring_forward over the blocks:   (out, lse) = merge((out, lse), flash(q, block))
    backward: ring_backward over the blocks:  dq += dq_part; (dk, dv) of the block follow it
                                              one hop behind and arrive home after the last

The backward (``jax.custom_vjp``) keeps nothing of the forward ring but q, k, v, out and lse.
Tile pairs with no allowed query-key pair (the causal future, other documents) are not
visited; a block wholly in the future costs no tile at all. Contiguous chunks leave the ring unbalanced under a
causal mask (device 0 skips p - 1 blocks, device p - 1 none); zigzag chunking is not done here.
METP's attention runs its K/V ring through `ring_attention_forward` / `ring_attention_backward`.
"""
from __future__ import annotations

from functools import partial
from typing import Optional, Sequence, Union

import jax
import jax.numpy as jnp
from jax import lax

from sharding.ops.flash import check_heads, default_scale, materialize_ids, merge
from sharding.ops.kernels import Kernel, flash_attention
from sharding.ops.online_softmax import compute_delta
from sharding.ops.ring import Ring, ring_backward, ring_forward
from sharding.ops.varying import vary, varying_axes
from sharding.remat import keep

AxisName = Union[str, Sequence[str]]
_F32 = jnp.float32


def axes_tuple(axis_name: AxisName) -> tuple[str, ...]:
    """A mesh axis name or sequence of names as a tuple."""
    return (axis_name,) if isinstance(axis_name, str) else tuple(axis_name)


def chunk_index(batch: int, chunk_len: int, axis_name: AxisName) -> jax.Array:
    """Absolute token indices [batch, chunk_len] of this device's contiguous sequence chunk.

    Chunk r (r = ``axis_index`` along the ring) holds tokens r*chunk_len ... (r+1)*chunk_len-1.
    """
    axes = axes_tuple(axis_name)
    r = lax.axis_index(axes[0] if len(axes) == 1 else axes)
    idx = r * chunk_len + jnp.arange(chunk_len, dtype=jnp.int32)
    return jnp.broadcast_to(idx[None], (batch, chunk_len))


def _ring_axes(ring: Ring, *trees) -> tuple[str, ...]:
    return tuple(sorted(set(varying_axes(*trees)) | set(ring.axis)))


def tie_ids(ids, data, axes):
    """``ids`` returned through an ``optimization_barrier`` together with ``data`` (stop-gradient'ed),
    so that everything derived from them depends on the data: inside a loop of its own (METP's
    head groups) the ids' ring hops are then not hoisted out of that loop, where nothing would
    order them with the other collectives (`sharding.ops.ordering`). A no-op at run time."""
    anchors = tuple(lax.stop_gradient(x) for x in jax.tree.leaves(data))
    tied, _ = lax.optimization_barrier((vary(tuple(ids), axes), vary(anchors, axes)))
    return tied


def ring_attention_forward(q, k, v, ids, ring: Ring, kernel: Kernel = Kernel(), *, causal: bool = True,
                           scale: Optional[float] = None):
    """(out [B, Sq, H, D] in q's dtype, lse [B, Sq, H] float32) of this chunk's queries over the
    K/V blocks of every device on `ring`. ids = (q_seg, kv_seg, q_idx, kv_idx) of this chunk
    (`materialize_ids`); each visiting block's attention (`kernel`) is merged into the output by
    log-sum-exp. Differentiable by autodiff too (which keeps every visiting block)."""
    scale = default_scale(q.shape[-1]) if scale is None else scale
    axes = _ring_axes(ring, q, k, v, ids)
    qseg, kseg, qidx, kidx = vary(ids, axes)

    def attend(block, state):
        kb, vb, ks, ki = block
        out, lse = flash_attention(q, kb, vb, (qseg, ks, qidx, ki), kernel, causal=causal, scale=scale, out_dtype=_F32)
        return merge(*state, out, lse)

    B, Sq, H, D = q.shape
    state = vary((jnp.zeros((B, Sq, H, D), _F32), jnp.full((B, Sq, H), -jnp.inf, _F32)), axes)
    out, lse = ring_forward(ring, attend, vary((k, v, kseg, kidx), axes), state)
    return out.astype(q.dtype), lse


def ring_attention_backward(q, k, v, ids, out, lse, dout, ring: Ring, kernel: Kernel = Kernel(), *,
                            causal: bool = True, scale: Optional[float] = None, nested: bool = False):
    """float32 (dq, dk, dv) of `ring_attention_forward` from the output cotangent: the K/V ring
    again, each block's dK / dV one hop behind it.

    nested: inside a loop of its own (METP's head groups): the ids' ring hops are made to depend on
    dout (`tie_ids`), and a block's gradient travels with the next block
    (`ring_backward(grad_with_block=True)`)."""
    scale = default_scale(q.shape[-1]) if scale is None else scale
    axes = _ring_axes(ring, q, k, v, ids, out, lse, dout)
    qseg, kseg, qidx, kidx = tie_ids(ids, dout, axes) if nested else vary(ids, axes)
    delta = compute_delta(out, dout)

    def grads(block, dq):
        kb, vb, ks, ki = block
        dq_b, dk, dv = kernel.backward(q, kb, vb, (qseg, ks, qidx, ki), lse, dout, delta, causal=causal, scale=scale)
        return dq + dq_b, (dk, dv)

    dq, (dk, dv) = ring_backward(ring, grads, (k, v, kseg, kidx), vary(jnp.zeros(q.shape, _F32), axes),
                                 grad_with_block=nested)
    return dq, dk, dv


@partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _ring_attention(q, k, v, ids, ring, kernel, causal, scale):
    return ring_attention_forward(q, k, v, ids, ring, kernel, causal=causal, scale=scale)[0]


def _ring_attention_fwd(q, k, v, ids, ring, kernel, causal, scale):
    out, lse = keep(ring_attention_forward(q, k, v, ids, ring, kernel, causal=causal, scale=scale))
    q, k, v = keep((q, k, v))  # marked here as well: they reach the kernel through a shard_map
    return out, (q, k, v, ids, out, lse)


def _ring_attention_bwd(ring, kernel, causal, scale, res, dout):
    q, k, v, ids, out, lse = res
    dq, dk, dv = ring_attention_backward(q, k, v, ids, out, lse, dout, ring, kernel, causal=causal, scale=scale)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_ring_attention.defvjp(_ring_attention_fwd, _ring_attention_bwd)


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
    kernel: Optional[Kernel] = None,
) -> jax.Array:
    """Attention of this device's queries to the keys of every device on the ring (in shard_map).

    q [B, Sq, H, D], k / v [B, Skv, G, D]: this device's chunk. Segment ids [B, S*] (0 = padding;
    None = no segment masking) and absolute token indices [B, S*] for the causal rule
    kv_index <= q_index (None: contiguous chunks, ``chunk_index``). ``axis_name``: the mesh
    axis or axes forming the ring, ``axis_size`` their total size (None: looked up). Each
    visiting block is attended by ``kernel`` (default: the XLA flash kernel in tiles of at most
    q_block_size x kv_block_size; None = whole chunk).
    Returns out [B, Sq, H, D] in q's dtype, equal to dense attention over the whole sequence;
    the custom VJP recomputes per block and runs the ring again.
    """
    B, Sq, _, D = q.shape
    Skv = k.shape[1]
    check_heads(q, k, v)
    axes = axes_tuple(axis_name)
    if axis_size is None:
        axis_size = lax.axis_size(axes[0] if len(axes) == 1 else axes)
    q_index = chunk_index(B, Sq, axes) if q_index is None else q_index
    kv_index = chunk_index(B, Skv, axes) if kv_index is None else kv_index
    ids = materialize_ids(B, Sq, Skv, q_segment_ids, kv_segment_ids, q_index, kv_index)
    scale = default_scale(D) if scale is None else float(scale)
    kernel = Kernel("xla", q_block_size, kv_block_size) if kernel is None else kernel
    return _ring_attention(q, k, v, ids, Ring(axes, int(axis_size)), kernel, bool(causal), scale)


__all__ = ["axes_tuple", "chunk_index", "ring_attention", "ring_attention_backward", "ring_attention_forward"]
