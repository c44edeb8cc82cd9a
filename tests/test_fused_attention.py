"""The fused accelerator kernels against the dense reference, on CPU where they can run there:
Pallas's flash kernel in interpret mode (packed rows), the cuDNN call's padding-lengths mapping
through XLA (rows of one document); and the fallback to blockwise where a kernel cannot serve."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sharding.ops import blockwise_attention, dense_attention
from sharding.ops.blocks import BlockSpec, local_attention
from sharding.ops.fused_attention import cudnn_attention, fused_attention, pallas_attention

B, S, H, D = 2, 128, 2, 16
TOL = 2e-5  # relative to the reference's largest value, float32


def _qkv(seed=0):
    ks = jax.random.split(jax.random.key(seed), 3)
    return [jax.random.normal(k, (B, S, H, D), jnp.float32) for k in ks]


def _rel(a, b):
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


def _check_against_dense(kernel, segment_ids):
    q, k, v = _qkv()
    w = jax.random.normal(jax.random.key(9), (B, S, H, D))  # a loss that weighs every output

    def loss(fn):
        return lambda q, k, v: jnp.sum(w * fn(q, k, v))
    ref = lambda q, k, v: dense_attention(q, k, v, q_segment_ids=segment_ids, kv_segment_ids=segment_ids)  # noqa: E731
    got = lambda q, k, v: kernel(q, k, v, segment_ids)  # noqa: E731
    assert _rel(got(q, k, v), ref(q, k, v)) < TOL
    for name, g, r in zip("qkv", jax.grad(loss(got), (0, 1, 2))(q, k, v), jax.grad(loss(ref), (0, 1, 2))(q, k, v)):
        assert _rel(g, r) < TOL, f"d{name}"


def test_pallas_kernel_matches_reference_on_packed_rows():
    # row 0: three documents and padding; row 1: two documents filling the row
    seg = np.zeros((B, S), np.int32)
    seg[0, :40], seg[0, 40:90], seg[0, 90:120] = 1, 2, 3
    seg[1, :77], seg[1, 77:] = 1, 2
    _check_against_dense(lambda q, k, v, s: pallas_attention(q, k, v, s, interpret=True), jnp.asarray(seg))


def test_cudnn_call_matches_reference_on_rows_of_one_document():
    seg = np.zeros((B, S), np.int32)
    seg[0, :100], seg[1, :] = 1, 1  # one padded row, one full row
    _check_against_dense(lambda q, k, v, s: cudnn_attention(q, k, v, s, implementation="xla"), jnp.asarray(seg))


def test_kernels_say_why_they_do_not_serve():
    q = jnp.zeros((B, S, H, D), jnp.float32)
    seg = jnp.ones((B, S), jnp.int32)
    out, why = fused_attention("cudnn", q, q, q, seg, platform="gpu", n_devices=1)
    assert out is None and why == "cuDNN attention needs bfloat16/float16 inputs, got float32"
    out, why = fused_attention("cudnn", q.astype(jnp.bfloat16), q, q, seg, platform="cpu", n_devices=1)
    assert out is None and why == "cuDNN attention needs a GPU (platform cpu)"
    out, why = fused_attention("pallas", q, q, q, seg, platform="gpu", n_devices=8)
    assert out is None and why == "a pallas_call is not partitioned: it serves one device, the program has 8"
    odd = jnp.zeros((B, 96 + 48, H, D))
    assert fused_attention("pallas", odd, odd, odd, jnp.ones((B, 144), jnp.int32), platform="gpu",
                           n_devices=1)[1].startswith("the Pallas kernel needs a length that is a multiple of 128")


@pytest.mark.parametrize("kernel", ["pallas", "cudnn"])
def test_local_attention_falls_back_to_blockwise_where_a_kernel_does_not_serve(kernel):
    # 8 simulated devices (pallas) / float32 on CPU (cudnn): the blockwise kernel runs, same numbers
    if kernel == "pallas" and jax.device_count() == 1:
        pytest.skip("needs several devices")
    q, k, v = _qkv(1)
    seg = jnp.ones((B, S), jnp.int32)
    spec = BlockSpec(n_heads=H, head_dim=D, d_model=H * D, d_ff=64, attention=kernel, attention_block=64)
    got = local_attention(q, k, v, spec, q_segment_ids=seg, kv_segment_ids=seg)
    want = blockwise_attention(q, k, v, q_segment_ids=seg, kv_segment_ids=seg, block_size=64)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert spec.use_blockwise(S)  # the cost model prices a fused kernel's memory as flash attention


def test_auto_resolves_to_a_fused_kernel_on_gpu_only():
    import dysejax
    from dysejax.build import with_attention_kernel
    from tests.conftest import TINY

    cfg = lambda *o: dysejax.load_config(TINY, list(o))  # noqa: E731
    assert with_attention_kernel(cfg(), "cpu").attention == "auto"
    assert with_attention_kernel(cfg(), "gpu").attention == "pallas"  # packed rows need segment ids
    unpacked = cfg("data.pack=false", "model.compute_dtype=bfloat16")
    assert with_attention_kernel(unpacked, "gpu").attention == "cudnn"
    assert with_attention_kernel(cfg("model.attention=blockwise"), "gpu").attention == "blockwise"
