"""The ring: blocks passed one device along a ring of mesh devices, fetched before compute.

Per-device schedules for use inside `jax.shard_map`, shared by ring attention (K/V blocks
travel) and METP (weight blocks and head groups travel; its attention runs ring attention).

    shift(tree, ring)                          one hop: device r's blocks to device r + 1
    pipeline(n, first, fetch, compute, state)  state = compute(t, block_t, state) for t < n, each
                                               block_{t+1} = fetch(t, block_t) issued before
                                               compute(t) (double buffering: the transfer
                                               overlaps the compute)
    ring_forward(ring, compute, block, state)  compute over the p blocks of the ring
    ring_backward(ring, compute, block, state) the same, each block's gradient one hop behind it,
                                               home after the last hop

A kernel built on these wraps them in a `jax.custom_vjp` whose backward runs the ring again
(autodiff through a scan of ring steps would keep every visiting block).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
from jax import lax

from sharding.ops.ordering import Ordering
from sharding.ops.varying import vary, varying_axes


@dataclass(frozen=True)
class Ring:
    """The devices a ring runs over: mesh axes `axis` (a tuple) of total size `size`; the batch
    axes its weights are replicated over (their gradients are summed over them); and the
    collective `order` of the mesh, kept by steps whose compute runs collectives of its own."""

    axis: tuple[str, ...]
    size: int
    batch_axes: tuple[str, ...] = ()
    order: Ordering = field(default_factory=Ordering)

    @classmethod
    def over(cls, mesh, axis: tuple[str, ...], batch_axes: tuple[str, ...] = ()) -> "Ring":
        """The ring along `mesh`'s axes `axis`, keeping that mesh's collective order."""
        return cls(tuple(axis), math.prod(mesh.shape[a] for a in axis), tuple(batch_axes),
                   Ordering.for_mesh(mesh))

    @property
    def all_axes(self) -> tuple[str, ...]:
        return self.axis + self.batch_axes


def shift(tree, ring: Ring):
    """Every block sent one device along the ring (r -> r + 1)."""
    p = ring.size
    return lax.ppermute(tree, ring.axis, perm=[(i, (i + 1) % p) for i in range(p)])


def _add(a, b):
    return jax.tree.map(jnp.add, a, b)


def pipeline(n: int, first, fetch, compute, state, order: Ordering = Ordering()):
    """state = compute(t, block_t, state) for t < n, where block_{t+1} = fetch(t, block_t) is
    issued before compute(t) (so its transfer overlaps it) and nothing is fetched after the last.
    With `order` on, compute(t) waits for the fetch."""
    def step(carry, t):
        block, state = carry
        upcoming, block = order.tie_leaves(fetch(t, block), block)
        return (upcoming, compute(t, block, state)), None

    (block, state), _ = lax.scan(step, (first, state), jnp.arange(n - 1))
    return compute(n - 1, block, state)


def ring_forward(ring: Ring, compute, block, state):
    """state = compute(block, state) for the p blocks of the ring, each held in turn."""
    return pipeline(ring.size, block, lambda t, b: shift(b, ring), lambda t, b, s: compute(b, s), state,
                    ring.order)


def ring_backward(ring: Ring, compute, block, state, *, grad_with_block: bool = False):
    """(state, grad) = compute(block, state) for the p blocks of the ring; each block's gradient
    follows one hop behind it, accumulating, and is returned to the block's home device.

    Where a gradient's hop is issued: by default right after its block's compute, in a hop of its
    own, into an accumulator that starts at zero (ring attention); with `grad_with_block`, at the
    start of the next step together with the next block, one collective for both (METP). Each is
    the leaner schedule for its kernel in XLA's buffer assignment; the hops are the same."""
    if grad_with_block:
        return _backward_grad_with_block(ring, compute, block, state)
    axes = tuple(sorted(set(varying_axes(block, state)) | set(ring.axis)))
    grad = vary(jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), jax.eval_shape(compute, block, state)[1]), axes)

    def step(carry, _, last=False):
        state, block, grad = carry
        upcoming = block if last else shift(block, ring)  # the next block, travelling during compute
        state, g = compute(block, state)
        return (state, upcoming, shift(_add(grad, g), ring)), None  # this block's grad, one hop behind

    carry, _ = lax.scan(step, (state, block, grad), None, length=ring.size - 1)
    (state, _, grad), _ = step(carry, None, last=True)  # the last hop: home
    return state, grad


def _backward_grad_with_block(ring: Ring, compute, block, state):
    if ring.size == 1:
        return compute(block, state)
    upcoming = shift(block, ring)
    state, grad = compute(block, state)

    def step(carry, _):
        block, grad, state = carry
        upcoming, grad = shift((block, grad), ring)  # next block; this block's grad so far (one collective)
        state, g = compute(block, state)
        return (upcoming, _add(grad, g), state), None

    (block, grad, state), _ = lax.scan(step, (upcoming, grad, state), None, length=ring.size - 2)
    grad = shift(grad, ring)
    state, g = compute(block, state)
    return state, shift(_add(grad, g), ring)  # the last hop: home
