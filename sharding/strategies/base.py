"""The interface every parallel strategy implements.

A strategy is a compute layout for one Transformer layer: it takes the layer's weights in the
unified storage layout and the activations in its boundary layout, and returns the sub-layer
outputs in that boundary layout. Whatever gathers or scatters it needs happen inside.
"""
from __future__ import annotations

import abc
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sharding.ops import blocks
from sharding.ops.blocks import BlockSpec


class StrategyShapeError(ValueError):
    """A strategy cannot serve this shape on this mesh (raised before compiling)."""


def constrain(x, mesh: Mesh, spec: P):
    """Sharding constraint with an explicit mesh (no ambient mesh context needed)."""
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def replicate(tree, mesh: Mesh):
    """Constrain every array of a tree to be replicated (an all-gather from the storage layout)."""
    return jax.tree.map(lambda w: constrain(w, mesh, P()), tree)


def all_axes(mesh: Mesh):
    """All mesh axes as one PartitionSpec entry."""
    names = tuple(mesh.axis_names)
    return names[0] if len(names) == 1 else names


class Strategy(abc.ABC):
    """Base class: per-layer attention and MLP over the unified layout."""

    name: ClassVar[str]

    # -- layouts -----------------------------------------------------------------------------
    @abc.abstractmethod
    def boundary_spec(self, mesh: Mesh) -> P:
        """Layout of [B, S, D] activations entering and leaving this strategy's layers."""

    def token_spec(self, mesh: Mesh) -> P:
        """Layout of [B, S] token-level metadata (segment ids, positions) for this strategy."""
        spec = self.boundary_spec(mesh)
        return P(*tuple(spec)[:2])

    # -- checks ------------------------------------------------------------------------------
    def check(self, spec: BlockSpec, mesh: Mesh, batch: int, seq_len: int) -> None:
        """Raise StrategyShapeError naming the strategy and shape if it cannot serve them."""

    def _require_divisible(self, what: str, value: int, by: int, by_what: str):
        if value % by:
            raise StrategyShapeError(
                f"strategy {self.name!r} needs {what} ({value}) divisible by {by_what} ({by})")

    # -- compute -----------------------------------------------------------------------------
    def run_weights(self, weights, mesh: Mesh):
        """Weights of a whole run of layers before its scan (e.g. gathered once for `dp`)."""
        return weights

    def enter(self, x, segment_ids, positions, mesh: Mesh):
        """Put activations and token metadata into this strategy's boundary layout."""
        return (constrain(x, mesh, self.boundary_spec(mesh)),
                constrain(segment_ids, mesh, self.token_spec(mesh)),
                constrain(positions, mesh, self.token_spec(mesh)))

    def embed(self, table, tokens, mesh: Mesh):
        """Token embeddings [B, S, D] in the boundary layout (default: gather the table)."""
        x = jnp.take(constrain(table, mesh, P()), tokens, axis=0)
        return constrain(x, mesh, self.boundary_spec(mesh))

    def logits(self, x, head, mesh: Mesh):
        """float32 logits [B, S, V] from final hidden states and the [D, V] head."""
        head = constrain(head, mesh, P()).astype(x.dtype)
        out = jnp.einsum("bsd,dv->bsv", x, head, preferred_element_type=jnp.float32)
        return constrain(out, mesh, self.boundary_spec(mesh))

    @abc.abstractmethod
    def attention(self, w, x, segment_ids, positions, spec: BlockSpec, mesh: Mesh):
        """Attention sub-layer output (before the residual add), in the boundary layout."""

    @abc.abstractmethod
    def mlp(self, w, x, spec: BlockSpec, mesh: Mesh):
        """MLP sub-layer output (before the residual add), in the boundary layout."""


class BatchParallel(Strategy):
    """Shared base of `dp` and `fsdp`: batch split over every device, full weights per layer."""

    def boundary_spec(self, mesh: Mesh) -> P:
        return P(all_axes(mesh), None, None)

    def check(self, spec, mesh, batch, seq_len):
        self._require_divisible("batch size", batch, math.prod(mesh.shape.values()), "the device count")

    def layer_weights(self, w, mesh):
        return w

    def attention(self, w, x, segment_ids, positions, spec, mesh):
        w = self.layer_weights({"wqkv": w["wqkv"], "wo": w["wo"]}, mesh)
        out = blocks.attention_block(w["wqkv"], w["wo"], x, segment_ids, positions, spec)
        return constrain(out, mesh, self.boundary_spec(mesh))

    def mlp(self, w, x, spec, mesh):
        w = self.layer_weights({"w_in": w["w_in"], "w_out": w["w_out"]}, mesh)
        out = blocks.mlp_block(w["w_in"], w["w_out"], x, spec)
        return constrain(out, mesh, self.boundary_spec(mesh))
