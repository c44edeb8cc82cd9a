"""Reference pieces for the ring kernels, reached only from tests.

The rings differentiated by plain autodiff (which keeps every visiting block: the memory the
hand-written backward saves), METP's head groups sent by ring hops instead of a masked psum,
and the merge of two partial attentions.
"""
import jax
import jax.numpy as jnp

from sharding.ops.metp import attention_forward, broadcast, mlp_ring_forward
from sharding.ops.flash import materialize_ids
from sharding.ops.kernels import Kernel
from sharding.ops.ring import Ring, shift
from sharding.ops.ring_attention import axes_tuple, ring_attention_forward

_F32 = jnp.float32


def ring_attention_autodiff(q, k, v, *, axis_name, axis_size: int, q_segment_ids=None, kv_segment_ids=None,
                            q_index=None, kv_index=None, q_block_size=None, kv_block_size=None):
    """`ring_attention` (explicit indices) differentiated by autodiff through the ring."""
    B, Sq, Skv = q.shape[0], q.shape[1], k.shape[1]
    ids = materialize_ids(B, Sq, Skv, q_segment_ids, kv_segment_ids, q_index, kv_index)
    return ring_attention_forward(q, k, v, ids, Ring(axes_tuple(axis_name), axis_size),
                                  Kernel("xla", q_block_size, kv_block_size))[0]


def metp_attention_autodiff(x, seg, pos, w, spec, ring: Ring, fetch_group=broadcast):
    """`metp_attention` differentiated by autodiff through its rings."""
    return attention_forward(x, seg, pos, w, spec, ring, fetch_group)[0]


def broadcast_ring(own, src, ring: Ring):
    """Device `src`'s block on every device by p - 1 ring hops, hop h reaching device src + h
    (every device forwards what it holds; only the next one in line keeps it): the alternative
    to `sharding.ops.metp.broadcast`'s masked psum."""
    dist = (jax.lax.axis_index(ring.axis) - src) % ring.size
    buf = own
    for h in range(1, ring.size):
        got = shift(buf, ring)
        buf = jax.tree.map(lambda g, b: jnp.where(dist == h, g, b), got, buf)
    return buf


def metp_mlp_autodiff(x, w_in, w_out, spec, ring: Ring):
    """`metp_mlp` differentiated by autodiff through its ring."""
    return mlp_ring_forward(x, w_in, w_out, spec, ring)


def combine_partials(out1, lse1, out2, lse2):
    """Merge two normalised partial attentions over disjoint key sets: (out_i [B, Sq, H, D],
    lse_i [B, Sq, H]) -> float32 (out, lse) as if attending to the union (lse = -inf: no keys)."""
    lse = jnp.logaddexp(lse1, lse2)
    ref = jnp.where(jnp.isfinite(lse), lse, 0.0)
    w1 = jnp.exp(lse1 - ref)[..., None]
    w2 = jnp.exp(lse2 - ref)[..., None]
    return w1 * out1.astype(_F32) + w2 * out2.astype(_F32), lse
