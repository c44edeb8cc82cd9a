"""Grouped-query and multi-query attention (`model.n_kv_heads`): kernels, strategies, checks.

The kernels attend with G < H K/V heads without repeating them; they must equal plain attention
over K/V repeated to H heads. Every strategy and mixed plans must equal the single-device
reference, both where the model group splits the K/V heads (G divisible by p) and where it
replicates them (p divisible by G, Megatron-style).
"""
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dysejax.config import load_config
from dysejax.errors import ConfigError
from sharding.mesh import build_mesh
from sharding.ops.attention import blockwise_attention, dense_attention
from sharding.ops.blocks import BlockSpec
from sharding.strategies import StrategyShapeError, get_strategy
from tests.conftest import TINY
from tests.reference import check_against_reference, packed_batch, relative_error


def _value_and_grads(f, *args):
    ct = jnp.asarray(np.random.default_rng(9).normal(size=f(*args).shape), jnp.float32)
    out, vjp = jax.vjp(f, *args)
    return [out, *vjp(ct)]


@pytest.mark.parametrize("kernel", ["dense", "blockwise"])
@pytest.mark.parametrize("groups", [1, 2])
def test_grouped_kernels_equal_repeated_kv(kernel, groups):
    """Attention with G K/V heads == attention with each K/V head repeated H/G times (fwd, grads)."""
    rng = np.random.default_rng(0)
    B, S, H, D = 2, 40, 4, 8
    q = jnp.asarray(rng.normal(size=(B, S, H, D)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(B, S, groups, D)), jnp.float32) for _ in range(2))
    seg = jnp.asarray(packed_batch(B, S, 1)["segment_ids"])
    attend = (partial(blockwise_attention, block_size=16) if kernel == "blockwise" else dense_attention)
    attend = partial(attend, q_segment_ids=seg, kv_segment_ids=seg)
    rep = H // groups
    got = _value_and_grads(lambda q, k, v: attend(q, k, v), q, k, v)
    want = _value_and_grads(lambda q, k, v: attend(q, jnp.repeat(k, rep, axis=2), jnp.repeat(v, rep, axis=2)), q, k, v)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert a.shape == b.shape, (name, a.shape, b.shape)
        assert relative_error(a, b) <= 1e-5, f"{kernel} G={groups}: {name} rel err {relative_error(a, b):.2e}"


# -- strategies against the single-device reference (loss and grads <= 1e-5) --------------------
# On {"data": 8} the model group is all 8 devices: G=2 K/V heads are replicated 4x. On a
# {"data": 2, "model": 4} mesh G=4 heads are split one per device, G=1 (multi-query) replicated.
@pytest.mark.parametrize("plan, axes, kv, layers, batch", [
    pytest.param([["tp_sp", 1], ["ulysses", 1], ["metp", 1], ["ring", 1]], {"data": 8}, 2, 4, 2, marks=pytest.mark.slow),
    pytest.param([["tp", 1], ["metp", 1], ["ulysses", 1]], {"data": 2, "model": 4}, 4, 3, 4, marks=pytest.mark.slow),
    ([["dp", 1], ["fsdp", 1]], {"data": 8}, 1, 2, 8),
])
def test_mixed_plans_with_grouped_kv_match_reference(plan, axes, kv, layers, batch):
    check_against_reference(plan, axes, batch=batch, seq=64,
                            extra=[f"model.n_kv_heads={kv}", f"model.n_layers={layers}"])


@pytest.mark.slow
@pytest.mark.parametrize("plan", ["fsdp", "tp", "tp_sp", "ring", "ulysses", "metp"])
@pytest.mark.parametrize("kv", [1, 2])
def test_each_strategy_with_grouped_kv_matches_reference(plan, kv):
    # batch 8: fsdp splits the batch over all 8 devices
    check_against_reference(plan, {"data": 2, "model": 4}, batch=8, seq=96, extra=[f"model.n_kv_heads={kv}"])


def test_grouped_kv_needs_heads_that_split_over_the_group():
    spec = BlockSpec(n_heads=24, head_dim=4, d_model=96, d_ff=128, n_kv_heads=3)
    for name in ("tp", "tp_sp", "ulysses", "metp"):
        with pytest.raises(StrategyShapeError, match=rf"^strategy '{name}' needs n_kv_heads \(3\) to divide or be "
                                                     r"divisible by the model-parallel size \(8\)$"):
            get_strategy(name).check(spec, build_mesh({"data": 8}), batch=8, seq_len=64)
    for name in ("dp", "fsdp", "ring"):  # full K/V heads on every device
        get_strategy(name).check(spec, build_mesh({"data": 8}), batch=8, seq_len=64)


def test_n_kv_heads_must_divide_n_heads():
    with pytest.raises(ConfigError, match=r"^model.n_kv_heads \(3\) must be positive and divide model.n_heads \(8\)$"):
        load_config(TINY, ["model.n_kv_heads=3"])


def test_cost_model_prices_the_smaller_kv():
    """Fewer K/V heads: fewer weight bytes, smaller stored activations and ring / all-to-all
    traffic; predicted memory stays within the shipped bound of XLA's figure."""
    from dataclasses import replace

    from costmodel import memory as M
    from costmodel import time as T
    from costmodel.probe import figures, layer_step

    mha = BlockSpec(n_heads=8, head_dim=32, d_model=256, d_ff=768, attention_block=256)
    gqa = replace(mha, n_kv_heads=2)
    assert M.layer_param_elems(gqa, 8)[1] == M.layer_param_elems(mha, 8)[1] - 2 * 6 * 256 * 32
    for strategy in ("dp", "tp", "ring", "ulysses", "metp"):
        small, big = (M.plan_layer_bytes(M.Shape(s, {"data": 8}, 8, 1024, backend="cpu"), strategy, "none", 3)
                      for s in (gqa, mha))
        assert small < big, strategy
    ring = {name: T.layer_work(M.Shape(s, {"data": 8}, 8, 1024), "ring") for name, s in (("gqa", gqa), ("mha", mha))}
    kv_bytes = {name: w.ring_steps[0][1] for name, w in ring.items()}
    assert kv_bytes["gqa"] == kv_bytes["mha"] / 4  # K/V blocks of 2 heads instead of 8
    mesh = build_mesh({"data": 8})
    for strategy in ("ring", "tp"):
        xla = figures(layer_step(strategy, gqa, mesh, 8, 256, n_layers=3))["total"]
        pred = M.plan_layer_bytes(M.Shape(gqa, {"data": 8}, 8, 256, backend="cpu"), strategy, "none", 3)
        assert abs(pred - xla) / xla < 0.10, (strategy, pred, xla)
