"""Collective accounting from compiled HLO, loops included."""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from costmodel.hlo import collective_stats
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
