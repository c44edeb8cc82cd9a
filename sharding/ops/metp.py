"""METP kernels: O = f(A B) C with weight and K/V blocks passed around a ring (FITEE 2025).

Per-device functions for use inside `jax.shard_map`. The model-parallel group (`Ring.axis`, p
devices) splits the sequence: device r holds tokens [r*c, (r+1)*c) of each row, c = S/p, and
its storage block of every weight (a head group / a block of MLP columns). No device ever
holds a gathered activation or a full weight matrix; only blocks move.

Schedules on the one ring (`sharding.ops.ring`; double buffered: the block used at step t+1 is
sent before step t computes):
  * MLP: for t < p: z += act(x W_in,j) W_out,j with j = r - t; the (W_in,j, W_out,j) blocks
    travel the ring.
  * Attention: for each head group j (every device on the same group): group j's weights
    (query heads, their K/V heads, output rows) are broadcast from device j, q/k/v are
    projected for the chunk, ring attention (`sharding.ops.ring_attention`) passes the K/V
    blocks around, and o_j W_o,j accumulates into the output.
Backward by hand (`jax.custom_vjp`; autodiff through a scan of ring steps would keep every
visiting block): the blocks travel again, each block's gradient one hop behind it, accumulating,
home after the last hop; MLP activations and q/k/v are recomputed. Head-group weight gradients
are reduced to their owner with one block-sized psum per group.
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax

from sharding.ops import blocks
from sharding.ops.blocks import BlockSpec
from sharding.ops.ring import Ring, pipeline, ring_backward, ring_forward
from sharding.ops.ring_attention import chunk_index, ring_attention_backward, ring_attention_forward
from sharding.ops.varying import vary_like
from sharding.remat import keep

_F32 = jnp.float32


def _zeros(x, *like):
    return vary_like(jnp.zeros(x.shape, _F32), x, *like)


# --------------------------------------------------------------------------------------------
# MLP: weight blocks travel
# --------------------------------------------------------------------------------------------
def _mlp_part(spec: BlockSpec, x, w):
    return blocks.mlp_block(w[0], w[1], x, spec)


def mlp_ring_forward(x, w_in, w_out, spec: BlockSpec, ring: Ring):
    """sum_j act(x W_in,j) W_out,j over the group's weight blocks; x [B, c, D] is this device's
    chunk, (w_in [D, G, F/p], w_out [F/p, D]) its block. Plain JAX (autodiff would keep blocks)."""
    acc = ring_forward(ring, lambda w, acc: acc + _mlp_part(spec, x, w).astype(_F32),
                       (w_in, w_out), _zeros(x, w_in))
    return acc.astype(x.dtype)


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def metp_mlp(x, w_in, w_out, spec: BlockSpec, ring: Ring):
    """METP MLP sub-layer on this device's chunk, with a hand-written ring backward."""
    return mlp_ring_forward(x, w_in, w_out, spec, ring)


def _metp_mlp_fwd(x, w_in, w_out, spec, ring):
    return mlp_ring_forward(x, w_in, w_out, spec, ring), (x, w_in, w_out)


def _metp_mlp_bwd(spec, ring, res, dz):
    x, w_in, w_out = res
    # Local partial gradients (no implicit psum over the batch axes in the vjp): one psum at the end.
    w = vary_like((w_in, w_out), x)

    def compute(w, dx):
        _, vjp = jax.vjp(partial(_mlp_part, spec), x, w)  # recomputes act(x W_in,j)
        dx_t, dw = vjp(dz)
        return dx + dx_t.astype(_F32), jax.tree.map(lambda g: g.astype(_F32), dw)

    dx, (dw_in, dw_out) = ring_backward(ring, compute, w, _zeros(x), grad_with_block=True)
    if ring.batch_axes:
        dw_in, dw_out = lax.psum((dw_in, dw_out), ring.batch_axes)
    dx = ring.order.after(dx, (dw_in, dw_out))  # the attention's backward collectives after the blocks' last hop
    return dx.astype(x.dtype), dw_in.astype(w_in.dtype), dw_out.astype(w_out.dtype)


metp_mlp.defvjp(_metp_mlp_fwd, _metp_mlp_bwd)


# --------------------------------------------------------------------------------------------
# Attention: head groups in turn, each running ring attention over the K/V blocks
# --------------------------------------------------------------------------------------------
def broadcast(own, src, ring: Ring):
    """Device `src`'s block on every device: a masked psum (one block-sized all-reduce)."""
    mine = lax.axis_index(ring.axis) == src
    return lax.psum(jax.tree.map(lambda w: jnp.where(mine, w, jnp.zeros_like(w)), own), ring.axis)


def _qkv(spec: BlockSpec, pos, x, w):
    return blocks.qkv_projection(w, x, pos, spec)


def _projections(w):
    return {"wq": w["wq"], "wkv": w["wkv"]}


def _chunk_ids(seg, ring: Ring):
    """(q_seg, kv_seg, q_idx, kv_idx) of this device's chunk for ring attention."""
    idx = chunk_index(seg.shape[0], seg.shape[1], ring.axis)
    return seg, seg, idx, idx


def attention_forward(x, seg, pos, w, spec: BlockSpec, ring: Ring, fetch_group=broadcast):
    """(out [B, c, D], o per group [p, B, c, H/p, K], lse per group [p, B, c, H/p]) of the
    attention sub-layer for this device's chunk x; w (`blocks.attention_weights`: wq
    [D, H/p, K], wkv [D, 2, G/p, K], wo [H/p, K, D]) is its head group, and
    fetch_group(w, j, ring) puts group j's weights on every device. Each visiting K/V block is
    attended by the spec's local kernel (`blocks.attention_kernel`), which skips the tiles with
    no allowed pair (the causal future, other documents). Differentiable by autodiff too (which
    keeps every visiting block)."""
    ids, kernel = _chunk_ids(seg, ring), blocks.attention_kernel(spec)
    p, (B, c, D), (hg, kd) = ring.size, x.shape, w["wq"].shape[1:]

    def group(j, wj, state):
        out, o_all, lse_all = state
        q, k, v = _qkv(spec, pos, x, wj)
        o, lse = ring_attention_forward(q, k, v, ids, ring, kernel)
        out = out + blocks.output_projection(o, wj["wo"]).astype(_F32)
        return (out, lax.dynamic_update_index_in_dim(o_all, o, j, 0),
                lax.dynamic_update_index_in_dim(lse_all, lse, j, 0))

    state = vary_like((jnp.zeros((B, c, D), _F32), jnp.zeros((p, B, c, hg, kd), x.dtype),
                       jnp.zeros((p, B, c, hg), _F32)), x, w)
    out, o_all, lse_all = pipeline(p, fetch_group(w, 0, ring), lambda j, _: fetch_group(w, j + 1, ring), group,
                                   state, ring.order)
    return out.astype(x.dtype), o_all, lse_all


@partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def metp_attention(x, seg, pos, w, spec: BlockSpec, ring: Ring):
    """METP attention sub-layer on this device's chunk, with a hand-written backward."""
    return attention_forward(x, seg, pos, w, spec, ring)[0]


def _metp_attention_fwd(x, seg, pos, w, spec, ring):
    out, o_all, lse_all = attention_forward(x, seg, pos, w, spec, ring)
    o_all, lse_all = keep((o_all, lse_all))  # x and w (the normed input, cast weights) are cheap to redo
    return out, (x, seg, pos, w, o_all, lse_all)


def _metp_attention_bwd(spec, ring, res, dout):
    x, seg, pos, w, o_all, lse_all = res
    ids, kernel = _chunk_ids(seg, ring), blocks.attention_kernel(spec)
    home = lax.axis_index(ring.axis)

    def group(j, wj, state):
        dx, dw = state
        wj = vary_like(wj, x)  # local partial weight gradients; reduced explicitly below
        (q, k, v), proj_vjp = jax.vjp(partial(_qkv, spec, pos), x, _projections(wj))  # recompute q, k, v
        o, lse = o_all[j], lse_all[j]
        do = jnp.einsum("bsd,hkd->bshk", dout, wj["wo"].astype(dout.dtype))
        dwo_part = jnp.einsum("bshk,bsd->hkd", o, dout, preferred_element_type=_F32)
        dq, dk, dv = ring_attention_backward(q, k, v, ids, o, lse, do, ring, kernel, nested=True)
        dx_t, dproj = proj_vjp((dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)))
        parts = {**jax.tree.map(lambda g: g.astype(_F32), dproj), "wo": dwo_part}
        dwj = lax.psum(parts, ring.all_axes)  # to the owner
        mine = home == j
        return dx + dx_t.astype(_F32), jax.tree.map(lambda new, old: jnp.where(mine, new, old), dwj, dw)

    state = (_zeros(x), jax.tree.map(lambda t: _zeros(t), w))
    dx, dw = pipeline(ring.size, broadcast(w, 0, ring), lambda j, _: broadcast(w, j + 1, ring), group, state,
                      ring.order)
    return dx.astype(x.dtype), None, None, jax.tree.map(lambda g, t: g.astype(t.dtype), dw, w)


metp_attention.defvjp(_metp_attention_fwd, _metp_attention_bwd)


__all__ = ["attention_forward", "broadcast", "metp_attention", "metp_mlp", "mlp_ring_forward"]
