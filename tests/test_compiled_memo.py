"""A module lowered again in the same process reuses the program compiled for it."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from dysejax.compile_watch import compile_counter
from dysejax.compiled_memo import compile_once


def _lowered(scale):
    mesh = Mesh(np.array(jax.devices()), ("d",))
    sharding = NamedSharding(mesh, P("d"))
    fn = jax.jit(lambda x: jnp.tanh(x * scale).sum(), in_shardings=sharding)
    return fn.lower(jax.ShapeDtypeStruct((8 * 4, 3), jnp.float32, sharding=sharding)), mesh


def test_a_second_lowering_of_one_module_compiles_nothing():
    counter = compile_counter()
    lowered, mesh = _lowered(3.0)
    ids = [d.id for d in mesh.devices.flat]
    first, seconds = compile_once(lowered, ids)
    before = counter.xla_compiled
    again, _ = _lowered(3.0)  # a new trace of the same function: JAX's own caches miss
    assert compile_once(again, ids) == (first, seconds) and counter.xla_compiled == before  # its seconds too
    other, _ = _lowered(2.0)  # another constant: another module
    assert compile_once(other, ids)[0] is not first and counter.xla_compiled == before + 1
    assert compile_once(again, ids[::-1])[0] is not first  # the same module on other devices
    x = jax.device_put(np.ones((32, 3), np.float32), NamedSharding(mesh, P("d")))
    assert abs(float(first(x)) - np.tanh(3.0) * 96) < 1e-4
