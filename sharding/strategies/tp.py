"""`tp`: Megatron tensor parallelism over the model-parallel axes.

Attention heads and MLP columns are split over the p devices of the model group (column-split
W_q, W_kv / W_in, row-split W_o / W_out — exactly the storage layout, so on a one-axis mesh no
weight moves; with batch axes too, each layer's weights are gathered over those only). With
fewer K/V heads than p, each K/V head is replicated over the devices whose query heads read it
(as in Megatron).
Activations between sub-layers are replicated over the group; each sub-layer ends in one
all-reduce. Embedding and loss are vocabulary-parallel. With `sequence_parallel` (the `tp_sp`
subclass) activations between sub-layers are split along the sequence instead: an all-gather
before and a reduce-scatter after each sub-layer, and only the shard is kept for the backward
(the gathered input is re-gathered there, as in Megatron).
"""
from __future__ import annotations

import jax
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import Mesh, PartitionSpec as P

from sharding import layout as L
from sharding.ops import blocks
from sharding.ops.chunked_loss import chunked_nll_sums
from sharding.ops.vocab_parallel import vocab_parallel_embed_partial
from sharding.strategies.base import Strategy, model_size, shard_map
from sharding.strategies.description import (
    BATCH_ROLE, MODEL_ROLE, AttentionWork, Collective, Description, Extents, Rules, Saved, dense_or_tiles,
    gather_per_layer, model_block_weights, projection_flops, residuals, role_axes, saved_under, selective)

_GATHERED = "sp_gathered"
_SPLIT = dict(heads=MODEL_ROLE, kv_heads=MODEL_ROLE, mlp=MODEL_ROLE)


class TensorParallel(Strategy):
    name = "tp"
    sequence_parallel = False
    boundary = Rules.of(batch=BATCH_ROLE)
    compute = Rules.of(batch=BATCH_ROLE, **_SPLIT)
    weights = Rules.of(vocab=MODEL_ROLE, **_SPLIT)

    # -- collectives around a sub-layer --------------------------------------------------------
    def _gather(self, x, axes):
        if not self.sequence_parallel:
            return x
        full = jax.lax.all_gather(x, axes, axis=1, tiled=True)
        return checkpoint_name(full, _GATHERED)

    def _reduce(self, partial_out, axes):
        if self.sequence_parallel:
            return jax.lax.psum_scatter(partial_out, axes, scatter_dimension=1, tiled=True)
        return jax.lax.psum(partial_out, axes)

    def _sublayer(self, body, mesh: Mesh, weight_specs, x, *tokens):
        """Run `body(weights, x_full, *tokens) -> partial sums` split over the model group."""
        axes = role_axes(mesh, MODEL_ROLE)
        x_spec = self.boundary_spec(mesh)

        def local(weights, x, *tokens):
            return self._reduce(body(weights, self._gather(x, axes), *tokens), axes)

        if self.sequence_parallel:  # keep the shard, re-gather in the backward
            local = jax.checkpoint(local, policy=jax.checkpoint_policies.save_anything_except_these_names(_GATHERED))
        token_specs = tuple(self.compute.spec(L.TOKEN_AXES, mesh) for _ in tokens)
        return shard_map(local, mesh, in_specs=(weight_specs, x_spec, *token_specs), out_specs=x_spec)

    # -- layers --------------------------------------------------------------------------------
    def attention(self, w, x, segment_ids, positions, spec, mesh):
        def body(w, x, segment_ids, positions):
            q, k, v = blocks.qkv_projection(w, x, positions, spec)
            o = blocks.local_attention(q, k, v, spec, q_segment_ids=segment_ids, kv_segment_ids=segment_ids)
            return blocks.output_projection(o, w["wo"])

        w = blocks.attention_weights(w)
        w["wkv"] = blocks.kv_heads_for_group(w["wkv"], model_size(mesh))
        specs = self.weight_specs(w, mesh)
        return self._sublayer(body, mesh, specs, x, segment_ids, positions)(w, x, segment_ids, positions)

    def mlp(self, w, x, spec, mesh):
        body = lambda w, x: blocks.mlp_block(w["w_in"], w["w_out"], x, spec)  # noqa: E731
        w = {"w_in": w["w_in"], "w_out": w["w_out"]}
        return self._sublayer(body, mesh, self.weight_specs(w, mesh), x)(w, x)

    # -- embedding and loss: vocabulary-parallel ------------------------------------------------
    def _vocab_split(self, vocab: int, mesh: Mesh) -> bool:
        return vocab % model_size(mesh) == 0

    def embed(self, table, tokens, mesh):
        if not self._vocab_split(table.shape[0], mesh):
            return super().embed(table, tokens, mesh)
        axes = role_axes(mesh, MODEL_ROLE)
        local = lambda table, tokens: self._reduce(vocab_parallel_embed_partial(table, tokens, axes), axes)  # noqa: E731
        fn = shard_map(local, mesh, in_specs=(self.weights.spec(L.EMBEDDING_AXES, mesh),
                                              self.compute.spec(L.TOKEN_AXES, mesh)),
                       out_specs=self.boundary_spec(mesh))
        return fn(table, tokens)

    def loss_split(self, vocab, token_split, n_devices, p):
        """Vocabulary-parallel over the model group (Megatron) where p divides the vocabulary."""
        if p > 1 and vocab % p == 0:
            return "vocab", p
        return super().loss_split(vocab, token_split, n_devices, p)

    def loss_sums(self, x, head, targets, loss_mask, mesh, chunk=0):
        if self.loss_split(head.shape[1], 1, 1, model_size(mesh))[0] != "vocab":
            return super().loss_sums(x, head, targets, loss_mask, mesh, chunk)
        batch_axes, axes = role_axes(mesh, BATCH_ROLE), role_axes(mesh, MODEL_ROLE)
        tokens = self.compute.spec(L.TOKEN_AXES, mesh)

        def local(x, head, targets, mask):
            sums = chunked_nll_sums(self._gather(x, axes), head, targets, mask, chunk, vocab_axes=axes)
            return jax.lax.psum(sums, batch_axes) if batch_axes else sums

        fn = shard_map(local, mesh, in_specs=(self.boundary_spec(mesh), self.weights.spec(L.HEAD_AXES, mesh), tokens, tokens),
                       out_specs=(P(), P()))
        return fn(x, head, targets, loss_mask)

    # -- what one layer keeps and moves ---------------------------------------------------------
    def describe(self, shape, remat="none"):
        spec, s, p, rows = shape.spec, shape.seq_len, shape.p, self.rows(shape)
        heads = spec.n_heads / p
        dense, score, tiles = dense_or_tiles(shape, rows, heads, s)
        ext = Extents(rows, self.boundary_seq(shape), s, rows * s, heads, shape.kv_group / p, rows * s * spec.d_ff / p,
                      dense, score, tiles)
        kept, transient = model_block_weights(shape, remat)
        # the gathered sub-layer inputs are kept whole (not re-gathered): the layer input and one input
        dots = Saved(boundary=1, inputs=1, att=3, mlp=shape.g)
        return Description(
            ext, saved_under(remat, residuals(ext), dots, selective(ext, shape.g)), kept, transient, 0.0,
            projection_flops(shape, rows * s, remat, split=p),
            AttentionWork(rows, heads, s, s, tiled=shape.blockwise, flash=shape.blockwise),
            shape.tiles(s, s, rows * heads) if shape.blockwise else 0,
            self.sublayer_collectives(shape, rows * s * spec.d_model * shape.e)
            + (gather_per_layer(shape, remat, BATCH_ROLE, share=p) if shape.d > 1 else ()))

    def sublayer_collectives(self, shape, x_bytes):
        """One all-reduce after each sub-layer, forward and backward."""
        return (Collective("all-reduce", MODEL_ROLE, x_bytes, 4),)
