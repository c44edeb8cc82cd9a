"""`metp`: memory-efficient tensor parallelism (`sharding.ops.metp`) inside `jax.shard_map`.

Activations stay sequence-sharded (`[b, s/p, d]`, the unified boundary layout). Each device
keeps its storage block of every weight (heads / MLP columns over the model group; with batch
axes too, the layer's blocks are first gathered over the batch axes only, by the shard_map
in_specs). The MLP passes weight blocks around a ring; attention broadcasts one head group at
a time and runs an inner K/V ring. No gathered activation or full weight exists anywhere.

Per layer the backward keeps: the attention input chunk, the attention output per head
(`[b, s/p, h]`), its log-sum-exp (`[b, s/p, n_heads]`, float32) and the MLP input chunk; MLP
activations and q/k/v are recomputed. Embedding and loss: the base defaults.
"""
from __future__ import annotations

from functools import partial

import jax

from sharding.ops import blocks
from sharding.ops.metp import metp_attention, metp_mlp
from sharding.ops.ring import Ring
from sharding.strategies.base import Strategy, model_size, shard_map
from sharding.strategies.description import (
    BATCH_ROLE, DEVICES_ROLE, F32, MODEL_ROLE, AttentionWork, Collective, Description, Extents, RingStep, Rules,
    Saved, gather_per_layer, model_block_weights, projection_flops, recomputes, recomputes_attention, residuals,
    role_axes, saved_under, selective, tile_elements)


class MemoryEfficientTensorParallel(Strategy):
    name = "metp"
    boundary = compute = Rules.of(batch=BATCH_ROLE, seq=MODEL_ROLE)
    weights = Rules.of(heads=MODEL_ROLE, kv_heads=MODEL_ROLE, mlp=MODEL_ROLE)

    def ring(self, mesh) -> Ring:
        return Ring.over(mesh, role_axes(mesh, MODEL_ROLE), role_axes(mesh, BATCH_ROLE))

    def _local(self, kernel, mesh, w, *tokens):
        """`kernel` on each device's chunk and weight blocks, in a shard_map."""
        act, tok = self.boundary_spec(mesh), self.token_spec(mesh)
        return shard_map(kernel, mesh, in_specs=(act, *(tok for _ in tokens), self.weight_specs(w, mesh)), out_specs=act)

    def attention(self, w, x, segment_ids, positions, spec, mesh):
        self.check(spec, mesh, x.shape[0], x.shape[1])
        w = blocks.attention_weights(w)
        w["wkv"] = blocks.kv_heads_for_group(w["wkv"], model_size(mesh))  # whole K/V heads per group
        w = jax.tree.map(lambda t: t.astype(spec.dtype), w)
        kernel = partial(metp_attention, spec=spec, ring=self.ring(mesh))
        return self._local(kernel, mesh, w, segment_ids, positions)(x, segment_ids, positions, w)

    def mlp(self, w, x, spec, mesh):
        self.check(spec, mesh, x.shape[0], x.shape[1])
        kernel = partial(metp_mlp, spec=spec, ring=self.ring(mesh))
        w = {"w_in": w["w_in"].astype(spec.dtype), "w_out": w["w_out"].astype(spec.dtype)}
        return self._local(lambda x, w: kernel(x, w["w_in"], w["w_out"]), mesh, w)(x, w)

    def describe(self, shape, remat="none"):
        spec, p, g, e = shape.spec, shape.p, shape.g, shape.e_mem
        h, n, k, f = spec.d_model, spec.n_heads, spec.head_dim, spec.d_ff
        rows, c = self.rows(shape), self.boundary_seq(shape)
        tokens = rows * c
        # MLP activations are recomputed block by block (in `buffers`), never kept whole
        ext = Extents(rows, c, c, tokens, n, shape.kv_group / p, 0.0, False, 0.0,
                      rows * n / p * tile_elements(spec, c, c, rows * n / p))
        # only o per head group and its log-sum-exp; under dots, the ring steps' projection
        # outputs (matmuls without batch dims)
        saved = saved_under(remat, residuals(ext, att=1, kv=0, mlp=0), Saved(boundary=1 + p, att=3),
                            selective(ext, 0, att=1, kv=0))
        kept, transient = model_block_weights(shape, remat)
        # travelling MLP blocks + grads (double buffered), head-group broadcasts
        w_mlp = (g * h * f + f * h) / p
        w_att = ((2 * n + 2 * shape.kv_group) * h * k) / p
        transient = 2 * w_mlp * e + 2 * w_mlp * F32 + 2 * w_att * e + w_att * F32 + (transient if shape.d > 1 else 0.0)
        kv = 2 * tokens * ext.kv_heads * k
        A = tokens * n * k * e
        buffers = 2 * kv * e + kv * F32 + 3 * A / p + 2 * tokens * h * F32 + (g + 1) * tokens * f / p * e
        chunk = max(1, shape.seq_len // p)
        return Description(
            ext, saved, kept, transient, buffers, self.matmul_flops(shape, tokens, remat),
            AttentionWork(rows, n, c, c, blocks=p, tiled=True, flash=True),
            p * p * (shape.tiles(chunk, chunk, rows * n / p) + 1) + p,
            ((Collective("all-reduce", DEVICES_ROLE, self.group_elems(shape) / p * F32, p),)  # group grads to their owner
             + (gather_per_layer(shape, remat, BATCH_ROLE, share=p)[:1] if shape.d > 1 else ())),
            self.ring_steps(shape, tokens, remat))

    def group_elems(self, shape) -> int:
        """Elements of the attention weights of all p head groups (K/V heads replicated to whole heads)."""
        spec = shape.spec
        return (spec.n_heads + 2 * shape.kv_group) * spec.d_model * spec.head_dim + spec.n_heads * spec.head_dim * spec.d_model

    def matmul_flops(self, shape, tokens, remat) -> float:
        """The hand-written backward recomputes the MLP's input projection and q/k/v (not the
        output projections): matches the dot FLOPs of the compiled HLO."""
        spec = shape.spec
        return (projection_flops(shape, tokens, remat)
                + 2 * tokens * (shape.g * spec.d_model * spec.d_ff + shape.qkv_elems) * (1 - recomputes(remat)))

    def ring_steps(self, shape, tokens, remat) -> tuple[RingStep, ...]:
        spec, p, e, g = shape.spec, shape.p, shape.e, shape.g
        h, f = spec.d_model, spec.d_ff
        passes = 1 + recomputes_attention(remat)  # dots and full run the forward rings again
        # MLP: a weight block hops while the previous one computes: p - 1 hops per forward; the
        # backward (recompute + 2 gradient matmuls per block) moves block and f32 gradient per step
        wblk_mlp = (g * h * f + f * h) / p * e
        mlp_blk = 2 * tokens * (g * h * f + f * h) / p  # forward FLOPs of one weight block on the chunk
        # attention: head group j + 1's weights are broadcast (a masked psum) while group j computes
        # its projections; its K/V blocks then hop an inner ring while each visiting block computes
        wblk_att = self.group_elems(shape) / p * e
        proj_grp = 2 * tokens * self.group_elems(shape) / p
        kv = 2 * tokens * (shape.kv_group / p) * spec.head_dim * e
        share = 1 / (p * p)  # one visiting block of one head group
        return (RingStep(passes * (p - 1), wblk_mlp, matmul_flops=mlp_blk),
                RingStep(p - 1, wblk_mlp + wblk_mlp / e * F32, matmul_flops=3 * mlp_blk),
                RingStep(1, wblk_mlp / e * F32),
                RingStep(passes * (p - 1), wblk_att, kind="all-reduce", matmul_flops=proj_grp),
                RingStep(p - 1, wblk_att, kind="all-reduce", matmul_flops=3 * proj_grp),
                RingStep(passes * p * (p - 1), kv, attention=share, scores=share),
                RingStep(p * (p - 1), kv + kv / e * F32, attention=2.5 * share, scores=share),
                RingStep(p, kv / e * F32))
