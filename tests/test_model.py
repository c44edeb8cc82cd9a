"""Model: shapes, logical axes, packing isolation, scan vs unrolled, attention paths, dtypes."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dysejax.config import load_config
from dysejax.model.transformer import Transformer, abstract_params, count_params, init_params
from dysejax.state import logical_axes
from sharding.mesh import build_mesh
from sharding.plan import Plan, Run
from tests.conftest import TINY

MESH = build_mesh({"data": 8})
DP = Plan((Run("dp", 2),))


def _cfg(*extra):
    return load_config(TINY, ["model.d_model=64", "model.d_ff=128", "model.vocab_size=264", *extra]).model


def _logits(cfg, params, inputs, segs, pos, plan=DP):
    return Transformer(cfg).apply({"params": params}, inputs, segs, pos, plan=plan, mesh=MESH,
                                  method=Transformer.logits)


def _jit_logits(cfg):
    """`_logits` of `cfg` compiled once (eager, each of its many ops is dispatched on its own)."""
    return jax.jit(lambda params, inputs, segs, pos: _logits(cfg, params, inputs, segs, pos))


def _batch(b=8, s=32, seed=0):
    rng = np.random.default_rng(seed)
    inputs = jnp.asarray(rng.integers(0, 256, (b, s)), jnp.int32)
    segs = np.ones((b, s), np.int32)
    segs[:, s // 2:] = 2  # two documents per row
    pos = np.concatenate([np.arange(s // 2), np.arange(s - s // 2)])[None].repeat(b, 0)
    return inputs, jnp.asarray(segs), jnp.asarray(pos, jnp.int32)


def test_param_shapes_and_logical_axes():
    cfg = _cfg("model.tie_embeddings=false")
    boxed = abstract_params(cfg)
    params = nn.unbox(boxed)
    axes = logical_axes(boxed)
    assert params["layers_wq"].shape == (2, 64, 8, 8) and params["layers_wkv"].shape == (2, 64, 2, 8, 8)
    assert axes["layers_wq"] == ("layers", "embed", "heads", "head_dim")
    assert axes["layers_wkv"] == ("layers", "embed", "qkv", "kv_heads", "head_dim")
    assert params["layers_w_in"].shape == (2, 64, 2, 128) and params["layers_w_out"].shape == (2, 128, 64)
    assert params["embed"].shape == (264, 64) and params["lm_head"].shape == (64, 264)
    d, f, v, layers = 64, 128, 264, 2
    expected = layers * (2 * d + 4 * d * d + 3 * d * f) + 2 * v * d + d
    assert count_params(params) == expected
    assert "lm_head" not in nn.unbox(abstract_params(_cfg()))


def test_logits_shape_and_documents_do_not_see_each_other():
    cfg = _cfg()
    params = nn.unbox(init_params(cfg, jax.random.key(0)))
    inputs, segs, pos = _batch()
    logits = _jit_logits(cfg)
    out = logits(params, inputs, segs, pos)
    assert out.shape == (8, 32, 264) and out.dtype == jnp.float32
    # change only the second document of each row: the first document's logits are unchanged
    changed = inputs.at[:, 20:].set((inputs[:, 20:] + 7) % 256)
    out2 = logits(params, changed, segs, pos)
    np.testing.assert_array_equal(np.asarray(out[:, :16]), np.asarray(out2[:, :16]))
    assert not np.allclose(np.asarray(out[:, 20:]), np.asarray(out2[:, 20:]))
    # causal: changing a later token of a document leaves earlier positions unchanged
    later = inputs.at[:, 10].set((inputs[:, 10] + 1) % 256)
    out3 = logits(params, later, segs, pos)
    np.testing.assert_array_equal(np.asarray(out[:, :10]), np.asarray(out3[:, :10]))


def _value_and_grad(cfg, params):
    inputs, segs, pos = _batch(s=40)
    return jax.jit(jax.value_and_grad(lambda p: jnp.mean(_logits(cfg, p, inputs, segs, pos) ** 2)))(params)


@functools.cache
def _reference():
    """(params, loss, grads) of the dense, scanned reference: one compile for every variant."""
    cfg = _cfg("model.attention=dense")
    params = nn.unbox(init_params(cfg, jax.random.key(1)))
    return (params, *_value_and_grad(cfg, params))


@pytest.mark.parametrize("extra", [["model.scan_layers=false"], ["model.attention=blockwise", "model.attention_block=8"],
                                   ["model.remat=full"], ["model.remat=dots"]])
def test_variants_match_the_reference(extra):
    params, ref_val, ref_grad = _reference()
    val, grad = _value_and_grad(_cfg(*extra), params)
    np.testing.assert_allclose(val, ref_val, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(ref_grad)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("extra", [["model.mlp=plain", "model.activation=gelu"], ["model.tie_embeddings=false"]])
def test_configurable_blocks_run(extra):
    cfg = _cfg(*extra)
    params = nn.unbox(init_params(cfg, jax.random.key(0)))
    out = _logits(cfg, params, *_batch())
    assert out.shape == (8, 32, 264) and bool(jnp.all(jnp.isfinite(out)))


def test_bf16_compute_with_f32_params():
    f32, bf16 = _cfg(), _cfg("model.compute_dtype=bfloat16")
    params = nn.unbox(init_params(f32, jax.random.key(0)))
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
    a, b = _logits(f32, params, *_batch()), _logits(bf16, params, *_batch())
    assert b.dtype == jnp.float32  # logits are accumulated in float32
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=0.05)


def test_bf16_params():
    cfg = _cfg("model.param_dtype=bfloat16", "model.compute_dtype=bfloat16")
    params = nn.unbox(init_params(cfg, jax.random.key(0)))
    assert all(p.dtype == jnp.bfloat16 for p in jax.tree.leaves(params))
    assert bool(jnp.all(jnp.isfinite(_logits(cfg, params, *_batch()))))
