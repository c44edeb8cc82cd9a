"""Collectives on XLA:CPU: the one platform workaround, in two parts.

Channels. JAX lowers every collective inside `shard_map` with the same channel id (1). XLA:CPU's
in-process collectives key their rendezvous by (launch, devices, kind, channel id), and its
thunk executor orders only the *starts* of collectives, so two collectives of one kind can be
in flight on a device at once: they then join one rendezvous. More than one arrival per device
aborts the process (`rendezvous.h: Check failed: id < num_threads`), or a round completes with
the wrong mix of participants and leaves the rest waiting for a round that never fills (a
collective's "only 7 of 8 arrived" timeout). `unique_collective_channels` gives every
collective its own channel when lowering for CPU; GPU and TPU lowering is untouched (there
the id only marks a collective as cross-partition).

Ordering. XLA:CPU runs independent operations of a program concurrently, and each collective
blocks a thread until every device arrives. Its executor starts collectives in the program's
order (a loop holding collectives counts as one), so the order must be one XLA keeps; an
executable loaded from the persistent compile cache loses it across loop bodies, which is why
such programs are never loaded on CPU (`dysejax.runtime.persistent_cache_refusal`). An
`Ordering` is on only for a mesh of CPU devices: its ties route values through an optimization
barrier (whose transpose ties the gradients the same way in the backward) so that a run's weight
gathers, the final norm's and the head's collectives follow the previous ones on every device;
elsewhere they are the identity, where they would only cost overlap.

The layer stack (`sharding.stack`) owns the ties: it ties each run's and each sub-layer's
weights, the final norm and the head to the activation stream. A ring built for a mesh
(`sharding.ops.ring.Ring`) carries them into the schedules whose steps run collectives of their
own. `sharding/__init__.py` installs the channels before anything is lowered.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
from jax import lax

# The placeholder id JAX gives every collective it lowers inside shard_map.
_SHARED_CHANNEL = 1


def unique_collective_channels() -> bool:
    """Lower each collective inside `shard_map` with a channel id of its own on CPU (see the
    module docstring); idempotent. False when this JAX's lowering registry is not the one
    this was written for (then `tests/test_collective_channels.py` fails)."""
    global _installed
    if _installed:
        return True
    try:
        from jax._src.lax import parallel  # the collective primitives and their lowering rules
        from jax.extend.core import Primitive
        from jax.interpreters import mlir
    except ImportError:
        return False
    for prim in [p for p in vars(parallel).values() if isinstance(p, Primitive)]:
        entry = mlir._platform_specific_lowerings["cpu"].get(prim) or mlir._lowerings.get(prim)
        if entry is not None:
            # not cacheable: a cached lowering is emitted once and inlined at every use, ids and all
            mlir.register_lowering(prim, _with_fresh_channels(entry.rule), platform="cpu", cacheable=False)
    _installed = True
    return True


_installed = False


def _with_fresh_channels(rule):
    def lowering(ctx, *args, **params):
        outs = rule(ctx, *args, **params)
        for op in _ops_between(args, outs):
            handle = op.attributes["channel_handle"] if "channel_handle" in op.attributes else None
            if handle is not None and _channel(handle).handle == _SHARED_CHANNEL:
                op.attributes["channel_handle"] = _channel(handle).get(ctx.module_context.new_channel(),
                                                                       _channel(handle).channel_type)
        return outs
    return lowering


def _channel(attribute):
    from jax._src.lib.mlir.dialects import hlo
    return hlo.ChannelHandle(attribute)


def _ops_between(inputs, outputs) -> list:
    """The operations a lowering rule emitted: those behind its outputs, back to its inputs."""
    from jax.interpreters.mlir import ir
    stop = set(_leaves(inputs))
    seen, stack = [], list(_leaves(outputs))
    while stack:
        value = stack.pop()
        if value in stop or isinstance(value, ir.BlockArgument):
            continue
        op = value.owner
        op = op.operation if isinstance(op, ir.OpView) else op
        if not isinstance(op, ir.Operation) or op in seen:
            continue
        seen.append(op)
        stack.extend(op.operands)
    return seen


def _leaves(values):
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from _leaves(v)
        else:
            yield v


@dataclass(frozen=True)
class Ordering:
    """Ties that keep collectives in program order where the platform does not (`on`)."""

    on: bool = False

    @classmethod
    def for_mesh(cls, mesh) -> "Ordering":
        """On when `mesh`'s devices may start independent collectives in any order (XLA:CPU)."""
        return cls(mesh is not None and mesh.devices.flat[0].platform == "cpu")

    def tie(self, a, b):
        """(a, b), each released only once both are computed. Outside shard_map only: inside, a
        barrier's outputs vary over the union of its inputs' axes."""
        return lax.optimization_barrier((a, b)) if self.on else (a, b)

    def tie_leaves(self, a, b):
        """Like `tie`, leaf i of `a` with leaf i of `b` (trees of one structure and matching types:
        usable inside shard_map)."""
        if not self.on:
            return a, b
        a_leaves, treedef = jax.tree.flatten(a)
        pairs = [lax.optimization_barrier(pair) for pair in zip(a_leaves, treedef.flatten_up_to(b))]
        return treedef.unflatten([x for x, _ in pairs]), treedef.unflatten([y for _, y in pairs])

    def after(self, x, dep):
        """`x`, released only once `dep` is computed. Usable inside shard_map when `dep` varies over
        no mesh axis that `x` does not (x keeps its type)."""
        return lax.optimization_barrier((x, dep))[0] if self.on else x
