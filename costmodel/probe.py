"""Compile a stack of layers under one strategy with abstract inputs and read XLA's figures.

This is the ground truth the cost model is fitted to and the benchmarks report: one training
step (forward + backward) of `n_layers` layers, weights in the unified storage layout,
activations in the strategy's boundary layout, nothing executed.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Optional, Sequence, TypeVar

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding

from costmodel.hlo import collective_bytes
from sharding.layout import HEAD_AXES, LAYERS, StorageLayout
from sharding.ops.blocks import BlockSpec
from sharding.plan import Plan, Run
from sharding.stack import layer_weight_shapes, run_layers
from sharding.strategies import get_strategy


T = TypeVar("T")
R = TypeVar("R")


def figures_only_options(mesh: Mesh) -> Optional[dict]:
    """Compiler options for a program compiled only to read its figures, never run: on XLA:CPU
    the LLVM backend at -O0 (less compile time; buffer assignment, so every byte figure, and
    the FLOP count come from the HLO passes before it and do not change)."""
    return {"xla_backend_optimization_level": 0} if mesh.devices.flat[0].platform == "cpu" else None


def compile_workers() -> int:
    """How many programs to compile at once: XLA compiles one program on one thread (lowering
    holds the GIL, compiling releases it), so calibration compiles a few in parallel."""
    return max(1, min(4, os.cpu_count() or 1))


def map_compiling(build: Callable[[T], R], items: Sequence[T], workers: Optional[int] = None) -> Iterator[R]:
    """`build(item)` for every item, up to `compile_workers()` at a time, yielded in order."""
    workers = workers or compile_workers()
    if workers == 1 or len(items) < 2:
        yield from map(build, items)
        return
    with ThreadPoolExecutor(workers) as pool:
        yield from pool.map(build, items)


def layer_step(strategy: str, spec: BlockSpec, mesh: Mesh, batch: int, seq_len: int, n_layers: int = 1,
               remat: Optional[str] = None, param_dtype=jnp.float32, scan: bool = True, figures_only: bool = False):
    """The compiled forward+backward of `n_layers` layers run by `strategy` (not executed;
    `figures_only`: compiled to be read, not run, see `figures_only_options`)."""
    layout = StorageLayout(mesh)
    strat = get_strategy(strategy)
    weights = {}
    for name, (shape, axes) in layer_weight_shapes(spec).items():
        full = (n_layers, *shape)
        weights[name] = jax.ShapeDtypeStruct(full, param_dtype, sharding=layout.sharding((LAYERS, *axes), full))
    x_sharding = NamedSharding(mesh, strat.boundary_spec(mesh))
    tok_sharding = NamedSharding(mesh, strat.token_spec(mesh))
    x = jax.ShapeDtypeStruct((batch, seq_len, spec.d_model), spec.dtype, sharding=x_sharding)
    tok = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32, sharding=tok_sharding)
    plan = Plan((Run(strategy, n_layers, remat),))

    def loss(w, x, seg, pos):
        y = run_layers(plan, w, x, seg, pos, spec, mesh, scan=scan)
        return jnp.sum(y.astype(jnp.float32) ** 2)

    fn = jax.jit(jax.grad(loss, argnums=(0, 1)),
                 out_shardings=({k: v.sharding for k, v in weights.items()}, x_sharding))
    return fn.lower(weights, x, tok, tok).compile(figures_only_options(mesh) if figures_only else None)


def loss_step(strategy: str, spec: BlockSpec, mesh: Mesh, batch: int, seq_len: int, vocab: int, chunk: int,
              param_dtype=jnp.float32):
    """The compiled forward+backward of the loss alone (final hidden states and the [D, V] head
    in the storage layout -> mean token NLL) as `strategy` computes it (compiled to be read, not
    run: `figures_only_options`)."""
    strat = get_strategy(strategy)
    head = jax.ShapeDtypeStruct((spec.d_model, vocab), param_dtype,
                                sharding=StorageLayout(mesh).sharding(HEAD_AXES, (spec.d_model, vocab)))
    x = jax.ShapeDtypeStruct((batch, seq_len, spec.d_model), spec.dtype,
                             sharding=NamedSharding(mesh, strat.boundary_spec(mesh)))
    tok_sharding = NamedSharding(mesh, strat.token_spec(mesh))
    targets = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32, sharding=tok_sharding)
    mask = jax.ShapeDtypeStruct((batch, seq_len), jnp.float32, sharding=tok_sharding)

    def loss(x, head, targets, mask):
        total, count = strat.loss_sums(x, head, targets, mask, mesh, chunk)
        return total / count

    return jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, head, targets, mask).compile(figures_only_options(mesh))


def figures(compiled) -> dict:
    """Per-device bytes (argument/output/temp/total), flops and collective bytes by kind."""
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    out = {"argument": int(mem.argument_size_in_bytes), "output": int(mem.output_size_in_bytes),
           "temp": int(mem.temp_size_in_bytes), "alias": int(mem.alias_size_in_bytes),
           "flops": float((cost or {}).get("flops", 0.0))}
    out["total"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
    out["collectives"] = collective_bytes(compiled.as_text())
    return out
