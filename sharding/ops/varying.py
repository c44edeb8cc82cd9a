"""Varying-axes bookkeeping inside `jax.shard_map(check_vma=True)`.

A value created inside a shard_map (`jnp.zeros`, a constant) varies over no mesh axis. Scan
carries, `lax.cond` branches and `optimization_barrier` operands must keep one type, so fresh
values are cast to vary over the axes of the data they meet; and a value cast to vary keeps its
gradient a per-device partial sum (the cast transposes to a psum).
"""
from __future__ import annotations

import jax
from jax import lax


def varying_axes(*trees) -> tuple[str, ...]:
    """Mesh axes (sorted) over which any array of `trees` varies; () outside shard_map."""
    axes = set()
    for x in jax.tree.leaves(trees):
        axes |= set(getattr(getattr(jax.typeof(x), "manual_axis_type", None), "varying", ()) or ())
    return tuple(sorted(axes))


def vary(tree, axes):
    """Every array of `tree` cast to vary over `axes` too (a no-op for axes it varies over)."""
    if not axes:
        return tree

    def one(x):
        have = varying_axes(x)
        missing = tuple(a for a in axes if a not in have)
        return lax.pcast(x, missing, to="varying") if missing else x

    return jax.tree.map(one, tree)


def vary_like(tree, *like):
    """`tree` cast to vary over every axis the arrays of `like` vary over."""
    return vary(tree, varying_axes(like))
