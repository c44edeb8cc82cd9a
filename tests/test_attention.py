"""Tests for sharding.ops: dense / blockwise attention, online-softmax pieces, RoPE."""
import functools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sharding.ops import (
    apply_rope,
    attend_block,
    block_grads,
    blockwise_attention,
    compute_delta,
    dense_attention,
    finish,
    init_carry,
)
from tests.ring_reference import combine_partials

F32_TOL = 1e-5  # relative (max-abs error / max-abs reference)


def rel_err(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def rand(rng, *shape, dtype=jnp.float32):
    return jnp.asarray(rng.standard_normal(shape), jnp.float32).astype(dtype)


def qkv(rng, B, S, H, D, Skv=None, dtype=jnp.float32):
    Skv = S if Skv is None else Skv
    return rand(rng, B, S, H, D, dtype=dtype), rand(rng, B, Skv, H, D, dtype=dtype), rand(
        rng, B, Skv, H, D, dtype=dtype
    )


def packed_ids(lengths_per_row, S):
    """Segment ids (1, 2, ... per document, 0 = padding at the end) and row indices."""
    seg = np.zeros((len(lengths_per_row), S), np.int32)
    for r, lengths in enumerate(lengths_per_row):
        pos = 0
        for i, n in enumerate(lengths):
            seg[r, pos : pos + n] = i + 1
            pos += n
    idx = np.broadcast_to(np.arange(S, dtype=np.int32), seg.shape).copy()
    return jnp.asarray(seg), jnp.asarray(idx)


def value_and_grads(fn, q, k, v, ct):
    """(fn(q, k, v), grads of sum(fn * ct) w.r.t. q, k, v) in one compiled program."""

    @jax.jit
    def run(q, k, v, ct):
        out, vjp = jax.vjp(fn, q, k, v)
        return out, vjp(ct.astype(out.dtype))

    return run(q, k, v, ct)


def _case(name):
    """(q, k, v, mask kwargs, block_size, q_block_size) for a named scenario."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    H, D = 2, 16
    if name == "causal":
        q, k, v = qkv(rng, 2, 128, H, D)
        return q, k, v, {}, 32, None
    if name == "packed_padded":
        S = 128
        seg, idx = packed_ids([[40, 30, 38], [100], ], S)  # row 0 pads 20, row 1 pads 28
        q, k, v = qkv(rng, 2, S, H, D)
        kw = dict(q_segment_ids=seg, kv_segment_ids=seg, q_index=idx, kv_index=idx)
        return q, k, v, kw, 32, None
    if name == "S200_block64":
        S = 200
        seg, idx = packed_ids([[60, 90, 30], [200]], S)
        q, k, v = qkv(rng, 2, S, H, D)
        kw = dict(q_segment_ids=seg, kv_segment_ids=seg, q_index=idx, kv_index=idx)
        return q, k, v, kw, 64, None
    if name == "S72_block32":
        q, k, v = qkv(rng, 2, 72, H, D)
        return q, k, v, {}, 32, None
    if name == "S72_qwhole_noncausal_packed":
        S = 72
        seg, idx = packed_ids([[20, 40], [72]], S)
        q, k, v = qkv(rng, 2, S, H, D)
        kw = dict(q_segment_ids=seg, kv_segment_ids=seg, q_index=idx, kv_index=idx, causal=False)
        return q, k, v, kw, 32, 72
    if name == "kv_elsewhere":
        # q holds row tokens [128, 224); the K/V block holds row tokens [64, 224) (Skv=160).
        Sq, Skv = 96, 160
        q, k, v = qkv(rng, 2, Sq, H, D, Skv=Skv)
        q_index = jnp.broadcast_to(128 + jnp.arange(Sq, dtype=jnp.int32), (2, Sq))
        kv_index = jnp.broadcast_to(64 + jnp.arange(Skv, dtype=jnp.int32), (2, Skv))
        # two documents per row: tokens < 150 are doc 1, the rest doc 2; row 1 is one document
        qseg = jnp.stack([jnp.where(q_index[0] < 150, 1, 2), jnp.ones(Sq, jnp.int32)])
        kseg = jnp.stack([jnp.where(kv_index[0] < 150, 1, 2), jnp.ones(Skv, jnp.int32)])
        kw = dict(q_segment_ids=qseg, kv_segment_ids=kseg, q_index=q_index, kv_index=kv_index)
        return q, k, v, kw, 48, 32
    if name == "kv_with_masked_block":
        # K/V = [keys before q (visible) | keys after q (fully masked by causality)]
        Sq, Skv = 64, 128
        q, k, v = qkv(rng, 1, Sq, H, D, Skv=Skv)
        q_index = (64 + jnp.arange(Sq, dtype=jnp.int32))[None]
        kv_index = jnp.concatenate([jnp.arange(64), 200 + jnp.arange(64)]).astype(jnp.int32)[None]
        return q, k, v, dict(q_index=q_index, kv_index=kv_index), 32, None
    raise KeyError(name)


CASES = [
    "causal",
    "packed_padded",
    "S200_block64",
    "S72_block32",
    "S72_qwhole_noncausal_packed",
    "kv_elsewhere",
    "kv_with_masked_block",
]


@pytest.mark.parametrize("name", CASES)
def test_blockwise_matches_dense(name):
    q, k, v, kw, bs, qbs = _case(name)
    ct = rand(np.random.default_rng(1), *q.shape)
    dense = functools.partial(dense_attention, **kw)
    block = functools.partial(blockwise_attention, block_size=bs, q_block_size=qbs, **kw)
    o_ref, g_ref = value_and_grads(dense, q, k, v, ct)
    o, g = value_and_grads(block, q, k, v, ct)
    assert o.shape == q.shape and o.dtype == q.dtype
    assert rel_err(o, o_ref) < F32_TOL
    for a, b, which in zip(g, g_ref, "qkv"):
        assert a.shape == b.shape
        assert np.all(np.isfinite(a)), which
        assert rel_err(a, b) < F32_TOL, (which, rel_err(a, b))


def test_fully_masked_kv_block_gives_zero():
    """A visiting block that no query may see: output 0, gradients 0, nothing NaN."""
    rng = np.random.default_rng(2)
    q, k, v = qkv(rng, 1, 40, 2, 16, Skv=50)
    kw = dict(q_index=jnp.arange(40)[None], kv_index=(100 + jnp.arange(50))[None])
    ct = rand(rng, *q.shape)
    for fn in (
        functools.partial(dense_attention, **kw),
        functools.partial(blockwise_attention, block_size=16, **kw),
    ):
        o, g = value_and_grads(fn, q, k, v, ct)
        assert np.all(np.asarray(o) == 0)
        for x in g:
            assert np.all(np.asarray(x) == 0)
    out, lse = jax.jit(lambda q, k, v: finish(attend_block(init_carry(q), q, k, v, **kw)))(q, k, v)
    assert np.all(np.asarray(out) == 0) and np.all(np.isneginf(np.asarray(lse)))


def test_padded_query_rows_zero_and_finite_grads():
    rng = np.random.default_rng(3)
    S = 96
    seg, idx = packed_ids([[30, 40], [10]], S)  # 26 and 86 padding tokens
    q, k, v = qkv(rng, 2, S, 2, 16)
    kw = dict(q_segment_ids=seg, kv_segment_ids=seg, q_index=idx, kv_index=idx)
    ct = rand(rng, *q.shape)
    pad = np.asarray(seg) == 0
    for fn in (
        functools.partial(dense_attention, **kw),
        functools.partial(blockwise_attention, block_size=32, **kw),
    ):
        o, (dq, dk, dv) = value_and_grads(fn, q, k, v, ct)
        o = np.asarray(o)
        assert np.all(o[pad] == 0.0)
        assert np.all(np.isfinite(o))
        for x in (dq, dk, dv):
            x = np.asarray(x)
            assert np.all(np.isfinite(x))
            assert np.all(x[pad] == 0.0)  # padded queries / keys get no gradient


def _dense_grads(q, k, v, ct, kw):
    return jax.jit(jax.grad(
        lambda q, k, v: jnp.sum(dense_attention(q, k, v, **kw) * ct), argnums=(0, 1, 2)
    ))(q, k, v)


@pytest.mark.parametrize("tiles", [(None, None), (16, 24)])
def test_online_softmax_pieces_in_chunks(tiles):
    """4 K/V chunks visited in ring order (not 0,1,2,3) through attend_block / block_grads."""
    qbs, kbs = tiles
    rng = np.random.default_rng(4)
    S, n = 128, 4
    seg, idx = packed_ids([[50, 50, 20], [128]], S)
    q, k, v = qkv(rng, 2, S, 2, 16)
    kw = dict(q_segment_ids=seg, kv_segment_ids=seg, q_index=idx, kv_index=idx)
    ct = rand(rng, *q.shape)
    o_ref, lse_ref = dense_attention(q, k, v, return_lse=True, **kw)
    c = S // n
    chunk = lambda x, i: x[:, i * c : (i + 1) * c]
    order = [2, 3, 0, 1]

    def blk_kw(i):
        return dict(
            q_segment_ids=seg, kv_segment_ids=chunk(seg, i), q_index=idx, kv_index=chunk(idx, i),
            q_block_size=qbs, kv_block_size=kbs,
        )

    @jax.jit
    def forward(q, k, v):
        carry = init_carry(q)
        for i in order:
            carry = attend_block(carry, q, chunk(k, i), chunk(v, i), **blk_kw(i))
        return finish(carry, dtype=q.dtype)

    @jax.jit
    def backward(q, k, v, out, lse, ct):
        delta = compute_delta(out, ct)
        dq = jnp.zeros(q.shape, jnp.float32)
        dks, dvs = {}, {}
        for i in order:
            dq_p, dks[i], dvs[i] = block_grads(
                q, chunk(k, i), chunk(v, i), lse, ct, delta, **blk_kw(i)
            )
            assert dq_p.dtype == jnp.float32
            dq = dq + dq_p
        dk = jnp.concatenate([dks[i] for i in range(n)], axis=1)
        dv = jnp.concatenate([dvs[i] for i in range(n)], axis=1)
        return dq, dk, dv

    out, lse = forward(q, k, v)
    assert rel_err(out, o_ref) < F32_TOL
    live = np.isfinite(np.asarray(lse_ref))
    np.testing.assert_array_equal(np.isfinite(np.asarray(lse)), live)
    np.testing.assert_allclose(np.asarray(lse)[live], np.asarray(lse_ref)[live], rtol=1e-6, atol=1e-6)

    dq, dk, dv = backward(q, k, v, out, lse, ct)
    gq, gk, gv = _dense_grads(q, k, v, ct, kw)
    assert rel_err(dq, gq) < F32_TOL
    assert rel_err(dk, gk) < F32_TOL
    assert rel_err(dv, gv) < F32_TOL


def test_autodiff_through_attend_block_is_finite_and_exact():
    """Strategies that skip the custom VJP may differentiate attend_block/finish directly."""
    rng = np.random.default_rng(5)
    S = 64
    seg, idx = packed_ids([[20, 30], [64]], S)
    q, k, v = qkv(rng, 2, S, 2, 8)
    kw = dict(q_segment_ids=seg, kv_segment_ids=seg, q_index=idx, kv_index=idx)
    ct = rand(rng, *q.shape)

    def chunked(q, k, v):
        carry = init_carry(q)
        for i in range(4):
            sl = slice(16 * i, 16 * (i + 1))
            carry = attend_block(
                carry, q, k[:, sl], v[:, sl], q_segment_ids=seg, kv_segment_ids=seg[:, sl],
                q_index=idx, kv_index=idx[:, sl],
            )
        return finish(carry, dtype=q.dtype)[0]

    g = jax.jit(jax.grad(lambda *a: jnp.sum(chunked(*a) * ct), argnums=(0, 1, 2)))(q, k, v)
    g_ref = _dense_grads(q, k, v, ct, kw)
    for a, b in zip(g, g_ref):
        assert np.all(np.isfinite(a))
        assert rel_err(a, b) < F32_TOL


def test_combine_partials():
    rng = np.random.default_rng(6)
    q, k, v = qkv(rng, 1, 32, 2, 8, Skv=48)
    qi = (16 + jnp.arange(32))[None]
    ki = jnp.arange(48)[None]
    attn = jax.jit(functools.partial(dense_attention, return_lse=True))
    o_ref, lse_ref = attn(q, k, v, q_index=qi, kv_index=ki)
    parts = []
    for sl in (slice(0, 24), slice(24, 48)):
        parts += list(attn(q, k[:, sl], v[:, sl], q_index=qi, kv_index=ki[:, sl]))
    out, lse = jax.jit(combine_partials)(*parts)  # equal to the whole only if each part's lse is right
    assert rel_err(out, o_ref) < F32_TOL and rel_err(lse, lse_ref) < F32_TOL
    # both sides empty -> 0 output, -inf lse, no NaN
    z = jnp.zeros_like(out)
    ninf = jnp.full(lse.shape, -jnp.inf)
    o2, l2 = combine_partials(z, ninf, z, ninf)
    assert np.all(np.asarray(o2) == 0) and np.all(np.isneginf(np.asarray(l2)))


BF16_TOL = 2e-2  # relative to max |ref|; bf16 has an 8-bit mantissa (eps 7.8e-3)


def test_bf16_close_to_f32():
    rng = np.random.default_rng(7)
    S = 128
    seg, idx = packed_ids([[60, 50], [128]], S)
    kw = dict(q_segment_ids=seg, kv_segment_ids=seg, q_index=idx, kv_index=idx)
    qb, kb, vb = qkv(rng, 2, S, 2, 32, dtype=jnp.bfloat16)
    ct = rand(rng, 2, S, 2, 32)
    q32, k32, v32 = (x.astype(jnp.float32) for x in (qb, kb, vb))
    o_ref, g_ref = value_and_grads(functools.partial(dense_attention, **kw), q32, k32, v32, ct)
    block = functools.partial(blockwise_attention, block_size=32, **kw)
    o, g = value_and_grads(block, qb, kb, vb, ct)
    assert o.dtype == jnp.bfloat16
    assert rel_err(o, o_ref) < BF16_TOL
    pad = np.asarray(seg) == 0
    assert np.all(np.asarray(o.astype(jnp.float32))[pad] == 0)
    for a, b in zip(g, g_ref):
        assert a.dtype == jnp.bfloat16
        assert np.all(np.isfinite(np.asarray(a.astype(jnp.float32))))
        assert rel_err(a.astype(jnp.float32), b) < BF16_TOL
    # the dense path with bf16 inputs too
    assert rel_err(dense_attention(qb, kb, vb, **kw).astype(jnp.float32), o_ref) < BF16_TOL


def test_training_memory_blockwise_far_below_dense():
    B, S, H, D = 1, 2048, 4, 64
    sds = jax.ShapeDtypeStruct((B, S, H, D), jnp.float32)

    def temp_bytes(fn):
        loss = lambda q, k, v: jnp.sum(fn(q, k, v) ** 2)
        c = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(sds, sds, sds).compile()
        return c.memory_analysis().temp_size_in_bytes

    dense = temp_bytes(dense_attention)
    block = temp_bytes(functools.partial(blockwise_attention, block_size=256))
    print(f"\nS={S} B={B} H={H} D={D} grad temp: dense {dense / 2**20:.1f} MiB, "
          f"blockwise(256) {block / 2**20:.1f} MiB, ratio {block / dense:.3f}")
    assert block < 0.25 * dense


def _np_rope(x, pos, theta=10000.0):
    x = np.asarray(x, np.float64)
    D = x.shape[-1]
    inv = theta ** (-np.arange(0, D, 2) / D)
    ang = np.asarray(pos, np.float64)[..., None] * inv  # [B, S, D/2]
    cos = np.concatenate([np.cos(ang)] * 2, -1)[:, :, None]
    sin = np.concatenate([np.sin(ang)] * 2, -1)[:, :, None]
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    rot = np.concatenate([-x2, x1], -1)
    return x * cos + rot * sin


def test_rope_matches_numpy():
    rng = np.random.default_rng(8)
    x = rand(rng, 2, 24, 3, 16)
    pos = jnp.asarray(np.concatenate([np.arange(10), np.arange(14)])[None].repeat(2, 0))
    pos = pos.at[1].set(jnp.arange(24) + 1000)
    out = apply_rope(x, pos)
    assert out.dtype == jnp.float32
    # angles are float32 (as specified): at position ~1000 the angle itself carries ~6e-5 error
    np.testing.assert_allclose(np.asarray(out)[0], _np_rope(x, pos)[0], atol=2e-6, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(out), _np_rope(x, pos), atol=3e-4)
    np.testing.assert_allclose(
        np.asarray(apply_rope(x, pos, theta=500.0)), _np_rope(x, pos, 500.0), atol=3e-4
    )
    xb = x.astype(jnp.bfloat16)
    ob = apply_rope(xb, pos)
    assert ob.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(ob.astype(jnp.float32)), _np_rope(xb.astype(jnp.float32), pos), atol=3e-2
    )
    # position 0 is the identity
    np.testing.assert_array_equal(np.asarray(apply_rope(x, jnp.zeros((2, 24), jnp.int32))), x)


def test_rope_relative_property():
    rng = np.random.default_rng(9)
    D = 32
    q = rand(rng, 1, 1, 1, D)
    k = rand(rng, 1, 1, 1, D)

    def dot(m, n):
        qm = apply_rope(q, jnp.array([[m]]))
        kn = apply_rope(k, jnp.array([[n]]))
        return float(jnp.sum(qm * kn))

    for delta in (0, 3, 17, -5):
        base = dot(delta + 7, 7)
        for m in (delta + 30, delta + 200, delta + 1234):
            assert abs(dot(m, m - delta) - base) < 1e-3 * max(1.0, abs(base))
    assert abs(dot(10, 0) - dot(0, 10)) > 1e-3  # it does depend on the offset's sign


def test_kernels_type_check_inside_shard_map():
    """Strategies call these inside shard_map(check_vma=True): scan carries and lax.cond branches
    must carry the inputs' varying axes. A 1-device mesh exercises the same type rules."""
    from jax.sharding import AxisType, PartitionSpec as P

    mesh = jax.make_mesh((1,), ("sp",), axis_types=(AxisType.Auto,), devices=jax.devices()[:1])
    rng = np.random.default_rng(10)
    S = 64
    seg, idx = packed_ids([[20, 30]], S)
    q, k, v = qkv(rng, 1, S, 2, 8)
    ct = rand(rng, *q.shape)
    kw = dict(q_segment_ids=seg, kv_segment_ids=seg, q_index=idx, kv_index=idx)
    tiles = dict(q_block_size=16, kv_block_size=24)

    def local(q, k, v, ct, seg, idx):
        kw = dict(q_segment_ids=seg, kv_segment_ids=seg, q_index=idx, kv_index=idx)
        _, vjp = jax.vjp(lambda q, k, v: blockwise_attention(q, k, v, block_size=16, **kw), q, k, v)
        out, lse = finish(attend_block(init_carry(q), q, k, v, **kw, **tiles), dtype=q.dtype)
        pieces = block_grads(q, k, v, lse, ct, compute_delta(out, ct), **kw, **tiles)
        return out, vjp(ct), pieces

    spec = P(None, "sp")
    fn = jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 6, out_specs=spec, check_vma=True)
    out, grads, pieces = jax.jit(fn)(q, k, v, ct, seg, idx)
    o_ref, g_ref = value_and_grads(functools.partial(dense_attention, **kw), q, k, v, ct)
    assert rel_err(out, o_ref) < F32_TOL
    for a, b, c in zip(grads, pieces, g_ref):
        assert rel_err(a, c) < F32_TOL and rel_err(b, c) < F32_TOL


def test_training_memory_blockwise_inside_layer_scan():
    """Inside a (differentiated) lax.scan over layers the kernel must stay O(S·D + tile²).

    The scan's partial evaluation hoists loop-invariant residuals out of the loop; the tiles'
    masks and skip predicates depend only on the (loop-invariant) ids, so without care every
    tile's mask / cond residual is precomputed and stacked, O(S²) like dense attention (S=8192:
    36 MiB alone vs 730 MiB in a 1-step scan)."""
    B, S, H, D = 1, 2048, 4, 64
    sds = jax.ShapeDtypeStruct((B, S, H, D), jnp.float32)
    ids = jax.ShapeDtypeStruct((B, S), jnp.int32)

    def temp_bytes(attn, n_layers):
        def layer(x, seg, idx):
            return attn(x, x, x, q_segment_ids=seg, kv_segment_ids=seg, q_index=idx, kv_index=idx)

        def loss(x, seg, idx):
            if n_layers:  # ids are scan constants, as in the model's layer scan
                x, _ = jax.lax.scan(lambda c, _: (layer(c, seg, idx), None), x, None, length=n_layers)
            else:
                x = layer(x, seg, idx)
            return jnp.sum(x ** 2)

        c = jax.jit(jax.grad(loss)).lower(sds, ids, ids).compile()
        return c.memory_analysis().temp_size_in_bytes

    block = functools.partial(blockwise_attention, block_size=256)
    alone, scan1, scan2 = (temp_bytes(block, n) for n in (0, 1, 2))
    dense = temp_bytes(dense_attention, 1)
    print(f"\nS={S} H={H} D={D} blockwise(256) grad temp: alone {alone / 2**20:.1f} MiB, "
          f"1-layer scan {scan1 / 2**20:.1f} MiB, 2-layer scan {scan2 / 2**20:.1f} MiB; "
          f"dense in a scan {dense / 2**20:.1f} MiB")
    assert scan1 < 2 * alone and scan2 < 2 * alone, (alone, scan1, scan2)
    assert scan2 < 0.25 * dense, (scan2, dense)


def test_blockwise_inside_layer_scan_matches_dense():
    """Values and grads through a 2-layer scan (ids as scan constants), tiles partly skipped."""
    q, _, _, kw, bs, qbs = _case("packed_padded")
    ct = rand(np.random.default_rng(11), *q.shape)

    def stack(attn):
        def run(x):
            y, _ = jax.lax.scan(lambda c, _: (attn(c, c, c, **kw), None), x, None, length=2)
            return jnp.sum(y * ct), y
        return jax.jit(jax.value_and_grad(run, has_aux=True))

    (_, y), g = stack(functools.partial(blockwise_attention, block_size=bs, q_block_size=qbs))(q)
    (_, y_ref), g_ref = stack(dense_attention)(q)
    assert rel_err(y, y_ref) < F32_TOL
    assert rel_err(g, g_ref) < F32_TOL


# -- the flash kernel's schedule and tiles ---------------------------------------------------------
def _visited(seg, idx, b, causal=True, kv_seg=None, kv_idx=None, unmasked=False):
    """Sorted (query tile, key tile) pairs the kernel visits (only those it computes unmasked)."""
    from sharding.ops.flash import Ids, schedule
    ids = Ids.of((seg, seg if kv_seg is None else kv_seg, idx, idx if kv_idx is None else kv_idx), b, b)
    qi, kj, full, count = jax.jit(lambda: schedule(ids, causal))()
    n = int(count)
    pairs = zip(np.asarray(qi)[:n].tolist(), np.asarray(kj)[:n].tolist(), np.asarray(full)[:n].tolist())
    return sorted((i, j) for i, j, f in pairs if f or not unmasked)


def test_schedule_visits_the_causal_triangle_and_each_documents_own_tiles():
    S, b = 256, 32  # 8 x 8 tiles
    one_doc, idx = packed_ids([[S]], S)
    assert _visited(one_doc, idx, b) == [(i, j) for i in range(8) for j in range(i + 1)]  # 36 of 64
    assert _visited(one_doc, idx, b, unmasked=True) == [(i, j) for i in range(8) for j in range(i)]  # below the diagonal
    assert len(_visited(one_doc, idx, b, causal=False)) == 64
    # documents on tile edges [0, 64), [64, 192), [192, 256): each sees only its own tiles
    docs, _ = packed_ids([[64, 128, 64]], S)
    want = [(i, j) for i in range(8) for j in range(i + 1) if (i < 2) == (j < 2) and (i >= 6) == (j >= 6)]
    assert _visited(docs, idx, b) == want
    assert _visited(docs, idx, b, unmasked=True) == [(1, 0), (3, 2), (4, 2), (4, 3), (5, 2), (5, 3), (5, 4), (7, 6)]
    # padding from token 200 on: its query tiles visit nothing, no tile visits its keys
    padded, _ = packed_ids([[200]], S)
    assert _visited(padded, idx, b) == [(i, j) for i in range(7) for j in range(i + 1)]


def test_schedule_of_a_block_in_the_future_or_of_another_document_is_empty():
    seg, idx = packed_ids([[64]], 64)
    assert _visited(seg, idx, 16, kv_idx=idx + 64) == []  # a ring's block after q: no tile at all
    assert len(_visited(seg, idx, 16, kv_idx=idx - 64)) == 16  # a block before q: all of it
    assert _visited(seg, idx, 16, kv_seg=seg + 1, kv_idx=idx - 64) == []


def test_tiles_are_halved_to_a_cache_sized_tile():
    from sharding.ops.flash import MAX_TILE, MIN_TILE, TILE_ELEMENTS, tile_sizes
    assert tile_sizes(512, 512, 4096, 4096, batch_heads=8) == (128, 128)  # 8 x 128 x 128 = 2^17
    assert tile_sizes(512, 512, 512, 512, batch_heads=64) == (64, 64)
    assert tile_sizes(48, 48, 200, 200, batch_heads=16) == (48, 48)  # small tiles stay
    assert tile_sizes(512, 512, 100, 300, batch_heads=1) == (100, MAX_TILE)  # at most the lengths and MAX_TILE
    assert tile_sizes(512, 512, 4096, 4096, batch_heads=1) == (MAX_TILE, MAX_TILE)  # one row and head (ulysses)
    assert tile_sizes(512, 512, 512, 512, batch_heads=4096) == (MIN_TILE, MIN_TILE)
    bq, bk = tile_sizes(512, 256, 4096, 4096, batch_heads=16)
    assert 16 * bq * bk <= TILE_ELEMENTS and (bq, bk) == (128, 128)
