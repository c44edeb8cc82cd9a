"""`ring`: context parallelism. The sequence is split over the model group; attention runs a
ring of K/V blocks (`sharding.ops.ring_attention`); weights are gathered per layer (FSDP).

Boundary layout `[b, s/p, d]` (batch over the batch axes, sequence over the model axes). Each
layer gathers its weights to replicated inside the scan body (ZeRO-3), so their gradients flow
back reduce-scattered into the storage layout. Projections, rotary positions and the MLP are
local to the sequence chunk; only attention talks to the other devices.
"""
from __future__ import annotations

import abc

from sharding import layout as L
from sharding.ops import blocks
from sharding.ops.ring_attention import chunk_index, ring_attention
from sharding.strategies.base import Strategy, constrain, model_entry, model_size, shard_map
from sharding.strategies.description import (
    BATCH_ROLE, F32, MODEL_ROLE, AttentionWork, Description, Extents, RingStep, Rules, gather_per_layer,
    gathered_weights, projection_flops, recomputes_attention, residuals, saved_under, selective, standard_dots,
    tile_elements)


class SequenceSharded(Strategy):
    """Shared base of `ring` and `ulysses`: sequence-sharded activations, full weights per layer.

    Subclasses implement `attend(q, k, v, segment_ids, spec, mesh)` on [B, S, H, K] arrays in
    the boundary layout (inside it they usually enter a `shard_map`).
    """

    boundary = compute = Rules.of(batch=BATCH_ROLE, seq=MODEL_ROLE)

    @abc.abstractmethod
    def attend(self, q, k, v, segment_ids, spec, mesh):
        """Attention outputs [B, S, H, K] in the boundary layout (k, v: [B, S, G, K])."""

    def attention(self, w, x, segment_ids, positions, spec, mesh):
        w = self.gather(blocks.attention_weights(w), mesh)
        q, k, v = blocks.qkv_projection(w, x, positions, spec)
        o = self.attend(q, k, v, segment_ids, spec, mesh)
        return constrain(blocks.output_projection(o, w["wo"]), mesh, self.boundary_spec(mesh))

    def mlp(self, w, x, spec, mesh):
        w = self.gather({"w_in": w["w_in"], "w_out": w["w_out"]}, mesh)
        out = blocks.mlp_block(w["w_in"], w["w_out"], x, spec)
        return constrain(out, mesh, self.boundary_spec(mesh))

    def local_attention(self, local, mesh):
        """`local(q, k, v, segment_ids)` on each device's chunk, in a shard_map over the boundary layout."""
        qkv = self.boundary.spec(L.ATTENTION_AXES, mesh)
        return shard_map(local, mesh, in_specs=(qkv, qkv, qkv, self.token_spec(mesh)), out_specs=qkv)

    def chunk_extents(self, shape, kv_heads, dense=False, score_rows=0.0, tiles=0.0) -> Extents:
        """Extents of a layer whose projections and MLP work on the device's sequence chunk."""
        rows, c = self.rows(shape), self.boundary_seq(shape)
        return Extents(rows, c, c, rows * c, shape.spec.n_heads, kv_heads, rows * c * shape.spec.d_ff,
                       dense, score_rows, tiles)


class RingAttention(SequenceSharded):
    name = "ring"

    def attend(self, q, k, v, segment_ids, spec, mesh):
        axis, p = model_entry(mesh), model_size(mesh)

        def local(q, k, v, seg):
            index = chunk_index(q.shape[0], q.shape[1], axis)
            return ring_attention(q, k, v, axis_name=axis, axis_size=p, q_segment_ids=seg, kv_segment_ids=seg,
                                  q_index=index, kv_index=index, kernel=blocks.attention_kernel(spec, q.shape[1] * p))

        return self.local_attention(local, mesh)(q, k, v, segment_ids)

    def describe(self, shape, remat="none"):
        spec, p, k, G = shape.spec, shape.p, shape.spec.head_dim, shape.spec.kv_heads
        rows, c = self.rows(shape), self.boundary_seq(shape)
        tile = tile_elements(spec, c, c, rows * spec.n_heads) if shape.blockwise else c * c  # else whole chunk pairs
        ext = self.chunk_extents(shape, G, tiles=rows * spec.n_heads * tile)
        kept, transient = gathered_weights(shape, remat)
        Akv = ext.att_tokens * ext.kv_heads * k * shape.e_mem
        buffers = 2 * 2 * Akv + 2 * ext.att_tokens * ext.kv_heads * k * F32  # K/V double buffer + dK/dV f32
        chunk = max(1, shape.seq_len // p)
        per_block = shape.tiles(chunk, chunk, rows * spec.n_heads) if shape.blockwise else 1
        # each step's K/V block computes while the next hops. Forward: p - 1 K/V hops; backward:
        # p - 1 K/V hops with p dK/dV (f32) hops, one K/V + one dK/dV per step.
        tokens = rows * c
        kv = 2 * (tokens * spec.n_heads * k * shape.e) * G / spec.n_heads
        dkv = 2 * tokens * G * k * F32
        steps = (RingStep((1 + recomputes_attention(remat)) * (p - 1), kv, attention=1 / p, scores=1 / p),
                 RingStep(p - 1, kv + dkv, attention=2.5 / p, scores=1 / p),
                 RingStep(1, dkv))
        return Description(
            ext, saved_under(remat, residuals(ext), standard_dots(shape), selective(ext, shape.g)), kept, transient, buffers,
            projection_flops(shape, tokens, remat),
            AttentionWork(rows, spec.n_heads, c, c, blocks=p, tiled=shape.blockwise, flash=True),
            p * (per_block + 1), gather_per_layer(shape, remat), steps)
