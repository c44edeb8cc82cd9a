"""Program order for collectives on XLA:CPU: the one platform workaround.

XLA:CPU runs independent operations of a program concurrently, so two collectives with no data
dependence between them can start in different orders on different devices and deadlock (the
runtime aborts the process after 40 s): seen with a run's weight gather or the gathered LM head
next to another run's K/V ring, and with a ring step's next block next to collectives inside
the step. GPU and TPU issue collectives in program order on their streams, where these ties
would only cost overlap. So an `Ordering` is on only for a mesh of CPU devices: its ties route
values through an optimization barrier (whose transpose ties the gradients the same way in the
backward); elsewhere they are the identity.

The layer stack (`sharding.stack`) owns it: it ties each run's and each sub-layer's weights, the
final norm and the head to the activation stream. A ring built for a mesh
(`sharding.ops.ring.Ring`) carries it into the schedules whose steps run collectives of their own.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
from jax import lax


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
