"""Vocabulary-split embedding lookup and cross-entropy, for use inside `shard_map`: each device
holds a contiguous [V/p] slice of the vocabulary along `axis`. Megatron style (the devices of
`axis` hold the same tokens: partial results summed), and `ring_embed` (each device holds its
own tokens: the table's blocks travel a ring)."""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax

from sharding.ops.ring import Ring, ring_backward, ring_forward
from sharding.ops.varying import vary_like

_F32 = jnp.float32


def block_index(ids, home, width: int):
    """Index of each id inside the block of `width` vocabulary entries owned by ring position
    `home` (entries [home * width, (home + 1) * width)), -1 where it lies outside."""
    local = ids - home * width
    return jnp.where((local >= 0) & (local < width), local, -1)


def _slice_start(axis, vocab_local: int):
    return jax.lax.axis_index(axis) * vocab_local


def vocab_parallel_embed_partial(table_local, tokens, axis):
    """This device's share of the embeddings [.., D] of `tokens` (zero for ids it does not hold),
    from a table split over `axis` by rows ([V/p, D] here); summing over `axis` gives the lookup."""
    n = table_local.shape[0]
    local = tokens - _slice_start(axis, n)
    mine = (local >= 0) & (local < n)
    rows = jnp.take(table_local, jnp.where(mine, local, 0), axis=0)
    return jnp.where(mine[..., None], rows, jnp.zeros_like(rows))


def vocab_parallel_nll(x, head_local, targets, axis):
    """Per-token NLL [...] with the [D, V] head split over `axis` by columns ([D, V/p] here).

    The softmax statistics (max, sum of exponentials, target logit) are combined with one
    pmax and two psums; no device holds logits for the whole vocabulary.
    """
    logits = jnp.einsum("...d,dv->...v", x, head_local.astype(x.dtype), preferred_element_type=jnp.float32)
    n = logits.shape[-1]
    local = targets - _slice_start(axis, n)
    mine = (local >= 0) & (local < n)
    # the max only shifts the exponent; any value gives the same loss and gradient
    m = jax.lax.pmax(jax.lax.stop_gradient(jnp.max(logits, axis=-1)), axis)
    sum_exp = jax.lax.psum(jnp.sum(jnp.exp(logits - m[..., None]), axis=-1), axis)
    picked = jnp.take_along_axis(logits, jnp.where(mine, local, 0)[..., None], axis=-1)[..., 0]
    target_logit = jax.lax.psum(jnp.where(mine, picked, 0.0), axis)
    return jnp.log(sum_exp) + m - target_logit


# --------------------------------------------------------------------------------------------
# The embedding lookup on a ring of devices (each holding its own tokens)
# --------------------------------------------------------------------------------------------
def _lookup(table_block, home, tokens):
    """Rows of `tokens` held by the block of vocabulary rows owned by `home` (zero elsewhere)."""
    local = block_index(tokens, home, table_block.shape[0])
    rows = jnp.take(table_block, jnp.maximum(local, 0), axis=0)
    return jnp.where((local >= 0)[..., None], rows, jnp.zeros_like(rows))


def _ring_embed_forward(table_block, tokens, ring):
    home = lax.axis_index(ring.axis)
    out = vary_like(jnp.zeros((*tokens.shape, table_block.shape[1]), table_block.dtype), tokens, table_block)
    return ring_forward(ring, lambda block, out: out + _lookup(*block, tokens), (table_block, home), out)


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def ring_embed(table_block, tokens, ring: Ring):
    """Embeddings [..., D] of this device's `tokens` from a [V, D] table split by vocabulary rows
    over the ring's devices (device r holds rows [r V/p, (r+1) V/p)): the table's blocks travel
    the ring and each device picks its tokens' rows; the backward sends them round again, each
    block's gradient (its rows' scattered cotangents) one hop behind it. No device holds the
    whole table or its whole gradient."""
    return _ring_embed_forward(table_block, tokens, ring)


def _ring_embed_fwd(table_block, tokens, ring):
    return _ring_embed_forward(table_block, tokens, ring), (table_block, tokens)


def _ring_embed_bwd(ring, res, g):
    table_block, tokens = res
    rows = table_block.shape[0]

    def visit(block, state):
        _, home = block
        local = block_index(tokens, home, rows)
        picked = jnp.where((local >= 0)[..., None], g, jnp.zeros_like(g)).reshape(-1, g.shape[-1])
        grad = jnp.zeros(table_block.shape, _F32).at[jnp.maximum(local, 0).reshape(-1)].add(picked.astype(_F32))
        return state, vary_like(grad, g, table_block)

    home = lax.axis_index(ring.axis)
    _, grad = ring_backward(ring, visit, (vary_like(table_block, g), home), vary_like(jnp.zeros((), _F32), g))
    return grad.astype(table_block.dtype), None


ring_embed.defvjp(_ring_embed_fwd, _ring_embed_bwd)
