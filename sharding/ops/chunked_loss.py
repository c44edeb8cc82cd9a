"""Cross-entropy of X·W over chunks of tokens: the [tokens, vocab] logits never exist whole.

Per-device functions for use inside `jax.shard_map` (or outside, with no axes). Each returns
(sum of masked token NLLs, number of loss tokens) for the tokens x [..., D] it is given.

    chunked_nll_sums(x, head, targets, mask, chunk, vocab_axes=())
        the head [D, V] whole here, or split by vocabulary columns over `vocab_axes` (Megatron's
        vocabulary-parallel loss: devices on those axes hold the same tokens); the backward
        recomputes each chunk's logits (`jax.checkpoint` per chunk).
    ring_nll_sums(x, head_block, targets, mask, chunk, ring)
        the head split by vocabulary columns over the ring's devices, each holding its own
        tokens: the head's blocks travel the ring (the METP pattern, loss = f(X W)) while every
        device keeps an online log-sum-exp and target logit for its tokens; the backward sends
        the blocks round again, each block's gradient one hop behind it and home after the last
        hop. Per-device head bytes stay at V·D/p; the loss transient is one chunk's logits for
        one block, whatever the sequence length.

The embedding lookup on the same ring is `sharding.ops.vocab_parallel.ring_embed`.

`chunk` is tokens per chunk (<= 0: all of this device's tokens at once).
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax

from sharding.ops.ring import Ring, ring_backward, ring_forward
from sharding.ops.varying import vary_like
from sharding.ops.vocab_parallel import block_index, vocab_parallel_nll

_F32 = jnp.float32


def _chunks(chunk: int, x, *tokens):
    """x [..., D] and token arrays [...] flattened and padded to [n, c, D] / [n, c] (padding masked)."""
    d = x.shape[-1]
    x = x.reshape(-1, d)
    t = x.shape[0]
    c = t if chunk <= 0 else min(chunk, t)
    pad = -t % c
    flat = [a.reshape(-1) for a in tokens]
    if pad:
        x = jnp.pad(x, ((0, pad), (0, 0)))
        flat = [jnp.pad(a, (0, pad)) for a in flat]
    n = (t + pad) // c
    return x.reshape(n, c, d), *(a.reshape(n, c) for a in flat)


def _local_nll(x, head, targets):
    logits = jnp.einsum("td,dv->tv", x, head.astype(x.dtype), preferred_element_type=_F32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    return lse - jnp.take_along_axis(logits, targets[:, None], axis=-1)[:, 0]


def chunked_nll_sums(x, head, targets, mask, chunk: int, vocab_axes: tuple[str, ...] = ()):
    """(sum of masked NLLs, loss tokens) of x [..., D] against the head, `chunk` tokens at a
    time; vocabulary-parallel over `vocab_axes` when given (head [D, V/p] here)."""
    mask = mask.astype(_F32)
    xs, ts, ms = _chunks(chunk, x, targets, mask)
    nll = partial(vocab_parallel_nll, axis=vocab_axes) if vocab_axes else _local_nll

    @jax.checkpoint
    def one(head, xc, tc, mc):
        return jnp.sum(nll(xc, head, tc) * mc)

    return jnp.sum(lax.map(lambda item: one(head, *item), (xs, ts, ms))), jnp.sum(mask)


# --------------------------------------------------------------------------------------------
# The head's vocabulary blocks travel a ring
# --------------------------------------------------------------------------------------------
def _block_logits(xc, w):
    return jnp.einsum("td,dv->tv", xc, w.astype(xc.dtype), preferred_element_type=_F32)


def _ring_stats(xs, ts, block_pair, ring: Ring):
    """Online (max, sum of exponentials, target logit) [n, c] of every token over the ring's blocks."""
    width = block_pair[0].shape[-1]

    def visit(block, stats):
        w, home = block

        def chunk(_, item):
            xc, tc, m, s, tl = item
            logits = _block_logits(xc, w)
            m_new = jnp.maximum(m, jnp.max(logits, axis=-1))
            s = s * jnp.exp(m - m_new) + jnp.sum(jnp.exp(logits - m_new[:, None]), axis=-1)
            local = block_index(tc, home, width)
            picked = jnp.take_along_axis(logits, jnp.maximum(local, 0)[:, None], axis=-1)[:, 0]
            return None, (m_new, s, tl + jnp.where(local >= 0, picked, 0.0))

        return lax.scan(chunk, None, (xs, ts, *stats))[1]

    shape = ts.shape
    stats = vary_like((jnp.full(shape, -jnp.inf, _F32), jnp.zeros(shape, _F32), jnp.zeros(shape, _F32)),
                      xs, block_pair[0])
    return ring_forward(ring, visit, block_pair, stats)


def _ring_lse(xs, ts, head_block, ring):
    home = lax.axis_index(ring.axis)
    m, s, tl = _ring_stats(xs, ts, (head_block, home), ring)
    return m + jnp.log(s), tl


@partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _ring_sum(xs, head_block, ts, ms, chunk, ring):
    lse, tl = _ring_lse(xs, ts, head_block, ring)
    return jnp.sum((lse - tl) * ms)


def _ring_sum_fwd(xs, head_block, ts, ms, chunk, ring):
    lse, tl = _ring_lse(xs, ts, head_block, ring)
    return jnp.sum((lse - tl) * ms), (xs, head_block, ts, ms, lse)


def _ring_sum_bwd(chunk, ring, res, g):
    xs, head_block, ts, ms, lse = res
    width = head_block.shape[-1]
    gs = ms * g  # d loss / d nll per token

    def visit(block, dx):
        w, home = block

        def chunk_grad(dw, item):
            xc, tc, lc, gc = item
            p = jnp.exp(_block_logits(xc, w) - lc[:, None])
            local = block_index(tc, home, width)
            dlogits = (p - (jnp.arange(width)[None, :] == local[:, None])) * gc[:, None]
            dxc = jnp.einsum("tv,dv->td", dlogits, w.astype(_F32))
            return dw + jnp.einsum("td,tv->dv", xc.astype(_F32), dlogits), dxc

        dw, dxs = lax.scan(chunk_grad, vary_like(jnp.zeros(w.shape, _F32), xs, w), (xs, ts, lse, gs))
        return dx + dxs, dw

    home = lax.axis_index(ring.axis)
    dx0 = vary_like(jnp.zeros(xs.shape, _F32), xs, head_block)
    dx, dw = ring_backward(ring, visit, (vary_like(head_block, xs), home), dx0)
    return dx.astype(xs.dtype), dw.astype(head_block.dtype), None, None


_ring_sum.defvjp(_ring_sum_fwd, _ring_sum_bwd)


def ring_nll_sums(x, head_block, targets, mask, chunk: int, ring: Ring):
    """(sum of masked NLLs, loss tokens) of this device's tokens x [..., D]; head_block
    [D, V/p] is the ring position's block of vocabulary columns (device r holds columns
    [r V/p, (r+1) V/p))."""
    mask = mask.astype(_F32)
    xs, ts, ms = _chunks(chunk, x, targets, mask)
    return _ring_sum(xs, head_block, ts, ms, chunk, ring), jnp.sum(mask)


__all__ = ["chunked_nll_sums", "ring_nll_sums"]
