"""METP kernels: O = f(A B) C with weight and K/V blocks passed around a ring (FITEE 2025).

Per-device functions for use inside `jax.shard_map`. The model-parallel group (`Ring.axis`, p
devices) splits the sequence: device r holds tokens [r*c, (r+1)*c) of each row, c = S/p, and
its storage block of every weight (a head group / a block of MLP columns). No device ever
holds a gathered activation or a full weight matrix; only blocks move.

Schedules (double buffered: the block used at step t+1 is sent before step t computes):
  * MLP: for t < p: z += act(x W_in,j) W_out,j with j = r - t; the (W_in,j, W_out,j) blocks
    travel the ring.
  * Attention: for each head group j (every device on the same group): group j's weights
    (query heads, their K/V heads, output rows) are broadcast from device j, q/k/v are projected for the chunk, an inner ring passes the
    K/V blocks (with their segment ids and token indices) through an online softmax, and
    o_j W_o,j accumulates into the output.
Backward by hand (`jax.custom_vjp`; autodiff through a scan of ring steps would keep every
visiting block): the blocks travel again, each block's gradient travels one step behind it,
accumulating, and arrives home after the last hop; MLP activations and q/k/v are recomputed.
Head-group weight gradients are reduced to their owner with one block-sized psum per group.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax

from sharding.ops import blocks
from sharding.ops.blocks import BlockSpec
from sharding.ops.ordering import after, tie_leaves
from sharding.ops.online_softmax import _tie, _varying_axes, attend_block, block_grads, compute_delta, finish, init_carry

_F32 = jnp.float32
BROADCASTS = ("psum", "ring")


@dataclass(frozen=True)
class Ring:
    """The model-parallel group a kernel runs over: mesh axes (a tuple), their size p, and the
    batch axes (weights are replicated over these, so their gradients are summed over them)."""

    axis: tuple[str, ...]
    size: int
    batch_axes: tuple[str, ...] = ()

    @property
    def all_axes(self) -> tuple[str, ...]:
        return self.axis + self.batch_axes


# --------------------------------------------------------------------------------------------
# Ring schedule
# --------------------------------------------------------------------------------------------
def _varying(tree, *like):
    """Cast fresh values to vary over every mesh axis the arrays in `like` vary over
    (scan carries must keep one type under `shard_map(check_vma=True)`)."""
    axes = set()
    for x in jax.tree.leaves(like):
        axes |= set(getattr(getattr(jax.typeof(x), "manual_axis_type", None), "varying", ()) or ())

    def one(x):
        have = set(getattr(getattr(jax.typeof(x), "manual_axis_type", None), "varying", ()) or ())
        missing = tuple(sorted(axes - have))
        return lax.pcast(x, missing, to="varying") if missing else x

    return jax.tree.map(one, tree)


def _zeros(x, *like):
    return _varying(jnp.zeros(x.shape, _F32), x, *like)


def _add(a, b):
    return jax.tree.map(jnp.add, a, b)


def shift(tree, ring: Ring):
    """Send every block one device along the ring (r -> r + 1)."""
    p = ring.size
    return lax.ppermute(tree, ring.axis, perm=[(i, (i + 1) % p) for i in range(p)])


def pipeline(n: int, first, fetch, compute, state):
    """state = compute(t, block_t, state) for t < n, where block_{t+1} = fetch(t, block_t) is
    issued before compute(t) (so its transfer overlaps it) and nothing is fetched after the last.
    On XLA:CPU compute(t) waits for the fetch (`sharding.ops.ordering`)."""
    def step(carry, t):
        block, state = carry
        upcoming, block = tie_leaves(fetch(t, block), block)
        return (upcoming, compute(t, block, state)), None

    (block, state), _ = lax.scan(step, (first, state), jnp.arange(n - 1))
    return compute(n - 1, block, state)


def ring_forward(ring: Ring, compute, block, state):
    """state = compute(block, state) for the p blocks of the ring, each held in turn."""
    return pipeline(ring.size, block, lambda t, b: shift(b, ring), lambda t, b, s: compute(b, s), state)


def ring_backward(ring: Ring, compute, block, state):
    """(state, grad) = compute(block, state) for the p blocks of the ring; each block's gradient
    follows one step behind it, accumulating, and is returned to the block's home device."""
    if ring.size == 1:
        return compute(block, state)
    upcoming = shift(block, ring)
    state, grad = compute(block, state)

    def step(carry, _):
        block, grad, state = carry
        upcoming, grad = shift((block, grad), ring)  # next block; this block's grad so far (one collective)
        state, g = compute(block, state)
        return (upcoming, _add(grad, g), state), None

    (block, grad, state), _ = lax.scan(step, (upcoming, grad, state), None, length=ring.size - 2)
    grad = shift(grad, ring)
    state, g = compute(block, state)
    return state, shift(_add(grad, g), ring)  # the last hop: home


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
    w = _varying((w_in, w_out), x)

    def compute(w, dx):
        _, vjp = jax.vjp(partial(_mlp_part, spec), x, w)  # recomputes act(x W_in,j)
        dx_t, dw = vjp(dz)
        return dx + dx_t.astype(_F32), jax.tree.map(lambda g: g.astype(_F32), dw)

    dx, (dw_in, dw_out) = ring_backward(ring, compute, w, _zeros(x))
    if ring.batch_axes:
        dw_in, dw_out = lax.psum((dw_in, dw_out), ring.batch_axes)
    dx = after(dx, (dw_in, dw_out))  # the attention's backward collectives after the blocks' last hop
    return dx.astype(x.dtype), dw_in.astype(w_in.dtype), dw_out.astype(w_out.dtype)


metp_mlp.defvjp(_metp_mlp_fwd, _metp_mlp_bwd)


# --------------------------------------------------------------------------------------------
# Inner ring: K/V blocks travel through an online softmax
# --------------------------------------------------------------------------------------------
def chunk_index(shape, ring: Ring):
    """Absolute token indices [B, c] of this device's chunk: r*c ... (r+1)*c - 1."""
    c = shape[1]
    r = lax.axis_index(ring.axis)
    return jnp.broadcast_to(r * c + jnp.arange(c, dtype=jnp.int32), shape)


def ring_attention_forward(q, k, v, seg, idx, ring: Ring, tile: Optional[int]):
    """(out, lse) of causal, segment-masked attention of this chunk's q [B, c, H, K] over all
    chunks' K/V, which travel the ring with their segment ids and token indices."""
    def attend(kv, carry):
        kb, vb, kseg, kidx = kv
        return attend_block(carry, q, kb, vb, q_segment_ids=seg, kv_segment_ids=kseg, q_index=idx,
                            kv_index=kidx, q_block_size=tile, kv_block_size=tile)

    carry = ring_forward(ring, attend, (k, v, seg, idx), _varying(init_carry(q), q, k))
    return finish(carry, dtype=q.dtype)


def ring_attention_backward(q, k, v, seg, idx, out, lse, dout, ring: Ring, tile: Optional[int]):
    """float32 (dq, dk, dv): the K/V ring again, dK/dV travelling with their blocks."""
    delta = compute_delta(out, dout)
    # the ids' ring hops depend on dout: not hoisted out of the layer loop, where nothing orders
    # them with the other collectives (sharding.ops.ordering)
    seg, idx = _tie((seg, idx), dout, _varying_axes(dout, seg, idx))

    def grads(kv, dq):
        kb, vb, kseg, kidx = kv
        dq_t, dk, dv = block_grads(q, kb, vb, lse, dout, delta, q_segment_ids=seg, kv_segment_ids=kseg,
                                   q_index=idx, kv_index=kidx, q_block_size=tile, kv_block_size=tile)
        return dq + dq_t, (dk, dv)

    dq, (dk, dv) = ring_backward(ring, grads, (k, v, seg, idx), _zeros(q, k))
    return dq, dk, dv


@partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def ring_attention(q, k, v, seg, idx, ring: Ring, tile: Optional[int] = None):
    """Attention output for this chunk's queries over the whole ring (hand-written backward)."""
    return ring_attention_forward(q, k, v, seg, idx, ring, tile)[0]


def _ring_attention_fwd(q, k, v, seg, idx, ring, tile):
    out, lse = ring_attention_forward(q, k, v, seg, idx, ring, tile)
    return out, (q, k, v, seg, idx, out, lse)


def _ring_attention_bwd(ring, tile, res, dout):
    q, k, v, seg, idx, out, lse = res
    dq, dk, dv = ring_attention_backward(q, k, v, seg, idx, out, lse, dout, ring, tile)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None


ring_attention.defvjp(_ring_attention_fwd, _ring_attention_bwd)


# --------------------------------------------------------------------------------------------
# Head-group weights: from their owner to every device
# --------------------------------------------------------------------------------------------
def broadcast_psum(own, src, ring: Ring):
    """Device `src`'s block on every device: a masked psum (one block-sized all-reduce)."""
    mine = lax.axis_index(ring.axis) == src
    return lax.psum(jax.tree.map(lambda w: jnp.where(mine, w, jnp.zeros_like(w)), own), ring.axis)


def broadcast_ring(own, src, ring: Ring):
    """Device `src`'s block on every device: p - 1 ring hops, hop h reaching device src + h
    (every device forwards what it holds; only the next one in line keeps it)."""
    dist = (lax.axis_index(ring.axis) - src) % ring.size
    buf = own
    for h in range(1, ring.size):
        got = shift(buf, ring)
        buf = jax.tree.map(lambda g, b: jnp.where(dist == h, g, b), got, buf)
    return buf


_BROADCAST = {"psum": broadcast_psum, "ring": broadcast_ring}


# --------------------------------------------------------------------------------------------
# METP attention sub-layer
# --------------------------------------------------------------------------------------------
def _qkv(spec: BlockSpec, pos, x, w):
    return blocks.qkv_projection(w, x, pos, spec)


def _projections(w):
    return {"wq": w["wq"], "wkv": w["wkv"]}


def attention_forward(x, seg, pos, w, spec: BlockSpec, ring: Ring, broadcast: str = "psum"):
    """(out [B, c, D], o per group [p, B, c, H/p, K], lse per group [p, B, c, H/p]) of the
    attention sub-layer for this device's chunk x; w (`blocks.attention_weights`: wq
    [D, H/p, K], wkv [D, 2, G/p, K], wo [H/p, K, D]) is its head group. K/V blocks are
    processed in `spec.attention_block` tiles, fully masked tiles (the causal future, other
    documents) skipped. Plain JAX (autodiff through it keeps every visiting block)."""
    bcast = partial(_BROADCAST[broadcast], w, ring=ring)
    idx = chunk_index(seg.shape, ring)
    p, (B, c, D), (hg, kd) = ring.size, x.shape, w["wq"].shape[1:]

    def group(j, wj, state):
        out, o_all, lse_all = state
        q, k, v = _qkv(spec, pos, x, wj)
        o, lse = ring_attention_forward(q, k, v, seg, idx, ring, spec.attention_block)
        out = out + blocks.output_projection(o, wj["wo"]).astype(_F32)
        return (out, lax.dynamic_update_index_in_dim(o_all, o, j, 0),
                lax.dynamic_update_index_in_dim(lse_all, lse, j, 0))

    state = _varying((jnp.zeros((B, c, D), _F32), jnp.zeros((p, B, c, hg, kd), x.dtype),
                      jnp.zeros((p, B, c, hg), _F32)), x, w)
    out, o_all, lse_all = pipeline(p, bcast(0), lambda j, _: bcast(j + 1), group, state)
    return out.astype(x.dtype), o_all, lse_all


@partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def metp_attention(x, seg, pos, w, spec: BlockSpec, ring: Ring, broadcast: str = "psum"):
    """METP attention sub-layer on this device's chunk, with a hand-written backward."""
    return attention_forward(x, seg, pos, w, spec, ring, broadcast)[0]


def _metp_attention_fwd(x, seg, pos, w, spec, ring, broadcast):
    out, o_all, lse_all = attention_forward(x, seg, pos, w, spec, ring, broadcast)
    return out, (x, seg, pos, w, o_all, lse_all)


def _metp_attention_bwd(spec, ring, broadcast, res, dout):
    x, seg, pos, w, o_all, lse_all = res
    bcast = partial(_BROADCAST[broadcast], w, ring=ring)
    idx = chunk_index(seg.shape, ring)
    home = lax.axis_index(ring.axis)

    def group(j, wj, state):
        dx, dw = state
        wj = _varying(wj, x)  # local partial weight gradients; reduced explicitly below
        (q, k, v), proj_vjp = jax.vjp(partial(_qkv, spec, pos), x, _projections(wj))  # recompute q, k, v
        o, lse = o_all[j], lse_all[j]
        do = jnp.einsum("bsd,hkd->bshk", dout, wj["wo"].astype(dout.dtype))
        dwo_part = jnp.einsum("bshk,bsd->hkd", o, dout, preferred_element_type=_F32)
        dq, dk, dv = ring_attention_backward(q, k, v, seg, idx, o, lse, do, ring, spec.attention_block)
        dx_t, dproj = proj_vjp((dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)))
        parts = {**jax.tree.map(lambda g: g.astype(_F32), dproj), "wo": dwo_part}
        dwj = lax.psum(parts, ring.all_axes)  # to the owner
        mine = home == j
        return dx + dx_t.astype(_F32), jax.tree.map(lambda new, old: jnp.where(mine, new, old), dwj, dw)

    state = (_zeros(x), jax.tree.map(lambda t: _zeros(t), w))
    dx, dw = pipeline(ring.size, bcast(0), lambda j, _: bcast(j + 1), group, state)
    return dx.astype(x.dtype), None, None, jax.tree.map(lambda g, t: g.astype(t.dtype), dw, w)


metp_attention.defvjp(_metp_attention_fwd, _metp_attention_bwd)


def metp_attention_autodiff(x, seg, pos, w, spec: BlockSpec, ring: Ring, broadcast: str = "psum"):
    """The same forward differentiated by JAX autodiff (for memory comparisons only)."""
    return attention_forward(x, seg, pos, w, spec, ring, broadcast)[0]


__all__ = ["BROADCASTS", "Ring", "attention_forward", "broadcast_psum", "broadcast_ring", "chunk_index",
           "metp_attention", "metp_attention_autodiff", "metp_mlp", "mlp_ring_forward", "pipeline",
           "ring_attention", "ring_attention_backward", "ring_attention_forward", "ring_backward",
           "ring_forward", "shift"]
