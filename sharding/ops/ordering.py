"""Program order for collectives on XLA:CPU.

XLA:CPU runs independent operations of a program concurrently, so two collectives with no data
dependence between them can start in different orders on different devices and deadlock (the
runtime aborts the process after 40 s): seen with a run's weight gather or the gathered LM head
next to another run's K/V ring. GPU and TPU issue collectives in program order on their
streams. On CPU the collectives that stand outside the layer loops are therefore tied to the
activation stream with an optimization barrier, whose transpose ties the gradients the same
way in the backward.
"""
from __future__ import annotations

import jax
from jax import lax


def collectives_run_concurrently() -> bool:
    """Whether the default backend may start independent collectives in any order (XLA:CPU)."""
    return jax.devices()[0].platform == "cpu"


def tie(a, b):
    """(a, b), each released only once both are computed (on XLA:CPU; unchanged elsewhere).

    Outside shard_map only: inside, a barrier's outputs vary over the union of its inputs' axes."""
    if not collectives_run_concurrently():
        return a, b
    return lax.optimization_barrier((a, b))


def tie_leaves(a, b):
    """Like `tie`, leaf i of `a` with leaf i of `b` (trees of one structure and matching types:
    usable inside shard_map)."""
    if not collectives_run_concurrently():
        return a, b
    a_leaves, treedef = jax.tree.flatten(a)
    pairs = [lax.optimization_barrier(pair) for pair in zip(a_leaves, treedef.flatten_up_to(b))]
    return treedef.unflatten([x for x, _ in pairs]), treedef.unflatten([y for _, y in pairs])


def after(x, dep):
    """`x`, released only once `dep` is computed (on XLA:CPU; unchanged elsewhere). Usable inside
    shard_map when `dep` varies over no mesh axis that `x` does not (x keeps its type)."""
    if not collectives_run_concurrently():
        return x
    return lax.optimization_barrier((x, dep))[0]
