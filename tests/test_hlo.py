"""Collective accounting from compiled HLO, loops included."""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from costmodel.hlo import collective_stats, unordered_collectives
from sharding.mesh import build_mesh


def test_loop_collectives_count_per_iteration():
    mesh = build_mesh({"data": 8})
    ring = [(i, (i + 1) % 8) for i in range(8)]

    def f(x):
        def body(c, _):
            return jax.lax.ppermute(c, "data", ring) * 2, None
        c, _ = jax.lax.scan(body, x, None, length=5)
        g = jax.lax.all_gather(c, "data", tiled=True)
        return jax.lax.psum(c, "data"), g

    fn = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("data"), out_specs=(P(), P()), check_vma=False))
    stats = collective_stats(fn.lower(jnp.ones((64, 16))).compile().as_text())
    block = 8 * 16 * 4  # one device's [8, 16] f32 block
    assert stats["collective-permute"] == {"count": 5, "bytes": 5 * block}
    assert stats["all-reduce"] == {"count": 1, "bytes": block}
    assert stats["all-gather"] == {"count": 1, "bytes": 8 * block}
    assert stats["all-to-all"]["count"] == 0 and stats["reduce-scatter"]["count"] == 0


def test_unordered_collectives_are_found_and_a_barrier_orders_them():
    """Two all-gathers of independent inputs are unordered; tied through a barrier they are not."""
    from jax.sharding import NamedSharding

    from sharding.ops.ordering import Ordering
    mesh = build_mesh({"data": 8})
    sh = NamedSharding(mesh, P("data"))

    def gathers(a, b, order):
        ga = jax.lax.with_sharding_constraint(a * 2, NamedSharding(mesh, P()))
        if order:
            ga, b = Ordering.for_mesh(mesh).tie(ga, b)
        gb = jax.lax.with_sharding_constraint(b * 3, NamedSharding(mesh, P()))
        return ga.sum() + gb.sum()

    x = jax.ShapeDtypeStruct((64, 16), jnp.float32, sharding=sh)
    free = jax.jit(lambda a, b: gathers(a, b, False)).lower(x, x).compile().as_text()
    tied = jax.jit(lambda a, b: gathers(a, b, True)).lower(x, x).compile().as_text()
    assert any("all-gather" in a and "all-gather" in b for _, a, b in unordered_collectives(free))
    assert unordered_collectives(tied) == []
