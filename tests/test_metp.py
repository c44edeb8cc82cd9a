"""`metp`: whole-model step vs the reference, ring kernels vs plain jnp, shape errors, memory, HLO."""
import math
import re
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from sharding.stack import layer_forward, layer_weight_shapes
from sharding.layout import StorageLayout
from sharding.mesh import build_mesh
from sharding.ops import blocks
from sharding.ops.blocks import BlockSpec
from sharding.ops.metp import metp_attention, metp_mlp
from sharding.strategies import StrategyShapeError
from sharding.strategies.base import batch_entry, model_entry
from sharding.strategies.metp import MemoryEfficientTensorParallel
from tests.reference import check_against_reference, packed_batch, relative_error
from tests.ring_reference import broadcast_ring, metp_attention_autodiff, metp_mlp_autodiff

MESHES = [{"data": 8}, {"data": 2, "model": 4}]
TOL = 2e-6


# -- the whole model: one step's loss and grads vs the single-device reference ------------------
@pytest.mark.parametrize("seq", [200, 96])
def test_metp_matches_reference(seq):
    check_against_reference("metp", {"data": 8}, batch=2, seq=seq)


def test_metp_on_2d_mesh_plain_gelu():
    check_against_reference("metp", {"data": 2, "model": 4}, batch=4, seq=96,
                            extra=["model.mlp=plain", "model.activation=gelu"])


# -- kernels alone vs plain jnp ------------------------------------------------------------------
def _setup(axes):
    mesh = build_mesh(axes)
    return mesh, MemoryEfficientTensorParallel().ring(mesh), batch_entry(mesh), model_entry(mesh)


def _assert_close(name, got, want, tol=TOL):
    for i, (g, w) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(want))):
        err = relative_error(g, w)
        assert err <= tol, f"{name}: output {i} rel err {err:.2e}"


def _value_and_grads(fn, ct, *args):
    """(output, grads of sum(output * ct) wrt every argument)."""
    def loss(*a):
        out = fn(*a)
        return jnp.sum(out * ct), out
    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(args))), has_aux=True))(*args)
    return out, grads


@pytest.mark.parametrize("axes", MESHES)
@pytest.mark.parametrize("gated,activation", [(True, "silu"), (False, "gelu")])
def test_mlp_ring_matches_plain(axes, gated, activation):
    mesh, ring, b, m = _setup(axes)
    spec = BlockSpec(n_heads=8, head_dim=4, d_model=32, d_ff=64, gated=gated, activation=activation)
    rng = np.random.default_rng(1)
    x, ct = (jnp.asarray(rng.normal(size=(4, 64, 32)), jnp.float32) for _ in range(2))
    w_in = jnp.asarray(rng.normal(size=(32, 2 if gated else 1, 64)) / 6, jnp.float32)
    w_out = jnp.asarray(rng.normal(size=(64, 32)) / 8, jnp.float32)
    act = P(b, m, None)
    ring_mlp = jax.shard_map(partial(metp_mlp, spec=spec, ring=ring), mesh=mesh,
                             in_specs=(act, P(None, None, m), P(m, None)), out_specs=act)
    got = _value_and_grads(ring_mlp, ct, x, w_in, w_out)
    want = _value_and_grads(lambda x, wi, wo: blocks.mlp_block(wi, wo, x, spec), ct, x, w_in, w_out)
    _assert_close(f"metp mlp ring {axes} gated={gated}", got, want)


@pytest.mark.parametrize("axes,broadcast", [({"data": 8}, "psum"), ({"data": 8}, "ring"),
                                            ({"data": 2, "model": 4}, "psum")])
def test_metp_attention_matches_plain(axes, broadcast):
    mesh, ring, b, m = _setup(axes)
    spec = BlockSpec(n_heads=8, head_dim=4, d_model=32, d_ff=64, attention_block=5)
    rng = np.random.default_rng(3)
    data = packed_batch(4, 64, 3)
    seg, pos = jnp.asarray(data["segment_ids"]), jnp.asarray(data["positions"])
    x, ct = (jnp.asarray(rng.normal(size=(4, 64, 32)), jnp.float32) for _ in range(2))
    w = {"wq": jnp.asarray(rng.normal(size=(32, 8, 4)) / 5, jnp.float32),
         "wkv": jnp.asarray(rng.normal(size=(32, 2, 8, 4)) / 5, jnp.float32),
         "wo": jnp.asarray(rng.normal(size=(8, 4, 32)) / 5, jnp.float32)}
    act, tok = P(b, m, None), P(b, m)
    kernel = (partial(metp_attention, spec=spec, ring=ring) if broadcast == "psum" else  # ring: by autodiff
              partial(metp_attention_autodiff, spec=spec, ring=ring, fetch_group=broadcast_ring))
    specs = {"wq": P(None, m, None), "wkv": P(None, None, m, None), "wo": P(m, None, None)}
    ring_attn = jax.shard_map(kernel, mesh=mesh, in_specs=(act, tok, tok, specs), out_specs=act)
    got = _value_and_grads(lambda x, w: ring_attn(x, seg, pos, w), ct, x, w)
    want = _value_and_grads(lambda x, w: blocks.attention_block(w, x, seg, pos, spec), ct, x, w)
    _assert_close(f"metp attention {axes} broadcast={broadcast}", got, want)


# -- shape errors, before compiling --------------------------------------------------------------
SPEC = BlockSpec(n_heads=8, head_dim=8, d_model=64, d_ff=128)


@pytest.mark.parametrize("axes,spec,batch,seq,message", [
    ({"data": 8}, SPEC, 2, 100, r"strategy 'metp' needs sequence length \(100\) divisible by the model-parallel size \(8\)"),
    ({"data": 8}, BlockSpec(n_heads=4, head_dim=16, d_model=64, d_ff=128), 2, 64,
     r"strategy 'metp' needs n_heads \(4\) divisible by the model-parallel size \(8\)"),
    ({"data": 8}, BlockSpec(n_heads=8, head_dim=8, d_model=64, d_ff=100), 2, 64,
     r"strategy 'metp' needs d_ff \(100\) divisible by the model-parallel size \(8\)"),
    ({"data": 2, "model": 4}, SPEC, 3, 64,
     r"strategy 'metp' needs batch size \(3\) divisible by the batch-axis size \(2\)"),
])
def test_shape_errors(axes, spec, batch, seq, message):
    mesh, strategy = build_mesh(axes), MemoryEfficientTensorParallel()
    with pytest.raises(StrategyShapeError, match=message):
        strategy.check(spec, mesh, batch=batch, seq_len=seq)
    with pytest.raises(StrategyShapeError, match=message):  # also while tracing a layer
        layer = partial(layer_forward, strategy, spec, mesh)
        jax.eval_shape(layer, _layer_weights(spec, mesh), jnp.zeros((batch, seq, spec.d_model)),
                       jnp.zeros((batch, seq), jnp.int32), jnp.zeros((batch, seq), jnp.int32))


# -- compiled figures of one layer ---------------------------------------------------------------
def _layer_weights(spec: BlockSpec, mesh, abstract=False):
    shapes = layer_weight_shapes(spec)
    if not abstract:
        return {n: jnp.zeros(shape) for n, (shape, _) in shapes.items()}
    layout = StorageLayout(mesh)
    return {n: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=layout.sharding(axes, shape))
            for n, (shape, axes) in shapes.items()}


def compile_layer(strategy, spec: BlockSpec, mesh, batch: int, seq: int):
    """One layer's fwd + bwd (grads of weights and input), weights in the storage layout."""
    act = NamedSharding(mesh, strategy.boundary_spec(mesh))
    tok = NamedSharding(mesh, strategy.token_spec(mesh))
    x = jax.ShapeDtypeStruct((batch, seq, spec.d_model), jnp.float32, sharding=act)
    ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=tok)

    def loss(w, x, seg, pos):
        return jnp.sum(layer_forward(strategy, spec, mesh, w, x, seg, pos) ** 2)

    return jax.jit(jax.grad(loss, argnums=(0, 1))).lower(_layer_weights(spec, mesh, True), x, ids, ids).compile()


def device_bytes(compiled) -> int:
    m = compiled.memory_analysis()
    return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes


_ITEM = {"f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2, "pred": 1, "s8": 1, "u8": 1}
_COLLECTIVE = re.compile(r"\s*(?:ROOT )?\S+ = (.+?) "
                         r"(all-gather|all-reduce|collective-permute|all-to-all|reduce-scatter)(?:-start)?\(")


def collectives(hlo: str):
    """[(kind, [bytes of each result array])] of every collective in an HLO text."""
    out = []
    for line in hlo.splitlines():
        match = _COLLECTIVE.match(line)
        if match:
            arrays = re.findall(r"(\w+)\[([\d,]*)\]", match.group(1))
            out.append((match.group(2), [_ITEM[t] * math.prod(int(n) for n in dims.split(",") if n)
                                         for t, dims in arrays]))
    return out


def _kernel_layer_bytes(attention, mlp, spec: BlockSpec, axes, batch: int, seq: int) -> int:
    """Per-device bytes of one layer's fwd + bwd (x + attention, then + MLP) built from METP kernels."""
    mesh, ring, b, m = _setup(axes)
    act, tok = P(b, m, None), P(b, m)
    specs = {"wq": P(None, m, None), "wkv": P(None, None, m, None), "wo": P(m, None, None),
             "w_in": P(None, None, m), "w_out": P(m, None)}

    def local(w, x, seg, pos):
        x = x + attention(x, seg, pos, blocks.attention_weights(w), spec, ring)
        return x + mlp(x, w["w_in"], w["w_out"], spec, ring)

    layer = jax.shard_map(local, mesh=mesh, in_specs=(specs, act, tok, tok), out_specs=act)
    shapes = layer_weight_shapes(spec)
    w = {n: jax.ShapeDtypeStruct(shapes[n][0], jnp.float32, sharding=NamedSharding(mesh, specs[n])) for n in specs}
    x = jax.ShapeDtypeStruct((batch, seq, spec.d_model), jnp.float32, sharding=NamedSharding(mesh, act))
    ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=NamedSharding(mesh, tok))
    grad = jax.grad(lambda w, x, seg, pos: jnp.sum(layer(w, x, seg, pos) ** 2), argnums=(0, 1))
    return device_bytes(jax.jit(grad).lower(w, x, ids, ids).compile())


def test_hand_backward_uses_less_memory_than_autodiff():
    spec = BlockSpec(n_heads=8, head_dim=32, d_model=256, d_ff=1024, attention="blockwise", attention_block=256)
    hand = _kernel_layer_bytes(metp_attention, metp_mlp, spec, {"data": 8}, 1, 2048)
    auto = _kernel_layer_bytes(metp_attention_autodiff, metp_mlp_autodiff, spec, {"data": 8}, 1, 2048)
    print(f"\nmetp one layer fwd+bwd, d=256 s=2048 p=8, per device: hand backward {hand / 2**20:.2f} MiB, "
          f"autodiff {auto / 2**20:.2f} MiB")
    assert 2 * hand < auto, (hand, auto)


@pytest.mark.parametrize("axes", MESHES)
def test_hlo_moves_only_blocks(axes):
    """Rings of collective-permutes; every all-gather / all-reduce is at most one weight block."""
    spec = BlockSpec(n_heads=8, head_dim=8, d_model=64, d_ff=128, attention_block=16)
    mesh = build_mesh(axes)
    strategy = MemoryEfficientTensorParallel()
    batch, seq, p = 4, 256, strategy.ring(mesh).size
    ops = collectives(compile_layer(strategy, spec, mesh, batch, seq).as_text())
    assert any(kind == "collective-permute" for kind, _ in ops), "metp: no collective-permute in the HLO"
    full_weights = [spec.d_model * 3 * spec.n_heads * spec.head_dim * 4, spec.d_model * 2 * spec.d_ff * 4]
    block = max(full_weights) // p
    local_batch = batch // (mesh.devices.size // p)
    gathered_activation = local_batch * seq * spec.d_model * 4
    assert block < min(full_weights + [gathered_activation])
    for kind, sizes in ops:
        if kind in ("all-gather", "all-reduce", "all-to-all"):
            assert max(sizes) <= block, f"metp on {axes}: {kind} of {max(sizes)} bytes (block {block})"


def test_group_broadcast_psum_vs_ring():
    """Both ways of sending a head group's weights compile (forward); print their collectives and memory."""
    spec = BlockSpec(n_heads=8, head_dim=32, d_model=256, d_ff=1024, attention="blockwise", attention_block=256)
    mesh, ring, b, m = _setup({"data": 8})
    group_bytes = 4 * spec.d_model * spec.n_heads * spec.head_dim * 4 // 8  # wq_j + wkv_j + wo_j
    act, tok = P(b, m, None), P(b, m)
    specs = {"wq": P(None, m, None), "wkv": P(None, None, m, None), "wo": P(m, None, None)}
    shapes = layer_weight_shapes(spec)
    w = {n: jax.ShapeDtypeStruct(shapes[n][0], jnp.float32, sharding=NamedSharding(mesh, specs[n])) for n in specs}
    x = jax.ShapeDtypeStruct((1, 2048, spec.d_model), jnp.float32, sharding=NamedSharding(mesh, act))
    ids = jax.ShapeDtypeStruct((1, 2048), jnp.int32, sharding=NamedSharding(mesh, tok))
    figures = {}
    for broadcast, fetch in (("psum", None), ("ring", broadcast_ring)):
        kernel = partial(metp_attention_autodiff, spec=spec, ring=ring, **({} if fetch is None else {"fetch_group": fetch}))
        fn = jax.shard_map(lambda x, seg, pos, w, kernel=kernel: kernel(x, seg, pos, blocks.attention_weights(w)),
                           mesh=mesh, in_specs=(act, tok, tok, specs), out_specs=act)
        compiled = jax.jit(fn).lower(x, ids, ids, w).compile()
        ops = collectives(compiled.as_text())
        group_ops = [(kind, sizes) for kind, sizes in ops if group_bytes // 2 in sizes]  # wkv_j
        figures[broadcast] = device_bytes(compiled)
        print(f"\nbroadcast={broadcast}: {figures[broadcast] / 2**20:.2f} MiB per device (forward); HLO ops moving "
              f"a group block ({group_bytes} B): " + ", ".join(sorted({k for k, _ in group_ops})) +
              f" x{len(group_ops)} call sites")
        expected = "all-reduce" if broadcast == "psum" else "collective-permute"
        assert any(kind == expected for kind, _ in group_ops), (broadcast, group_ops)
