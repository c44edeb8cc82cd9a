"""One [batch, length] batch on the devices: where it lives under a plan, its abstract form (what
programs are compiled against) and its concrete arrays (each process loads only its own block)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding

from dysejax.step import BATCH_KEYS
from sharding.plan import Plan
from sharding.strategies import get_strategy

BATCH_DTYPES = {"inputs": jnp.int32, "targets": jnp.int32, "segment_ids": jnp.int32,
                "positions": jnp.int32, "loss_mask": jnp.float32}


def batch_sharding(plan: Plan, mesh: Mesh) -> NamedSharding:
    """Where a [B, S] input array lives: the first strategy's token layout."""
    return NamedSharding(mesh, get_strategy(plan.runs[0].strategy).token_spec(mesh))


def abstract_batch(batch_size: int, seq_len: int, sharding: NamedSharding) -> dict:
    """The batch as `ShapeDtypeStruct`s under `sharding` (to lower a program against)."""
    return {k: jax.ShapeDtypeStruct((batch_size, seq_len), BATCH_DTYPES[k], sharding=sharding)
            for k in BATCH_KEYS}


def load_batch(data, plan_b, plan: Plan, mesh: Mesh) -> dict:
    """Global device arrays of the batch `plan_b` of `data` under `plan`; this process materialises
    only the block of rows and columns its devices hold (from the global batch plan every
    process shares)."""
    sharding = batch_sharding(plan, mesh)
    shape = (plan_b.batch_size, plan_b.bucket)
    boxes = list(sharding.addressable_devices_indices_map(shape).values())
    (r0, r1), (c0, c1) = [(min(b[d].indices(n)[0] for b in boxes), max(b[d].indices(n)[1] for b in boxes))
                          for d, n in enumerate(shape)]
    arrays = data.materialize(plan_b, rows=slice(r0, r1)).as_dict()
    return {k: jax.make_array_from_process_local_data(sharding, arrays[k][:, c0:c1], shape) for k in BATCH_KEYS}
