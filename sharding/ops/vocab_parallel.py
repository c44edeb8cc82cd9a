"""Vocabulary-parallel embedding lookup and cross-entropy (Megatron style), for use inside
`shard_map`: each device holds a contiguous [V/p] slice of the vocabulary along `axis`."""
from __future__ import annotations

import jax
import jax.numpy as jnp


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
