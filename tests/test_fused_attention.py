"""The fused accelerator kernels against the dense reference, on CPU where they can run there:
our Pallas flash kernel in interpret mode (packed rows, grouped K/V, a ring's visiting block;
its log-sum-exp; inside every strategy, per device), the cuDNN call's padding-lengths mapping
through XLA (rows of one document); the Pallas kernel's lowering to Triton for a GPU; and which
kernel runs where."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sharding.ops import dense_attention
from sharding.ops.blocks import BlockSpec, attention_kernel, local_attention
from sharding.ops.flash import materialize_ids
from sharding.ops.fused_attention import cudnn_attention, cudnn_unserved, pallas_unserved
from sharding.ops.kernels import Kernel, flash_attention
from tests.reference import check_against_reference, packed_batch

B, S, H, D = 2, 128, 2, 16
TOL = 2e-5  # relative to the reference's largest value, float32
PALLAS = Kernel("pallas", 32, 32, interpret=True)  # 4 x 4 blocks of 32


def _rel(a, b):
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


def _check(got, want, *args):
    """got(*args) and want(*args) equal in value and in the gradients of a loss weighing every
    output (a tuple output: each part weighed)."""
    ws = jax.tree.map(lambda o: jax.random.normal(jax.random.key(9), o.shape), want(*args))

    def loss(fn):
        return lambda *a: sum(jnp.sum(w * jnp.where(jnp.isfinite(o), o, 0.0))
                              for w, o in zip(jax.tree.leaves(ws), jax.tree.leaves(fn(*a))))
    for g, r in zip(jax.tree.leaves(jax.jit(got)(*args)), jax.tree.leaves(want(*args))):
        np.testing.assert_array_equal(np.isfinite(g), np.isfinite(r))
        assert _rel(jnp.where(jnp.isfinite(r), g, 0), jnp.where(jnp.isfinite(r), r, 0)) < TOL
    n = tuple(range(len(args)))
    for name, g, r in zip("qkv", jax.jit(jax.grad(loss(got), n))(*args), jax.grad(loss(want), n)(*args)):
        assert np.all(np.isfinite(g)) and _rel(g, r) < TOL, f"d{name}"


def _qkv(seed=0, groups=H, s=S):
    ks = jax.random.split(jax.random.key(seed), 3)
    return [jax.random.normal(key, (B, s, h, D), jnp.float32) for key, h in zip(ks, (H, groups, groups))]


def test_pallas_kernel_matches_reference_on_packed_rows_with_grouped_kv():
    # row 0: three documents and padding; row 1: two documents filling the row; one K/V head
    seg = np.zeros((B, S), np.int32)
    seg[0, :40], seg[0, 40:90], seg[0, 90:120] = 1, 2, 3
    seg[1, :77], seg[1, 77:] = 1, 2
    seg = jnp.asarray(seg)
    ids = materialize_ids(B, S, S, seg, seg)
    got = lambda q, k, v: flash_attention(q, k, v, ids, PALLAS)  # noqa: E731
    want = lambda q, k, v: dense_attention(q, k, v, q_segment_ids=seg, kv_segment_ids=seg, return_lse=True)  # noqa: E731
    _check(got, want, *_qkv(groups=1))


def test_pallas_kernel_on_a_ring_block_elsewhere_in_the_row():
    """q holds tokens [96, 160) of the row, the K/V block tokens [64, 128): indices, not positions, mask."""
    q, k, v = _qkv(1, s=64)
    q_index = jnp.broadcast_to(96 + jnp.arange(64, dtype=jnp.int32), (B, 64))
    kv_index = jnp.broadcast_to(64 + jnp.arange(64, dtype=jnp.int32), (B, 64))
    ids = materialize_ids(B, 64, 64, q_index=q_index, kv_index=kv_index)
    got = lambda q, k, v: flash_attention(q, k, v, ids, PALLAS)  # noqa: E731
    want = lambda q, k, v: dense_attention(q, k, v, q_index=q_index, kv_index=kv_index, return_lse=True)  # noqa: E731
    _check(got, want, q, k, v)


def test_cudnn_call_matches_reference_on_rows_of_one_document():
    seg = np.zeros((B, S), np.int32)
    seg[0, :100], seg[1, :] = 1, 1  # one padded row, one full row
    seg = jnp.asarray(seg)
    got = lambda q, k, v: cudnn_attention(q, k, v, seg, implementation="xla")  # noqa: E731
    want = lambda q, k, v: dense_attention(q, k, v, q_segment_ids=seg, kv_segment_ids=seg)  # noqa: E731
    _check(got, want, *_qkv())


def test_pallas_kernel_lowers_to_triton_for_a_gpu():
    """No GPU here: the kernels are lowered for CUDA (Pallas -> Triton), not compiled or run."""
    from sharding.ops.pallas_flash import pallas_backward, pallas_forward
    x = jax.ShapeDtypeStruct((1, 128, 2, 64), jnp.bfloat16)
    i = jax.ShapeDtypeStruct((1, 128), jnp.int32)
    st = jax.ShapeDtypeStruct((1, 128, 2), jnp.float32)
    fwd = jax.jit(lambda q, k, v, *ids: pallas_forward(q, k, v, ids, causal=True, scale=0.125))
    bwd = jax.jit(lambda q, k, v, a, b, c, d, lse, do, delta: pallas_backward(
        q, k, v, (a, b, c, d), lse, do, delta, causal=True, scale=0.125))
    for fn, args in ((fwd, (x, x, x, i, i, i, i)), (bwd, (x, x, x, i, i, i, i, st, x, st))):
        text = fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
        assert "__gpu$xla.gpu.triton" in text or "triton_kernel_call" in text, text[:2000]


def test_kernels_say_why_they_do_not_serve():
    q = jnp.zeros((B, S, H, D), jnp.float32)
    assert cudnn_unserved(q, "gpu") == "cuDNN attention needs bfloat16/float16 inputs, got float32"
    assert cudnn_unserved(q.astype(jnp.bfloat16), "cpu") == "cuDNN attention needs a GPU (platform cpu)"
    assert cudnn_unserved(q.astype(jnp.bfloat16), "gpu") is None
    assert pallas_unserved(24, "gpu") == "the Pallas attention kernel needs a head_dim that is a power of two >= 16, got 24"
    assert pallas_unserved(8, "cpu") is None and pallas_unserved(64, "gpu") is None


def test_which_kernel_runs_where():
    spec = lambda attention, d=16: BlockSpec(n_heads=2, head_dim=d, d_model=2 * d, d_ff=64,  # noqa: E731
                                             attention=attention, attention_block=256)
    assert attention_kernel(spec("pallas"), platform="gpu") == Kernel("pallas", 256, 256)
    assert attention_kernel(spec("pallas"), platform="cpu") == Kernel("pallas", 256, 256, interpret=True)
    assert attention_kernel(spec("pallas", d=24), platform="gpu") == Kernel("xla", 256, 256)  # Triton can't: XLA's
    assert attention_kernel(spec("cudnn"), platform="gpu") == Kernel("xla", 256, 256)  # cuDNN has no ring step
    assert attention_kernel(spec("auto"), 128, platform="cpu") == Kernel("xla", None, None)  # dense lengths: whole


def test_cudnn_falls_back_to_the_flash_kernel_where_it_does_not_serve():
    q, k, v = _qkv(1)
    seg = jnp.ones((B, S), jnp.int32)
    spec = BlockSpec(n_heads=H, head_dim=D, d_model=H * D, d_ff=64, attention="cudnn", attention_block=64)
    got = local_attention(q, k, v, spec, q_segment_ids=seg, kv_segment_ids=seg)  # float32 on CPU: no cuDNN
    want = local_attention(q, k, v, spec.__class__(**{**spec.__dict__, "attention": "blockwise"}),
                           q_segment_ids=seg, kv_segment_ids=seg)
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


# -- every strategy with the Pallas kernel per device (interpreted) vs the XLA kernel on one device ---
def _one_document_per_row(batch, seq):
    data = packed_batch(batch, seq, seed=3)
    data["segment_ids"] = np.ones((batch, seq), np.int32)
    data["positions"] = np.broadcast_to(np.arange(seq, dtype=np.int32), (batch, seq)).copy()
    data["loss_mask"] = np.ones((batch, seq), np.float32)
    return data


def _pallas_case(plan, packed):
    batch = 8 if plan in ("dp", "fsdp") else 2
    data = None if packed else _one_document_per_row(batch, 64)
    check_against_reference(plan, batch=batch, seq=64, extra=["model.attention=pallas", "model.attention_block=16"],
                            ref_extra=["model.attention=blockwise"], data=data)


def test_ring_with_the_pallas_kernel_per_step_matches_reference():
    _pallas_case("ring", packed=True)


@pytest.mark.slow
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "one-document-rows"])
@pytest.mark.parametrize("plan", ["dp", "fsdp", "tp", "tp_sp", "ring", "ulysses", "metp"])
def test_every_strategy_with_the_pallas_kernel_matches_reference(plan, packed):
    _pallas_case(plan, packed)
