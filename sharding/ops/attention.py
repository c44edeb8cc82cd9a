"""Per-device attention: a dense reference and a memory-efficient blockwise (flash) kernel.

q, k, v: [B, S, H, D] / [B, Skv, G, D], G dividing H (grouped-query attention when G < H). Masks from integer arrays (see ``online_softmax``):
segment ids (0 = padding; attention only within equal nonzero ids; None = no segment masking)
and absolute token indices for the causal rule kv_index <= q_index (None = arange).
Softmax in float32 whatever the input dtype; the output has q's dtype. Fully masked query rows
(padding) output 0 and get 0 gradient.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax

from sharding.ops.flash import check_heads, default_scale, materialize_ids
from sharding.ops.kernels import Kernel, flash_attention
from sharding.ops.online_softmax import make_mask

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
    B, Sq, H, D = q.shape
    G = k.shape[2]
    qg = q.reshape(B, Sq, G, H // G, D)  # scores [B, G, H/G, Sq, Skv]: the layout XLA's dot gives
    s = jnp.einsum("bqgrd,bkgd->bgrqk", qg, k, preferred_element_type=_F32) * jnp.asarray(scale, _F32)
    if mask is not None:
        s = jnp.where(mask[:, None, None, :, 0], s, -jnp.inf)
    m = lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.exp(s - m)
    l = jnp.sum(p, axis=-1)
    seen = l > 0
    l_safe = jnp.where(seen, l, 1.0)
    o = jnp.einsum("bgrqk,bkgd->bgrqd", p.astype(v.dtype), v, preferred_element_type=_F32)
    o = jnp.where(seen[..., None], o / l_safe[..., None], 0.0)
    out = jnp.moveaxis(o, 3, 1).reshape(B, Sq, H, D).astype(q.dtype)
    if not return_lse:
        return out
    lse = jnp.where(seen, m[..., 0] + jnp.log(l_safe), -jnp.inf)
    return out, jnp.moveaxis(lse, 3, 1).reshape(B, Sq, H)


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
    """Memory-efficient attention: the flash kernel (`sharding.ops.flash`), custom VJP.

    Same semantics as ``dense_attention``. Keys are processed in tiles of at most ``block_size``
    and queries of at most ``q_block_size`` (None: block_size), smaller where a tile's scores
    would not fit a cache (`flash.tile_sizes`); only tile pairs that may hold an allowed pair
    are visited (the causal lower triangle, each document's own tiles). The backward recomputes
    each tile from the saved (q, k, v, out, log-sum-exp), so training memory is O(S·D + tile)
    per (batch, head) instead of O(S·Skv), inside a differentiated layer scan too. Any lengths
    (tiles are padded internally with segment id 0).
    """
    B, Sq = q.shape[:2]
    ids = materialize_ids(B, Sq, k.shape[1], q_segment_ids, kv_segment_ids, q_index, kv_index)
    kernel = Kernel("xla", block_size if q_block_size is None else q_block_size, block_size)
    return flash_attention(q, k, v, ids, kernel, causal=causal, scale=scale)[0]
