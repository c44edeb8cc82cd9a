"""The interface every parallel strategy implements.

A strategy is a compute layout for Transformer layers. It takes the layer's weights in the
unified storage layout (`sharding.layout`) and activations in its boundary layout, and returns
the sub-layer outputs in that boundary layout; whatever gathers, scatters or rings it needs
happen inside. Strategies that share a boundary layout switch from one layer to the next for
free; otherwise the trainer's `enter` pays one resharding at the switch.

Its layouts are data (`description.Rules`, logical axis -> mesh role): `boundary` for
activations between sub-layers and token arrays, `compute` for activations where its local
work happens, `weights` for the weights that work uses. Every PartitionSpec below, the
divisibility checks and the `shard_map` specs of the strategies are derived from them. Its
`describe(shape, remat)` says what one layer keeps and moves per device (`Description`), which
is all the cost model knows of it.

Mesh roles (`sharding.mesh.mesh_roles`): batch axes split the batch; model axes form the
model-parallel group of size p that splits sequence, heads or MLP columns.
"""
from __future__ import annotations

import abc
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sharding import layout as L
from sharding.ops import blocks
from sharding.ops.blocks import BlockSpec
from sharding.ops.chunked_loss import chunked_nll_sums, ring_nll_sums
from sharding.ops.ring import Ring
from sharding.ops.vocab_parallel import ring_embed
from sharding.strategies.description import (
    BATCH_ROLE, DEVICES_ROLE, MODEL_ROLE, Description, LayerShape, Rules, axes_entry, role_axes)

__all__ = ["Strategy", "StrategyShapeError", "axes_entry", "constrain", "shard_map"]


class StrategyShapeError(ValueError):
    """A strategy cannot serve this shape on this mesh (raised before compiling)."""


def traced_mesh(mesh: Mesh):
    """`mesh` as the code being traced sees it: inside a shard_map manual over some of its axes
    (a pipeline stage), the context's abstract mesh, where those axes are Manual (JAX requires
    it of nested shard_maps and sharding constraints); otherwise `mesh` itself."""
    ctx = jax.sharding.get_abstract_mesh()
    return ctx if not ctx.empty and ctx.manual_axes and ctx.axis_names == mesh.axis_names else mesh


def constrain(x, mesh: Mesh, spec: P):
    """Sharding constraint with an explicit mesh (no ambient mesh context needed)."""
    return jax.lax.with_sharding_constraint(x, NamedSharding(traced_mesh(mesh), spec))


def shard_map(f, mesh: Mesh, in_specs, out_specs):
    """`jax.shard_map` manual over the strategy's axes (every axis but a pipeline's `stage`,
    which is manual already when a stage runs the strategy)."""
    return jax.shard_map(f, mesh=traced_mesh(mesh), in_specs=in_specs, out_specs=out_specs, check_vma=True,
                         axis_names=frozenset(role_axes(mesh, DEVICES_ROLE)))


def _spec_axes(spec: P) -> set[str]:
    """Mesh axes a PartitionSpec splits over."""
    out = set()
    for entry in spec:
        out |= set(entry) if isinstance(entry, tuple) else ({entry} if entry else set())
    return out


def batch_entry(mesh: Mesh):
    return axes_entry(role_axes(mesh, BATCH_ROLE))


def model_entry(mesh: Mesh):
    return axes_entry(role_axes(mesh, MODEL_ROLE))


def model_size(mesh: Mesh) -> int:
    return math.prod(mesh.shape[a] for a in role_axes(mesh, MODEL_ROLE))


# What a check calls a role's size in its message.
_ROLE_SIZE = {BATCH_ROLE: "the batch-axis size", MODEL_ROLE: "the model-parallel size", DEVICES_ROLE: "the device count"}
# Logical axes whose split the checks verify, with the name and value of their extent.
_CHECKED = ((L.BATCH, "batch size", lambda shape: shape.batch),
            (L.SEQ, "sequence length", lambda shape: shape.seq_len),
            (L.HEADS, "n_heads", lambda shape: shape.spec.n_heads),
            (L.KV_HEADS, "n_kv_heads", None),
            (L.MLP, "d_ff", lambda shape: shape.spec.d_ff))


class Strategy(abc.ABC):
    """Base class: per-layer attention and MLP over the unified layout, plus embed and loss."""

    name: ClassVar[str]
    boundary: ClassVar[Rules]  # activations [B, S, D] between sub-layers, token arrays [B, S]
    compute: ClassVar[Rules]  # activations where the sub-layers' local work happens
    weights: ClassVar[Rules] = Rules()  # the weights that work uses (default: whole)

    # -- layouts -----------------------------------------------------------------------------
    def boundary_spec(self, mesh: Mesh) -> P:
        """Layout of [B, S, D] activations entering and leaving this strategy's layers."""
        return self.boundary.spec(L.ACTIVATION_AXES, mesh)

    def token_spec(self, mesh: Mesh) -> P:
        """Layout of [B, S] token-level arrays (ids, segment ids, positions) for this strategy."""
        return self.boundary.spec(L.TOKEN_AXES, mesh)

    def weight_specs(self, names, mesh: Mesh) -> dict[str, P]:
        """Layouts of these layer weights (names as in `sharding.layout.LAYER_WEIGHT_AXES`) in compute."""
        return {name: self.weights.spec(L.LAYER_WEIGHT_AXES[name], mesh) for name in names}

    def gather(self, w: dict, mesh: Mesh, stacked: bool = False) -> dict:
        """Layer weights (with a leading layers axis if `stacked`) moved from the storage layout
        to the compute layout (GSPMD gathers)."""
        specs = self.weight_specs(w, mesh)
        return {name: constrain(a, mesh, P(None, *specs[name]) if stacked else specs[name]) for name, a in w.items()}

    # -- checks ------------------------------------------------------------------------------
    def check(self, spec: BlockSpec, mesh: Mesh, batch: int, seq_len: int) -> None:
        """Raise StrategyShapeError naming the strategy and shape if it cannot serve them."""
        self.check_shape(LayerShape.of_mesh(spec, mesh, batch, seq_len))

    def check_shape(self, shape: LayerShape) -> None:
        """The check on a mesh given by its role sizes: every logical axis the rules split must
        divide by its role's size (K/V heads may instead be replicated up to whole heads)."""
        for logical, what, value in _CHECKED:
            role = next((r.role(logical) for r in (self.boundary, self.compute, self.weights) if r.role(logical)), None)
            by = shape.size(role) if role else 1
            if by <= 1:
                continue
            if value is None:
                why = blocks.kv_split_error(shape.spec, by)
                if why:
                    raise StrategyShapeError(f"strategy {self.name!r} needs {why}")
            elif value(shape) % by:
                raise StrategyShapeError(
                    f"strategy {self.name!r} needs {what} ({value(shape)}) divisible by {_ROLE_SIZE[role]} ({by})")

    # -- what one layer keeps and moves --------------------------------------------------------
    @abc.abstractmethod
    def describe(self, shape: LayerShape, remat: str = "none") -> Description:
        """What one layer keeps and moves on one device (`sharding.strategies.description`)."""

    def rows(self, shape: LayerShape) -> float:
        """Batch rows of the boundary activation on one device."""
        return shape.batch / self.boundary.split(L.BATCH, shape)

    def boundary_seq(self, shape: LayerShape) -> float:
        """Sequence positions of the boundary activation on one device."""
        return shape.seq_len / self.boundary.split(L.SEQ, shape)

    # -- compute -----------------------------------------------------------------------------
    def run_weights(self, weights, mesh: Mesh):
        """Weights of a whole run of layers before its scan (e.g. gathered once for `dp`)."""
        return weights

    def enter(self, x, segment_ids, positions, mesh: Mesh):
        """Put activations and token metadata into this strategy's boundary layout."""
        tokens = self.token_spec(mesh)
        return (constrain(x, mesh, self.boundary_spec(mesh)), constrain(segment_ids, mesh, tokens),
                constrain(positions, mesh, tokens))

    def embed(self, table, tokens, mesh: Mesh):
        """Token embeddings [B, S, D] in the boundary layout. Default: where the loss's head
        blocks travel a ring (`loss_split`), the table's row blocks travel it too
        (`vocab_parallel.ring_embed`); otherwise the table is gathered."""
        ring = self._vocab_ring(table.shape[0], mesh)
        if ring:
            fn = shard_map(lambda t, ids: ring_embed(t, ids, Ring.over(mesh, ring)), mesh,
                           in_specs=(P(axes_entry(ring), None), self.token_spec(mesh)),
                           out_specs=self.boundary_spec(mesh))
            return fn(table, tokens)
        x = jnp.take(constrain(table, mesh, P()), constrain(tokens, mesh, self.token_spec(mesh)), axis=0)
        return constrain(x, mesh, self.boundary_spec(mesh))

    def _vocab_ring(self, vocab: int, mesh: Mesh) -> tuple[str, ...]:
        """The mesh axes (in the storage layout's order) whose ring the vocabulary's blocks
        travel, per `loss_split`; () when they do not."""
        axes = role_axes(mesh, MODEL_ROLE) + role_axes(mesh, BATCH_ROLE)
        size = lambda group: math.prod(mesh.shape[a] for a in group)  # noqa: E731
        split = size(a for a in axes if a in _spec_axes(self.token_spec(mesh)))
        return axes if self.loss_split(vocab, split, size(axes), model_size(mesh))[0] == "ring" else ()

    def loss_split(self, vocab: int, token_split: int, n_devices: int, p: int) -> tuple[str, int]:
        """How the loss splits the head's vocabulary over devices, given how many ways the tokens
        are split (`token_split`), the device count and the model-parallel size: ("ring", n)
        when every device holds its own tokens and the n devices divide the vocabulary (the
        head's blocks travel a ring), else ("whole", 1) (the head gathered on every device)."""
        if n_devices > 1 and token_split == n_devices and vocab % n_devices == 0:
            return "ring", n_devices
        return "whole", 1

    def loss_sums(self, x, head, targets, loss_mask, mesh: Mesh, chunk: int = 0):
        """(sum of token NLLs, loss tokens) from final hidden states and the [D, V] head, `chunk`
        tokens at a time (`sharding.ops.chunked_loss`; <= 0: one chunk).

        Default: where every device holds its own tokens and the devices divide the vocabulary,
        the head's vocabulary blocks travel a ring of all devices (no device holds the whole
        head or any token's full logits); otherwise the head is gathered.
        """
        ring, tokens = self._vocab_ring(head.shape[1], mesh), self.token_spec(mesh)
        token_axes = tuple(a for a in role_axes(mesh, DEVICES_ROLE) if a in _spec_axes(tokens))

        def local(x, head, targets, mask):
            if ring:
                sums = ring_nll_sums(x, head, targets, mask, chunk, Ring.over(mesh, ring))
            else:
                sums = chunked_nll_sums(x, head, targets, mask, chunk)
            return jax.lax.psum(sums, token_axes) if token_axes else sums

        head_spec = P(None, axes_entry(ring)) if ring else P()
        fn = shard_map(local, mesh, in_specs=(self.boundary_spec(mesh), head_spec, tokens, tokens),
                       out_specs=(P(), P()))
        return fn(x, head, targets, loss_mask)

    @abc.abstractmethod
    def attention(self, w, x, segment_ids, positions, spec: BlockSpec, mesh: Mesh):
        """Attention sub-layer output (before the residual add), in the boundary layout."""

    @abc.abstractmethod
    def mlp(self, w, x, spec: BlockSpec, mesh: Mesh):
        """MLP sub-layer output (before the residual add), in the boundary layout."""
