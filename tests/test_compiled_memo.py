"""A module lowered again in the same process reuses the program compiled for it."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
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


def test_one_module_text_under_two_pytrees_is_two_programs():
    """adam's and adabelief's states lower to the same module text; a program compiled for one
    pytree refuses the other, so each gets its own (a notebook switching optimizers)."""
    params = {"w": jnp.ones(3)}
    step = jax.jit(lambda state, x: jax.tree_util.tree_map(lambda a: a + x, state))
    states = [optax.adam(1e-3).init(params), optax.adabelief(1e-3).init(params)]
    lowered = [step.lower(s, 1.0) for s in states]
    assert lowered[0].as_text() == lowered[1].as_text()
    ids = [d.id for d in jax.devices()[:1]]
    programs = [compile_once(low, ids)[0] for low in lowered]
    assert programs[0] is not programs[1]
    for program, state in zip(programs, states):
        out = program(state, 1.0)
        assert type(out[0]) is type(state[0]) and float(out[0].mu["w"][0]) == 1.0
