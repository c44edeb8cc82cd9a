"""`ring` and `ulysses`: one step equals the single-device reference; the ring kernel alone equals
dense attention (forward and grads); shape errors; the custom-VJP ring's memory saving."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from sharding.mesh import build_mesh
from sharding.ops import dense_attention
from sharding.ops.blocks import BlockSpec
from sharding.ops.ring_attention import chunk_index, ring_attention
from sharding.strategies import StrategyShapeError, get_strategy
from tests.reference import check_against_reference, packed_batch, relative_error
from tests.ring_reference import ring_attention_autodiff


# -- whole training step vs the reference ---------------------------------------------------------
@pytest.mark.parametrize("plan", ["ring", "ulysses"])
@pytest.mark.parametrize("mesh_axes,batch,seq", [
    ({"data": 8}, 2, 200),            # p = 8, batch unsplit; chunk 25 (one tile of block 48)
    ({"data": 8}, 2, 96),             # chunk 12
    ({"data": 2, "model": 4}, 4, 200),  # batch over data, ring / all-to-all over model; chunk 50
])                                      # > block 48: the ring works in padded 48 x 48 tiles
def test_matches_reference(plan, mesh_axes, batch, seq):
    check_against_reference(plan, mesh_axes, batch=batch, seq=seq)


def test_mixed_ring_ulysses_plan_matches_reference():
    # One boundary layout: no resharding between the runs. Full remat re-runs the ring forward.
    check_against_reference([["ring", 1], ["ulysses", 1]], {"data": 8}, batch=2, seq=96,
                            extra=["model.remat=full"])


# -- the ring kernel alone -------------------------------------------------------------------------
def _ring_vs_dense(mesh_axes, ring_axes, *, B=2, S=96, H=4, D=16, tile=None, permute=False,
                   kernel=ring_attention):
    """Max relative errors (out, dq, dk, dv) of the ring kernel vs dense attention."""
    mesh = build_mesh(mesh_axes)
    batch_axes = tuple(a for a in mesh.axis_names if a not in ring_axes) or None
    ring_entry = ring_axes[0] if len(ring_axes) == 1 else ring_axes
    p = int(np.prod([mesh.shape[a] for a in ring_axes]))
    rng = np.random.default_rng(1)
    q, k, v, ct = (jnp.asarray(rng.normal(size=(B, S, H, D)), jnp.float32) for _ in range(4))
    seg = packed_batch(B, S, seed=2)["segment_ids"]
    index = np.broadcast_to(np.arange(S, dtype=np.int32), (B, S))
    if permute:  # zigzag chunks: the kernel must follow the indices, not the chunk order
        half = S // (2 * p)
        order = np.concatenate([np.r_[r * half:(r + 1) * half, S - (r + 1) * half:S - r * half]
                                for r in range(p)])
        q, k, v, ct = (x[:, order] for x in (q, k, v, ct))
        seg, index = seg[:, order], index[:, order]
    seg, index = jnp.asarray(seg), jnp.asarray(np.ascontiguousarray(index))

    def dense(q, k, v):
        return dense_attention(q, k, v, q_segment_ids=seg, kv_segment_ids=seg, q_index=index,
                               kv_index=index)

    def local(q, k, v, seg, index):
        return kernel(q, k, v, axis_name=ring_entry, axis_size=p, q_segment_ids=seg,
                      kv_segment_ids=seg, q_index=index, kv_index=index, q_block_size=tile,
                      kv_block_size=tile)

    spec4, spec2 = P(batch_axes, ring_entry, None, None), P(batch_axes, ring_entry)
    sm = jax.shard_map(local, mesh=mesh, in_specs=(spec4, spec4, spec4, spec2, spec2),
                       out_specs=spec4, check_vma=True)

    def ring(q, k, v):
        return sm(q, k, v, seg, index)

    errs = []
    for f in (dense, ring):
        out = jax.jit(f)(q, k, v)
        grads = jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * ct), argnums=(0, 1, 2)))(q, k, v)
        errs.append((out, *grads))
    return [relative_error(r, d) for r, d in zip(errs[1], errs[0])]


@pytest.mark.parametrize("mesh_axes,ring_axes,tile,permute", [
    ({"data": 2, "model": 4}, ("model",), 7, False),          # tiles 7 x 7 of chunk 24 (padded)
    ({"data": 2, "seq": 2, "model": 2}, ("seq", "model"), None, False),  # ring over two axes
    ({"data": 2, "model": 4}, ("model",), 5, True),           # zigzag (non-contiguous) indices
])
def test_ring_kernel_matches_dense_attention(mesh_axes, ring_axes, tile, permute):
    errs = _ring_vs_dense(mesh_axes, ring_axes, tile=tile, permute=permute)
    assert max(errs) <= 1e-5, f"ring kernel on {mesh_axes}, tile {tile}: (out, dq, dk, dv) rel err {errs}"


def test_ring_autodiff_variant_matches_dense_attention():
    errs = _ring_vs_dense({"data": 2, "model": 4}, ("model",), tile=7, kernel=ring_attention_autodiff)
    assert max(errs) <= 1e-5, f"autodiff ring: (out, dq, dk, dv) rel err {errs}"


# -- shape errors ----------------------------------------------------------------------------------
SPEC = BlockSpec(n_heads=8, head_dim=8, d_model=64, d_ff=128)


@pytest.mark.parametrize("name", ["ring", "ulysses"])
def test_sequence_length_must_divide(name):
    with pytest.raises(StrategyShapeError, match=rf"^strategy '{name}' needs sequence length \(100\) "
                                                 r"divisible by the model-parallel size \(8\)$"):
        get_strategy(name).check(SPEC, build_mesh({"data": 8}), batch=2, seq_len=100)


@pytest.mark.parametrize("name", ["ring", "ulysses"])
def test_batch_must_divide_batch_axes(name):
    with pytest.raises(StrategyShapeError, match=rf"^strategy '{name}' needs batch size \(3\) "
                                                 r"divisible by the batch-axis size \(2\)$"):
        get_strategy(name).check(SPEC, build_mesh({"data": 2, "model": 4}), batch=3, seq_len=64)


def test_ulysses_heads_must_divide():
    spec = BlockSpec(n_heads=6, head_dim=8, d_model=48, d_ff=128)
    with pytest.raises(StrategyShapeError, match=r"^strategy 'ulysses' needs n_heads \(6\) "
                                                 r"divisible by the model-parallel size \(8\)$"):
        get_strategy("ulysses").check(spec, build_mesh({"data": 8}), batch=2, seq_len=64)
    get_strategy("ring").check(spec, build_mesh({"data": 8}), batch=2, seq_len=64)  # ring: any heads


def test_shapes_that_fit_pass():
    for name in ("ring", "ulysses"):
        get_strategy(name).check(SPEC, build_mesh({"data": 2, "model": 4}), batch=4, seq_len=96)


# -- memory: custom VJP vs autodiff through the ring ----------------------------------------------
def _grad_temp_bytes(kernel, *, S=2048, B=1, H=8, D=64):
    mesh = build_mesh({"data": 8})
    spec4, spec2 = P(None, "data", None, None), P(None, "data")

    def local(q, k, v, seg):
        index = chunk_index(B, S // 8, "data")
        return kernel(q, k, v, axis_name="data", axis_size=8, q_segment_ids=seg, kv_segment_ids=seg,
                      q_index=index, kv_index=index)

    sm = jax.shard_map(local, mesh=mesh, in_specs=(spec4, spec4, spec4, spec2), out_specs=spec4,
                       check_vma=True)
    x = jax.ShapeDtypeStruct((B, S, H, D), jnp.float32, sharding=NamedSharding(mesh, spec4))
    seg = jax.ShapeDtypeStruct((B, S), jnp.int32, sharding=NamedSharding(mesh, spec2))
    grad = jax.grad(lambda q, k, v, s: jnp.sum(sm(q, k, v, s)), argnums=(0, 1, 2))
    return jax.jit(grad).lower(x, x, x, seg).compile().memory_analysis().temp_size_in_bytes


def test_custom_vjp_ring_uses_less_memory_than_autodiff():
    custom, autodiff = _grad_temp_bytes(ring_attention), _grad_temp_bytes(ring_attention_autodiff)
    print(f"\nring attention grad, s=2048, p=8, h=8x64, per-device temp: custom_vjp "
          f"{custom / 2**20:.1f} MiB, autodiff through the ring {autodiff / 2**20:.1f} MiB "
          f"({autodiff / custom:.1f}x)")
    assert custom < 0.5 * autodiff, (custom, autodiff)
