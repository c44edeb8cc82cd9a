"""The unified storage layout: where every parameter and optimizer-state tensor lives.

Parameters carry logical axis names (declared by the model); this table maps them to mesh
axes. Every strategy reads the same stored tensors, so switching strategy between layers or
batches moves no parameters. As in ParaDySe, each weight is stored once, split over all
devices along its head / MLP-column / vocab dimension (Megatron's column and row blocks);
strategies that compute with another layout gather inside the step. On a mesh with a
pipeline `stage` axis, the stacked layers axis is split over `stage` (when it divides it), so
each stage stores the weights of its own contiguous block of layers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sharding.mesh import STAGE_AXIS, mesh_roles

# Logical axis names of parameters and activations.
LAYERS, VOCAB, EMBED, QKV, HEADS, KV_HEADS, HEAD_DIM, GATE, MLP = (
    "layers", "vocab", "embed", "qkv", "heads", "kv_heads", "head_dim", "gate", "mlp")
BATCH, SEQ = "batch", "seq"

# Logical axes of activations, token-level arrays, one layer's weights (without the stacked
# layers axis), the embedding table and the output head.
ACTIVATION_AXES = (BATCH, SEQ, EMBED)
TOKEN_AXES = (BATCH, SEQ)
ATTENTION_AXES = (BATCH, SEQ, HEADS, HEAD_DIM)
LAYER_WEIGHT_AXES = {
    "attn_norm": (EMBED,),
    "wq": (EMBED, HEADS, HEAD_DIM),
    "wkv": (EMBED, QKV, KV_HEADS, HEAD_DIM),
    "wo": (HEADS, HEAD_DIM, EMBED),
    "mlp_norm": (EMBED,),
    "w_in": (EMBED, GATE, MLP),
    "w_out": (MLP, EMBED),
}
EMBEDDING_AXES = (VOCAB, EMBED)
HEAD_AXES = (EMBED, VOCAB)

# Storage rules, in priority order: the first logical axis a parameter has whose size the
# device count divides is split over all mesh axes; parameters with one non-layer axis (norm
# scales) and those no rule fits are replicated.
STORAGE_PRIORITY: tuple[str, ...] = (HEADS, KV_HEADS, MLP, VOCAB, EMBED)


@dataclass(frozen=True)
class StorageLayout:
    """Storage placement of state tensors over `mesh`, sharded over `axes` (default: all)."""

    mesh: Mesh
    axes: Optional[tuple[str, ...]] = None
    priority: tuple[str, ...] = STORAGE_PRIORITY

    @property
    def shard_axes(self) -> tuple[str, ...]:
        """Model-parallel axes first, then batch axes: a gather over the batch axes then yields
        each model-parallel device's contiguous block (FSDP over data x TP over model)."""
        if self.axes is not None:
            return self.axes
        batch, model = mesh_roles(self.mesh)
        return model + batch + self._stage

    @property
    def _stage(self) -> tuple[str, ...]:
        return (STAGE_AXIS,) if self.axes is None and STAGE_AXIS in self.mesh.axis_names else ()

    @property
    def shard_count(self) -> int:
        return math.prod(self.mesh.shape[a] for a in self.shard_axes)

    def spec(self, logical: Sequence[Optional[str]], shape: Sequence[int]) -> P:
        """PartitionSpec of one stored tensor with these logical axes and shape."""
        if not logical or sum(1 for name in logical if name != LAYERS) < 2:
            return P()
        layers = list(logical).index(LAYERS) if LAYERS in logical else None
        if self._stage and layers is not None and shape[layers] % self.mesh.shape[STAGE_AXIS] == 0:
            inner = StorageLayout(self.mesh, tuple(a for a in self.shard_axes if a != STAGE_AXIS), self.priority)
            parts = list(inner.spec(logical, shape)) if inner.shard_axes else []
            parts += [None] * (len(shape) - len(parts))
            parts[layers] = STAGE_AXIS
            return P(*parts)
        n = self.shard_count
        axes = self.shard_axes[0] if len(self.shard_axes) == 1 else self.shard_axes
        for name in self.priority:
            if name in logical:
                i = list(logical).index(name)
                if shape[i] % n == 0:
                    parts = [None] * len(shape)
                    parts[i] = axes
                    return P(*parts)
        return P()

    def sharding(self, logical: Sequence[Optional[str]], shape: Sequence[int]) -> NamedSharding:
        return NamedSharding(self.mesh, self.spec(logical, shape))

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

