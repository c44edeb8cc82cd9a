"""Compiled programs, one per (kind, bucket length, batch size, plan), built ahead of time.

Each program is lowered from abstract inputs (`ShapeDtypeStruct`s with shardings) and compiled
once; its XLA per-device memory and cost figures are recorded with it. `select` picks, per
bucket, the first candidate plan whose program fits the per-device memory budget: a program
over budget is never run.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from dysejax.batches import abstract_batch, batch_sharding
from dysejax.compiled_memo import compile_once
from dysejax.errors import PlanError
from sharding.plan import Plan


@dataclass(frozen=True)
class ProgramKey:
    kind: str  # "train" | "eval"
    seq_len: int
    batch_size: int
    plan_id: str


@dataclass
class Program:
    """A compiled step with the figures XLA reports for it (per device)."""

    key: ProgramKey
    plan: Plan
    compiled: Any  # jax.stages.Compiled
    compile_s: float  # lowering + XLA's compile (also when an identical module compiled earlier: compiled_memo)
    memory: dict = field(default_factory=dict)
    flops: float = 0.0
    horizon: Callable[[], int] = lambda: 1  # train programs: the lr-schedule horizon to pass when none is

    @property
    def bytes_per_device(self) -> int:
        """argument + output + temp - alias bytes: what one device needs to run it."""
        m = self.memory
        return m["argument"] + m["output"] + m["temp"] - m["alias"]

    def __call__(self, *args):
        """Run it: (params, batch) for eval; (state, batch[, horizon]) for train, where the
        horizon defaults to the cache's current one."""
        if self.key.kind == "train" and len(args) == 2:
            args = (*args, np.int32(self.horizon()))
        return self.compiled(*args)


def gib(n_bytes: Optional[int]) -> str:
    """Bytes as GiB to four significant digits (a budget of a few MiB stays readable)."""
    return "unlimited" if n_bytes is None else f"{n_bytes / 2**30:.4g} GiB"


def _figures(compiled) -> tuple[dict, float]:
    mem = compiled.memory_analysis()
    memory = {"argument": int(mem.argument_size_in_bytes), "output": int(mem.output_size_in_bytes),
              "temp": int(mem.temp_size_in_bytes), "alias": int(mem.alias_size_in_bytes)}
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return memory, float((cost or {}).get("flops", 0.0))


class ProgramCache:
    """Builds and keeps the train/eval programs of one trainer."""

    def __init__(self, mesh: Mesh, state_abstract, state_shardings,
                 make_train: Callable[[Plan], Callable], make_eval: Callable[[Plan], Callable]):
        self.mesh = mesh
        self.state_abstract, self.state_shardings = state_abstract, state_shardings
        self.make_train, self.make_eval = make_train, make_eval
        self.programs: dict[ProgramKey, Program] = {}
        self.selected: dict[tuple[str, int, int], Program] = {}
        self.horizon = 1  # the lr-schedule horizon train programs get when a call passes none

    def get(self, kind: str, seq_len: int, batch_size: int, plan: Plan) -> Program:
        """The program for this key, compiling it on first request."""
        key = ProgramKey(kind, seq_len, batch_size, plan.id)
        if key not in self.programs:
            self.programs[key] = self._compile(key, plan)
        return self.programs[key]

    def select(self, kind: str, seq_len: int, batch_size: int, candidates: list[Plan],
               budget: Optional[int]) -> Program:
        """Compile candidates in order; keep and return the first within `budget` bytes per device."""
        needs = []
        for plan in candidates:
            program = self.get(kind, seq_len, batch_size, plan)
            if budget is None or program.bytes_per_device <= budget:
                self.selected[(kind, seq_len, batch_size)] = program
                return program
            needs.append(f"{plan.id} needs {gib(program.bytes_per_device)}")
        raise PlanError(f"bucket {seq_len} (batch {batch_size}, {kind}): no plan fits the memory budget of "
                        f"{gib(budget)} per device ({'; '.join(needs)}): raise parallel.memory_budget_gb, "
                        f"lower data.tokens_per_batch or drop the bucket")

    def selected_program(self, kind: str, seq_len: int, batch_size: int) -> Optional[Program]:
        return self.selected.get((kind, seq_len, batch_size))

    def _compile(self, key: ProgramKey, plan: Plan) -> Program:
        replicated = NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        bsh = batch_sharding(plan, self.mesh)
        batch = abstract_batch(key.batch_size, key.seq_len, bsh)
        t0 = time.perf_counter()
        if key.kind == "train":  # state, batch, lr-schedule horizon (an input: see dysejax.step)
            fn = jax.jit(self.make_train(plan), in_shardings=(self.state_shardings, bsh, replicated),
                         out_shardings=(self.state_shardings, replicated), donate_argnums=0)
            lowered = fn.lower(self.state_abstract, batch, jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated))
        else:
            params = self.state_abstract["params"]
            fn = jax.jit(self.make_eval(plan), in_shardings=(self.state_shardings["params"], bsh),
                         out_shardings=replicated)
            lowered = fn.lower(params, batch)
        lowering_s = time.perf_counter() - t0
        compiled, xla_s = compile_once(lowered, [d.id for d in self.mesh.devices.flat])
        memory, flops = _figures(compiled)
        return Program(key, plan, compiled, lowering_s + xla_s, memory, flops, lambda: self.horizon)
