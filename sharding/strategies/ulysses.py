"""`ulysses`: DeepSpeed-Ulysses sequence parallelism with per-layer weight gathering (FSDP).

Boundary layout `[b, s/p, d]` as in `ring`. Around attention an all-to-all trades the sequence
split for a head split, so each device attends over the full sequence for h/p heads (the
local kernel on whole rows, `blocks.local_attention`), and a second all-to-all trades back.
Segment ids (small) are all-gathered over the sequence. Autodiff transposes each all-to-all into
the reverse one. With fewer K/V heads than devices, K/V heads are repeated before the
all-to-all so that every device receives the one its query heads read.
"""
from __future__ import annotations

from jax import lax

from sharding.ops import blocks
from sharding.remat import keep
from sharding.strategies.base import model_entry, model_size
from sharding.strategies.description import (
    BATCH_ROLE, MODEL_ROLE, AttentionWork, Collective, Description, Rules, dense_or_tiles, gather_per_layer,
    gathered_weights, projection_flops, recomputes_attention, residuals, saved_under, selective, standard_dots)
from sharding.strategies.ring import SequenceSharded


class Ulysses(SequenceSharded):
    name = "ulysses"
    compute = Rules.of(batch=BATCH_ROLE, heads=MODEL_ROLE, kv_heads=MODEL_ROLE)  # attention, between the all-to-alls

    def attend(self, q, k, v, segment_ids, spec, mesh):
        axis = model_entry(mesh)

        def seq_to_heads(x):  # [B, S/p, H, K] -> [B, S, H/p, K]
            return lax.all_to_all(x, axis, split_axis=2, concat_axis=1, tiled=True)

        def heads_to_seq(x):  # [B, S, H/p, K] -> [B, S/p, H, K]
            return lax.all_to_all(x, axis, split_axis=1, concat_axis=2, tiled=True)

        def local(q, k, v, seg):  # after the all-to-all: whole rows for h/p heads
            seg = lax.all_gather(seg, axis, axis=1, tiled=True)
            q, k, v = keep((seq_to_heads(q), seq_to_heads(k), seq_to_heads(v)))  # not all-to-all again
            return heads_to_seq(blocks.local_attention(q, k, v, spec, q_segment_ids=seg, kv_segment_ids=seg))

        k, v = (blocks.kv_heads_for_group(t, model_size(mesh)) for t in (k, v))  # whole K/V heads per device
        return self.local_attention(local, mesh)(q, k, v, segment_ids)

    def describe(self, shape, remat="none"):
        spec, s, p = shape.spec, shape.seq_len, shape.p
        rows = self.rows(shape)
        dense, score, tiles = dense_or_tiles(shape, rows, spec.n_heads / p, s)
        # K/V heads repeated up to p before the all-to-all; o kept in both layouts
        ext = self.chunk_extents(shape, shape.kv_group, dense, score, tiles)
        kept, transient = gathered_weights(shape, remat)
        A = ext.att_tokens * spec.n_heads * spec.head_dim * shape.e
        a2a = Collective("all-to-all", MODEL_ROLE, A * (2 * spec.n_heads + 2 * shape.kv_group) / (4 * spec.n_heads),
                         4 * (2 + recomputes_attention(remat) / 2))  # q, k, v, o
        return Description(
            ext, saved_under(remat, residuals(ext, att=3), standard_dots(shape), selective(ext, shape.g)), kept, transient, 0.0,
            projection_flops(shape, ext.att_tokens, remat),
            AttentionWork(rows, spec.n_heads / p, s, s, tiled=shape.blockwise, flash=shape.blockwise),
            shape.tiles(s, s, rows * spec.n_heads / p) if shape.blockwise else 0, gather_per_layer(shape, remat) + (a2a,))
