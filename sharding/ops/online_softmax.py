"""Attention over K/V blocks visited one at a time (a ring's schedule), from the flash kernel.

Layout: q [B, Sq, H, D]; a K/V block k, v [B, Skv, G, D] with G dividing H. The state over the
blocks seen so far is the normalised output and its log-sum-exp (`Carry`); a new block's own
(out, lse) from the flash kernel (`sharding.ops.flash`) is merged into it by log-sum-exp.

Masking comes from integer arrays, never from the block's position:
  * ``q_segment_ids`` [B, Sq], ``kv_segment_ids`` [B, Skv]: attention only between equal
    nonzero ids; 0 is padding (a padded query attends to nothing). Pass both or neither.
  * ``q_index`` [B, Sq], ``kv_index`` [B, Skv]: absolute token indices within the row; with
    ``causal=True`` a query attends to keys with ``kv_index <= q_index``. ``None`` means
    ``arange`` of the respective length.
So any visiting block is allowed (indices not contiguous with q, or a block wholly masked).

Forward over blocks::

    carry = init_carry(q)
    for k_blk, v_blk, (ids...) in blocks:
        carry = attend_block(carry, q, k_blk, v_blk, **ids)
    out, lse = finish(carry, dtype=q.dtype)

Backward over blocks (flash-attention style, recomputing the probabilities)::

    delta = compute_delta(out, dout)
    for each block:
        dq_part, dk_blk, dv_blk = block_grads(q, k_blk, v_blk, lse, dout, delta, **ids)
        dq += dq_part        # dk_blk / dv_blk belong to (and travel with) the block

`attend_block` is differentiable by autodiff as well (the kernel's custom VJP, the merge plain
JAX). All statistics and partial gradients are float32. Rows that see no key carry out 0 and
lse -inf, and produce no NaN. The ring kernels (`sharding.ops.ring_attention`) run the same
schedule on tiles they keep tiled between blocks.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from sharding.ops.flash import default_scale, materialize_ids, merge
from sharding.ops.kernels import Kernel, flash_attention

_F32 = jnp.float32


class Carry(NamedTuple):
    """Attention of a set of queries over the blocks seen so far (float32).

    out: [B, Sq, H, D] normalised output; 0 while no key was seen.
    lse: [B, Sq, H] its log-sum-exp; -inf while no key was seen.
    """

    out: jax.Array
    lse: jax.Array


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


def init_carry(q: jax.Array) -> Carry:
    """Empty state for queries q [B, Sq, H, D]."""
    B, S, H, D = q.shape
    return Carry(jnp.zeros((B, S, H, D), _F32), jnp.full((B, S, H), -jnp.inf, _F32))


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
    """Fold one K/V block (k, v [B, Skv, G, D]) into the state of queries q [B, Sq, H, D].

    ``kv_segment_ids`` / ``kv_index`` describe this block's keys; any values are allowed (a
    block wholly masked leaves the state as it was). The block is computed in tiles of at most
    (q_block_size x kv_block_size) (None: whole lengths; see `sharding.ops.flash`).
    """
    ids = materialize_ids(q.shape[0], q.shape[1], k.shape[1], q_segment_ids, kv_segment_ids, q_index, kv_index)
    out, lse = flash_attention(q, k, v, ids, Kernel("xla", q_block_size, kv_block_size), causal=causal, scale=scale,
                               out_dtype=_F32)
    return Carry(*merge(carry.out, carry.lse, out, lse))


def finish(carry: Carry, dtype=None):
    """-> (out [B, Sq, H, D], lse [B, Sq, H] float32); out cast to ``dtype`` if given. Rows that
    saw no key: out 0, lse -inf."""
    return (carry.out if dtype is None else carry.out.astype(dtype)), carry.lse


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

    ``lse`` is the final log-sum-exp of the full attention (from ``finish``), ``dout`` the
    output cotangent, ``delta = compute_delta(out, dout)``. Returns float32 ``(dq_part
    [B, Sq, H, D], dk_blk [B, Skv, G, D], dv_blk [B, Skv, G, D])``: summing dq_part over all
    blocks gives dq; dk_blk / dv_blk are this block's complete gradients if q covers every
    query (else sum them over the query shards that visit the block). Tiling as in
    ``attend_block``.
    """
    scale = default_scale(q.shape[-1]) if scale is None else scale
    ids = materialize_ids(q.shape[0], q.shape[1], k.shape[1], q_segment_ids, kv_segment_ids, q_index, kv_index)
    return Kernel("xla", q_block_size, kv_block_size).backward(q, k, v, ids, lse, dout, delta, causal=causal,
                                                               scale=scale)
