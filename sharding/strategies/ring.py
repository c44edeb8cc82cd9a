"""`ring`: context parallelism. The sequence is split over the model group; attention runs a
ring of K/V blocks (`sharding.ops.ring_attention`); weights are gathered per layer (FSDP).

Boundary layout `[b, s/p, d]` (batch over the batch axes, sequence over the model axes). Each
layer gathers its weights to replicated inside the scan body (ZeRO-3), so their gradients flow
back reduce-scattered into the storage layout. Projections, rotary positions and the MLP are
local to the sequence chunk; only attention talks to the other devices.
"""
from __future__ import annotations

import abc

import jax
from jax.sharding import PartitionSpec as P

from sharding.ops import blocks
from sharding.ops.ring_attention import chunk_index, ring_attention
from sharding.strategies.base import (
    Strategy, batch_entry, constrain, model_entry, model_size, replicate)


class SequenceSharded(Strategy):
    """Shared base of `ring` and `ulysses`: sequence-sharded activations, full weights per layer.

    Subclasses implement `attend(q, k, v, segment_ids, spec, mesh)` on [B, S, H, K] arrays in
    the boundary layout (inside it they usually enter a `shard_map`).
    """

    def boundary_spec(self, mesh):
        return P(batch_entry(mesh), model_entry(mesh), None)

    def local_spec(self, mesh, ndim: int) -> P:
        """shard_map spec of a [B, S, ...] array in the boundary layout."""
        return P(batch_entry(mesh), model_entry(mesh), *([None] * (ndim - 2)))

    def check(self, spec, mesh, batch, seq_len):
        super().check(spec, mesh, batch, seq_len)
        self._require_divisible("sequence length", seq_len, model_size(mesh), "the model-parallel size")

    @abc.abstractmethod
    def attend(self, q, k, v, segment_ids, spec, mesh):
        """Attention outputs [B, S, H, K] in the boundary layout (k, v: [B, S, G, K])."""

    def attention(self, w, x, segment_ids, positions, spec, mesh):
        w = replicate(blocks.attention_weights(w), mesh)
        q, k, v = blocks.qkv_projection(w, x, positions, spec)
        o = self.attend(q, k, v, segment_ids, spec, mesh)
        return constrain(blocks.output_projection(o, w["wo"]), mesh, self.boundary_spec(mesh))

    def mlp(self, w, x, spec, mesh):
        w = replicate({"w_in": w["w_in"], "w_out": w["w_out"]}, mesh)
        out = blocks.mlp_block(w["w_in"], w["w_out"], x, spec)
        return constrain(out, mesh, self.boundary_spec(mesh))


class RingAttention(SequenceSharded):
    name = "ring"

    def attend(self, q, k, v, segment_ids, spec, mesh):
        axis, p = model_entry(mesh), model_size(mesh)

        def local(q, k, v, seg):
            index = chunk_index(q.shape[0], q.shape[1], axis)
            tile = min(spec.attention_block, q.shape[1]) if spec.use_blockwise(q.shape[1] * p) else None
            return ring_attention(q, k, v, axis_name=axis, axis_size=p, q_segment_ids=seg,
                                  kv_segment_ids=seg, q_index=index, kv_index=index,
                                  q_block_size=tile, kv_block_size=tile)

        qkv = self.local_spec(mesh, 4)
        return jax.shard_map(local, mesh=mesh, in_specs=(qkv, qkv, qkv, self.local_spec(mesh, 2)),
                             out_specs=qkv, check_vma=True)(q, k, v, segment_ids)
