"""Flash attention as a Pallas kernel (GPU through Triton; CPU in Pallas's interpret mode, for tests).

The same semantics as the XLA kernel (`sharding.ops.flash`): q [B, Sq, H, D], k, v [B, Skv, G, D]
(G dividing H), masks from segment ids (0 = padding) and absolute indices (kv_index <= q_index
when causal), so one kernel serves a whole row and a ring's visiting block alike. It returns
the output and its log-sum-exp; the backward takes the log-sum-exp and
delta = rowsum(dout * out) - dlse and recomputes the probabilities.

Grids: forward and dQ over (query block, batch row, query head), each looping over the key
blocks; dK / dV over (key block, batch row, query head), looping over the query blocks (the
query heads that share a K/V head are summed afterwards). A block pair with no allowed pair is
skipped with a `lax.cond` inside the loop. Lengths are padded to the block size (segment id 0).
On a GPU, Triton needs head_dim and the blocks to be powers of two of at least 16
(`unserved` says when a case does not fit).
"""
from __future__ import annotations

import functools
from functools import partial
from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton
from jax.sharding import ManualAxisType

from sharding.ops.varying import vary, varying_axes

_F32 = jnp.float32
BLOCK = 64


def unserved(head_dim: int, platform: str) -> Optional[str]:
    """Why the kernel cannot run here (None when it can)."""
    if platform == "cpu":
        return None  # interpret mode
    if platform != "gpu":
        return f"the Pallas attention kernel runs on GPUs (and interpreted on CPU), not on {platform}"
    if head_dim < 16 or head_dim & (head_dim - 1):
        return f"the Pallas attention kernel needs a head_dim that is a power of two >= 16, got {head_dim}"
    return None


def _mask(qs, qi, ks, ki, causal: bool):
    m = (qs[:, None] == ks[None, :]) & (qs[:, None] != 0)
    if causal:
        m = m & (ki[None, :] <= qi[:, None])
    return m


def _any(mask):
    return jnp.max(mask.astype(jnp.int32)) > 0


def _dot(a, b, trans_b: bool = False):
    return pltriton.dot(a, b, trans_b=trans_b).astype(_F32)


def _forward_kernel(q_ref, k_ref, v_ref, qs_ref, qi_ref, ks_ref, ki_ref, o_ref, lse_ref, *, scale, causal, bk):
    q = q_ref[...]
    qs, qi = qs_ref[...], qi_ref[...]
    bq, d = q.shape

    def body(j, carry):
        sl = pl.ds(j * bk, bk)
        mask = _mask(qs, qi, ks_ref[sl], ki_ref[sl], causal)

        def compute(carry):
            o, m, l = carry
            s = jnp.where(mask, _dot(q, k_ref[sl, :], trans_b=True) * scale, -jnp.inf)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            m_ref = jnp.where(m_new == -jnp.inf, 0.0, m_new)
            p = jnp.exp(s - m_ref[:, None])
            corr = jnp.exp(m - m_ref)
            v = v_ref[sl, :]
            return o * corr[:, None] + _dot(p.astype(v.dtype), v), m_new, l * corr + jnp.sum(p, axis=-1)

        return lax.cond(_any(mask), compute, lambda c: c, carry)

    init = (jnp.zeros((bq, d), _F32), jnp.full((bq,), -jnp.inf, _F32), jnp.zeros((bq,), _F32))
    o, m, l = lax.fori_loop(0, k_ref.shape[0] // bk, body, init)
    seen = l > 0
    l_safe = jnp.where(seen, l, 1.0)
    o_ref[...] = jnp.where(seen[:, None], o / l_safe[:, None], 0.0).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(seen, m + jnp.log(l_safe), -jnp.inf)


def _probabilities(q, k, lse, mask, scale):
    s = _dot(q, k, trans_b=True) * scale
    return jnp.where(mask, jnp.exp(s - jnp.where(mask, lse[:, None], 0.0)), 0.0)


def _dq_kernel(q_ref, k_ref, v_ref, qs_ref, qi_ref, ks_ref, ki_ref, lse_ref, do_ref, delta_ref, dq_ref, *,
               scale, causal, bk):
    q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]
    qs, qi = qs_ref[...], qi_ref[...]

    def body(j, dq):
        sl = pl.ds(j * bk, bk)
        mask = _mask(qs, qi, ks_ref[sl], ki_ref[sl], causal)

        def compute(dq):
            k = k_ref[sl, :]
            p = _probabilities(q, k, lse, mask, scale)
            ds = p * (_dot(do, v_ref[sl, :], trans_b=True) - delta[:, None])
            return dq + _dot(ds.astype(k.dtype), k)

        return lax.cond(_any(mask), compute, lambda x: x, dq)

    dq = lax.fori_loop(0, k_ref.shape[0] // bk, body, jnp.zeros(q.shape, _F32))
    dq_ref[...] = dq * scale


def _dkv_kernel(q_ref, k_ref, v_ref, qs_ref, qi_ref, ks_ref, ki_ref, lse_ref, do_ref, delta_ref, dk_ref, dv_ref, *,
                scale, causal, bq):
    k, v = k_ref[...], v_ref[...]
    ks, ki = ks_ref[...], ki_ref[...]

    def body(i, carry):
        sl = pl.ds(i * bq, bq)
        mask = _mask(qs_ref[sl], qi_ref[sl], ks, ki, causal)

        def compute(carry):
            dk, dv = carry
            q, do = q_ref[sl, :], do_ref[sl, :]
            p = _probabilities(q, k, lse_ref[sl], mask, scale)
            ds = p * (_dot(do, v, trans_b=True) - delta_ref[sl][:, None])
            return (dk + _dot(ds.astype(q.dtype).T, q), dv + _dot(p.astype(do.dtype).T, do))

        return lax.cond(_any(mask), compute, lambda c: c, carry)

    zeros = jnp.zeros(k.shape, _F32)
    dk, dv = lax.fori_loop(0, q_ref.shape[0] // bq, body, (zeros, zeros))
    dk_ref[...] = dk * scale
    dv_ref[...] = dv


def _padded(x, block: int, axis: int = 1):
    pad = -x.shape[axis] % block
    if not pad:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


def _backend(interpret: bool) -> dict:
    """pallas_call's backend arguments: Triton on a GPU, Pallas's interpret mode on CPU."""
    if interpret:
        return dict(interpret=True)
    return dict(compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=2))


@functools.lru_cache(maxsize=None)
def _compiled(fn, **static):
    return jax.jit(functools.partial(fn, **static, interpret=True))


def _interpreted(fn, out_shapes, *args, **static):
    """fn(*args, **static) in Pallas's interpret mode, run on the host through a callback: the
    interpreter cannot run inside shard_map(check_vma=True) (JAX 0.10.2 evaluates the kernel
    with the blocks' varying axes and fails), so each device hands its blocks to the host."""
    run = _compiled(fn, **static)
    out = jax.pure_callback(lambda *a: jax.device_get(run(*a)), out_shapes, *args)
    return vary(out, varying_axes(args))  # per device, as its inputs


def _shaped(shape, axes):
    """A float32 output of `shape` varying over `axes` (what a shard_map with check_vma asks of a
    pallas_call's outputs: those of its inputs)."""
    return jax.ShapeDtypeStruct(shape, _F32, manual_axis_type=ManualAxisType(varying=frozenset(axes)))


def _blocks(sq: int, skv: int, block: int) -> tuple[int, int]:
    fit = lambda n: min(block, max(16, 1 << (n - 1).bit_length()))  # noqa: E731  a power of two, >= 16
    return fit(sq), fit(skv)


def _specs(B, H, G, D, sq, skv, bq, bk, over_keys: bool):
    """BlockSpecs of (q, k, v, q_seg, q_idx, kv_seg, kv_idx, per-query-row arrays [B, H, S] or
    [B, S, H, D]) for a grid over query blocks (over_keys=False) or key blocks."""
    R = H // G
    if over_keys:  # grid (key block, b, h): whole query rows, one key block
        rows = pl.BlockSpec((None, sq, None, D), lambda j, b, h: (b, 0, h, 0))
        keys = pl.BlockSpec((None, bk, None, D), lambda j, b, h: (b, j, h // R, 0))
        q_ids = pl.BlockSpec((None, sq), lambda j, b, h: (b, 0))
        k_ids = pl.BlockSpec((None, bk), lambda j, b, h: (b, j))
        stats = pl.BlockSpec((None, None, sq), lambda j, b, h: (b, h, 0))
    else:  # grid (query block, b, h)
        rows = pl.BlockSpec((None, bq, None, D), lambda i, b, h: (b, i, h, 0))
        keys = pl.BlockSpec((None, skv, None, D), lambda i, b, h: (b, 0, h // R, 0))
        q_ids = pl.BlockSpec((None, bq), lambda i, b, h: (b, i))
        k_ids = pl.BlockSpec((None, skv), lambda i, b, h: (b, 0))
        stats = pl.BlockSpec((None, None, bq), lambda i, b, h: (b, h, i))
    return rows, keys, q_ids, k_ids, stats


def pallas_forward(q, k, v, ids, *, causal: bool, scale: float, block: int = BLOCK, interpret: bool = False):
    """(out [B, Sq, H, D] float32, lse [B, Sq, H] float32) of q over k, v with `ids` =
    (q_seg, kv_seg, q_idx, kv_idx) [B, S*] int32; `interpret`: in Pallas's interpret mode."""
    static = dict(causal=causal, scale=scale, block=block)
    if interpret:
        shapes = (jax.ShapeDtypeStruct(q.shape, _F32), jax.ShapeDtypeStruct(q.shape[:3], _F32))
        return _interpreted(_forward, shapes, q, k, v, tuple(ids), **static)
    return _forward(q, k, v, ids, **static, interpret=False)


def _forward(q, k, v, ids, *, causal, scale, block, interpret):
    B, sq0, H, D = q.shape
    G = k.shape[2]
    bq, bk = _blocks(sq0, k.shape[1], block)
    qseg, kseg, qidx, kidx = ids
    q, qseg, qidx = _padded(q, bq), _padded(qseg, bq), _padded(qidx, bq)
    k, v, kseg, kidx = _padded(k, bk), _padded(v, bk), _padded(kseg, bk), _padded(kidx, bk)
    sq, skv = q.shape[1], k.shape[1]
    args = (q, k, v, qseg, qidx, kseg, kidx)
    axes = varying_axes(args)
    rows, keys, q_ids, k_ids, stats = _specs(B, H, G, D, sq, skv, bq, bk, over_keys=False)
    out, lse = pl.pallas_call(
        partial(_forward_kernel, scale=scale, causal=causal, bk=bk),
        grid=(sq // bq, B, H), in_specs=[rows, keys, keys, q_ids, q_ids, k_ids, k_ids], out_specs=[rows, stats],
        out_shape=[_shaped((B, sq, H, D), axes), _shaped((B, H, sq), axes)],
        name="flash_forward", **_backend(interpret),
    )(*vary(args, axes))
    return out[:, :sq0], jnp.swapaxes(lse, 1, 2)[:, :sq0]


def pallas_backward(q, k, v, ids, lse, dout, delta, *, causal: bool, scale: float, block: int = BLOCK,
                    interpret: bool = False):
    """float32 (dq, dk, dv) from the log-sum-exp [B, Sq, H] and delta = rowsum(dout * out) - dlse."""
    static = dict(causal=causal, scale=scale, block=block)
    if interpret:
        shapes = tuple(jax.ShapeDtypeStruct(x.shape, _F32) for x in (q, k, v))
        return _interpreted(_backward, shapes, q, k, v, tuple(ids), lse, dout, delta, **static)
    return _backward(q, k, v, ids, lse, dout, delta, **static, interpret=False)


def _backward(q, k, v, ids, lse, dout, delta, *, causal, scale, block, interpret):
    B, sq0, H, D = q.shape
    skv0, G = k.shape[1], k.shape[2]
    bq, bk = _blocks(sq0, skv0, block)
    qseg, kseg, qidx, kidx = ids
    q, dout, qseg, qidx = (_padded(x, bq) for x in (q, dout, qseg, qidx))
    lse, delta = (_padded(jnp.swapaxes(x, 1, 2), bq, axis=2) for x in (lse, delta))
    k, v, kseg, kidx = (_padded(x, bk) for x in (k, v, kseg, kidx))
    sq, skv = q.shape[1], k.shape[1]
    args = (q, k, v, qseg, qidx, kseg, kidx, lse, dout, delta)
    axes = varying_axes(args)
    args = vary(args, axes)

    rows, keys, q_ids, k_ids, stats = _specs(B, H, G, D, sq, skv, bq, bk, over_keys=False)
    dq = pl.pallas_call(
        partial(_dq_kernel, scale=scale, causal=causal, bk=bk), grid=(sq // bq, B, H),
        in_specs=[rows, keys, keys, q_ids, q_ids, k_ids, k_ids, stats, rows, stats], out_specs=rows,
        out_shape=_shaped((B, sq, H, D), axes), name="flash_dq", **_backend(interpret),
    )(*args)

    rows, keys, q_ids, k_ids, stats = _specs(B, H, G, D, sq, skv, bq, bk, over_keys=True)
    per_head = pl.BlockSpec((None, bk, None, D), lambda j, b, h: (b, j, h, 0))
    dk, dv = pl.pallas_call(
        partial(_dkv_kernel, scale=scale, causal=causal, bq=bq), grid=(skv // bk, B, H),
        in_specs=[rows, keys, keys, q_ids, q_ids, k_ids, k_ids, stats, rows, stats], out_specs=[per_head, per_head],
        out_shape=[_shaped((B, skv, H, D), axes)] * 2, name="flash_dkv", **_backend(interpret),
    )(*args)
    group = lambda x: x[:, :skv0].reshape(B, skv0, G, H // G, D).sum(axis=3)  # noqa: E731  heads sharing K/V
    return dq[:, :sq0], group(dk), group(dv)
