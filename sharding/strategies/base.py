"""The interface every parallel strategy implements.

A strategy is a compute layout for Transformer layers. It takes the layer's weights in the
unified storage layout (`sharding.layout`) and activations in its boundary layout, and returns
the sub-layer outputs in that boundary layout; whatever gathers, scatters or rings it needs
happen inside. Strategies that share a boundary layout switch from one layer to the next for
free; otherwise the trainer's `enter` pays one resharding at the switch.

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

from sharding.mesh import mesh_roles
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


def axes_entry(axes: tuple[str, ...]):
    """Mesh axes as one PartitionSpec entry (None when empty)."""
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else axes


def all_axes(mesh: Mesh):
    """All mesh axes as one PartitionSpec entry."""
    return axes_entry(tuple(mesh.axis_names))


def batch_entry(mesh: Mesh):
    return axes_entry(mesh_roles(mesh)[0])


def model_entry(mesh: Mesh):
    return axes_entry(mesh_roles(mesh)[1])


def model_size(mesh: Mesh) -> int:
    return math.prod(mesh.shape[a] for a in mesh_roles(mesh)[1])


def batch_size_of(mesh: Mesh) -> int:
    return math.prod(mesh.shape[a] for a in mesh_roles(mesh)[0])


def token_cross_entropy(logits, targets, loss_mask):
    """(sum of masked token NLLs, number of loss tokens) from float32 logits."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    mask = loss_mask.astype(jnp.float32)
    return jnp.sum(nll * mask), jnp.sum(mask)


class Strategy(abc.ABC):
    """Base class: per-layer attention and MLP over the unified layout, plus embed and loss."""

    name: ClassVar[str]

    # -- layouts -----------------------------------------------------------------------------
    @abc.abstractmethod
    def boundary_spec(self, mesh: Mesh) -> P:
        """Layout of [B, S, D] activations entering and leaving this strategy's layers."""

    def token_spec(self, mesh: Mesh) -> P:
        """Layout of [B, S] token-level arrays (ids, segment ids, positions) for this strategy."""
        spec = tuple(self.boundary_spec(mesh))
        return P(*spec[:2])

    # -- checks ------------------------------------------------------------------------------
    def check(self, spec: BlockSpec, mesh: Mesh, batch: int, seq_len: int) -> None:
        """Raise StrategyShapeError naming the strategy and shape if it cannot serve them."""
        self._require_divisible("batch size", batch, batch_size_of(mesh), "the batch-axis size")

    def _require_divisible(self, what: str, value: int, by: int, by_what: str):
        if by > 1 and value % by:
            raise StrategyShapeError(
                f"strategy {self.name!r} needs {what} ({value}) divisible by {by_what} ({by})")

    def _require_kv_split(self, spec: BlockSpec, p: int):
        """K/V heads split over the model group, or replicated across it (`blocks.kv_heads_for_group`)."""
        why = blocks.kv_split_error(spec, p)
        if why:
            raise StrategyShapeError(f"strategy {self.name!r} needs {why}")

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
        """Token embeddings [B, S, D] in the boundary layout (default: gather the table)."""
        x = jnp.take(constrain(table, mesh, P()), constrain(tokens, mesh, self.token_spec(mesh)), axis=0)
        return constrain(x, mesh, self.boundary_spec(mesh))

    def loss_sums(self, x, head, targets, loss_mask, mesh: Mesh):
        """(sum of token NLLs, loss tokens) from final hidden states and the [D, V] head.

        Default: gather the head, logits for the tokens this device holds in the boundary layout.
        """
        head = constrain(head, mesh, P()).astype(x.dtype)
        logits = jnp.einsum("bsd,dv->bsv", x, head, preferred_element_type=jnp.float32)
        tokens = self.token_spec(mesh)
        return token_cross_entropy(constrain(logits, mesh, P(*tuple(self.boundary_spec(mesh))[:2], None)),
                                   constrain(targets, mesh, tokens), constrain(loss_mask, mesh, tokens))

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
        self._require_divisible("batch size", batch, mesh.devices.size, "the device count")

    def layer_weights(self, w, mesh):
        return w

    def attention(self, w, x, segment_ids, positions, spec, mesh):
        w = self.layer_weights(blocks.attention_weights(w), mesh)
        out = blocks.attention_block(w, x, segment_ids, positions, spec)
        return constrain(out, mesh, self.boundary_spec(mesh))

    def mlp(self, w, x, spec, mesh):
        w = self.layer_weights({"w_in": w["w_in"], "w_out": w["w_out"]}, mesh)
        out = blocks.mlp_block(w["w_in"], w["w_out"], x, spec)
        return constrain(out, mesh, self.boundary_spec(mesh))
