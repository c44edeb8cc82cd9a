"""Every collective of a compiled program has a channel id of its own (sharding/ops/ordering.py).

JAX lowers every collective inside shard_map with channel id 1; XLA:CPU keys its in-process
rendezvous by that id, so two collectives of one kind in flight at once on a device joined one
rendezvous and aborted the process (or mixed their data and deadlocked)."""
import re
from collections import Counter

import jax
import pytest
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from costmodel.hlo import shared_channel_collectives, unordered_collectives
from sharding.ops.ordering import unique_collective_channels

COLLECTIVE = re.compile(r"\s(all-reduce|all-gather|reduce-scatter|collective-permute|all-to-all)(-start)?\(.*"
                        r"channel_id=(\d+)")


def channel_ids(hlo_text: str) -> Counter:
    """(kind, channel id) -> how many collectives of the compiled HLO carry it."""
    return Counter((m.group(1), m.group(3)) for m in map(COLLECTIVE.search, hlo_text.splitlines()) if m)


HLO = """ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %a = f32[8]{0} collective-permute(%p), channel_id={A}, source_target_pairs={{0,1},{1,0}}
  %b = f32[8]{0} collective-permute(%p), channel_id={B}, source_target_pairs={{0,1},{1,0}}
  ROOT %c = f32[8]{0} add(%a, %b)
}
"""


def test_collectives_sharing_a_rendezvous_key_are_found():
    """Two permutes no data orders: on one channel they share XLA:CPU's rendezvous key."""
    same = HLO.replace("{A}", "1").replace("{B}", "1")
    assert shared_channel_collectives(same) == [("main", "a", "b", (("collective-permute", "1"),))]
    assert shared_channel_collectives(HLO.replace("{A}", "1").replace("{B}", "2")) == []
    assert len(unordered_collectives(same)) == 1


def test_installed():
    assert unique_collective_channels()  # sharding/__init__.py installed it: this JAX has the registry


def test_collectives_inside_shard_map_get_distinct_channels():
    mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    perm = [(i, (i + 1) % 8) for i in range(8)]

    def body(x):
        a = jax.lax.ppermute(x, "d", perm)
        b = jax.lax.ppermute(2 * x, "d", perm)  # the same shape: a cached lowering would repeat the id
        c = jax.lax.psum(x, "d") + jax.lax.psum(3 * x, "d")
        g = jax.lax.all_gather(x, "d", tiled=True)[: x.shape[0]]
        t = jax.lax.all_to_all(x, "d", 0, 0, tiled=True)
        return a + b + c + g + t

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("d"), out_specs=P("d")))
    x = jnp.arange(64 * 8, dtype=jnp.float32).reshape(64, 8)
    ids = channel_ids(f.lower(x).compile().as_text())
    assert {kind for kind, _ in ids} == {"all-reduce", "all-gather", "collective-permute", "all-to-all"}, ids
    assert all(n == 1 for n in ids.values()), ids
    perm_x = jnp.roll(x.reshape(8, 8, 8), 1, axis=0).reshape(64, 8)
    total = x.reshape(8, 8, 8).sum(0)
    want = 3 * perm_x + 4 * jnp.tile(total, (8, 1)) + x[:8].reshape(1, 8, 8).repeat(8, 0).reshape(64, 8)
    got = f(x) - jax.jit(jax.shard_map(lambda x: jax.lax.all_to_all(x, "d", 0, 0, tiled=True), mesh=mesh,
                                       in_specs=P("d"), out_specs=P("d")))(x)
    assert jnp.allclose(got, want), "the collectives' values changed"


@pytest.mark.parametrize("plan", [
    "ring:1,metp:1",  # the K/V ring in both runs: 74 collectives shared id 1 in such a step
    pytest.param("dp:1,fsdp:1,tp:1,tp_sp:1,ring:1,ulysses:1,metp:1", marks=pytest.mark.slow),
])
def test_train_step_collectives_have_distinct_channels(tiny_config, plan):
    """A train program of a mixed plan (every strategy, one layer each, in the slow case): no two
    collectives share a channel id."""
    from dysejax.build import build

    n_layers = plan.count(",") + 1
    cfg = tiny_config(f"model.n_layers={n_layers}", f"parallel.plan={plan}", "data.buckets=[64]", "data.eval_batches=0")
    setup = build(cfg, None, verbose=False)
    program = setup.programs.get("train", 64, setup.data.batch_size(64), setup.planner.parse(plan))
    ids = channel_ids(program.compiled.as_text())
    assert sum(ids.values()) > 10 and ("collective-permute" in {kind for kind, _ in ids}), ids
    shared = {key: n for key, n in ids.items() if n > 1}
    assert not shared, f"collectives sharing a channel id in the {plan} step: {shared}"
    text = program.compiled.as_text()
    assert unordered_collectives(text), "expected collectives that may overlap (K and V of a ring step)"
    assert shared_channel_collectives(text) == []
