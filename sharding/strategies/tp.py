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

from sharding.mesh import mesh_roles
from sharding.ops import blocks
from sharding.ops.vocab_parallel import vocab_parallel_embed_partial, vocab_parallel_nll
from sharding.strategies.base import Strategy, batch_entry, model_entry, model_size

_GATHERED = "sp_gathered"


class TensorParallel(Strategy):
    name = "tp"
    sequence_parallel = False

    # -- layouts -----------------------------------------------------------------------------
    def boundary_spec(self, mesh: Mesh) -> P:
        return P(batch_entry(mesh), model_entry(mesh) if self.sequence_parallel else None, None)

    def check(self, spec, mesh, batch, seq_len):
        super().check(spec, mesh, batch, seq_len)
        p = model_size(mesh)
        self._require_divisible("n_heads", spec.n_heads, p, "the model-parallel size")
        self._require_kv_split(spec, p)
        self._require_divisible("d_ff", spec.d_ff, p, "the model-parallel size")
        if self.sequence_parallel:
            self._require_divisible("sequence length", seq_len, p, "the model-parallel size")

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
        axes = mesh_roles(mesh)[1]
        x_spec = self.boundary_spec(mesh)

        def local(weights, x, *tokens):
            return self._reduce(body(weights, self._gather(x, axes), *tokens), axes)

        if self.sequence_parallel:  # keep the shard, re-gather in the backward
            local = jax.checkpoint(local, policy=jax.checkpoint_policies.save_anything_except_these_names(_GATHERED))
        token_specs = tuple(P(batch_entry(mesh), None) for _ in tokens)
        return jax.shard_map(local, mesh=mesh, in_specs=(weight_specs, x_spec, *token_specs), out_specs=x_spec)

    # -- layers --------------------------------------------------------------------------------
    def attention(self, w, x, segment_ids, positions, spec, mesh):
        m = model_entry(mesh)

        def body(w, x, segment_ids, positions):
            q, k, v = blocks.qkv_projection(w, x, positions, spec)
            o = blocks.local_attention(q, k, v, spec, q_segment_ids=segment_ids, kv_segment_ids=segment_ids)
            return blocks.output_projection(o, w["wo"])

        specs = {"wq": P(None, m, None), "wkv": P(None, None, m, None), "wo": P(m, None, None)}
        w = blocks.attention_weights(w)
        w["wkv"] = blocks.kv_heads_for_group(w["wkv"], model_size(mesh))
        return self._sublayer(body, mesh, specs, x, segment_ids, positions)(w, x, segment_ids, positions)

    def mlp(self, w, x, spec, mesh):
        m = model_entry(mesh)
        body = lambda w, x: blocks.mlp_block(w["w_in"], w["w_out"], x, spec)  # noqa: E731
        specs = {"w_in": P(None, None, m), "w_out": P(m, None)}
        return self._sublayer(body, mesh, specs, x)({"w_in": w["w_in"], "w_out": w["w_out"]}, x)

    # -- embedding and loss: vocabulary-parallel ------------------------------------------------
    def _vocab_split(self, vocab: int, mesh: Mesh) -> bool:
        return vocab % model_size(mesh) == 0

    def embed(self, table, tokens, mesh):
        if not self._vocab_split(table.shape[0], mesh):
            return super().embed(table, tokens, mesh)
        axes = mesh_roles(mesh)[1]
        local = lambda table, tokens: self._reduce(vocab_parallel_embed_partial(table, tokens, axes), axes)  # noqa: E731
        fn = jax.shard_map(local, mesh=mesh, in_specs=(P(model_entry(mesh), None), P(batch_entry(mesh), None)),
                           out_specs=self.boundary_spec(mesh))
        return fn(table, tokens)

    def loss_sums(self, x, head, targets, loss_mask, mesh):
        if not self._vocab_split(head.shape[1], mesh):
            return super().loss_sums(x, head, targets, loss_mask, mesh)
        batch_axes, axes = mesh_roles(mesh)
        tokens = P(batch_entry(mesh), None)

        def local(x, head, targets, mask):
            nll = vocab_parallel_nll(self._gather(x, axes), head, targets, axes)
            mask = mask.astype(nll.dtype)
            sums = (jax.numpy.sum(nll * mask), jax.numpy.sum(mask))
            return jax.lax.psum(sums, batch_axes) if batch_axes else sums

        fn = jax.shard_map(local, mesh=mesh, in_specs=(self.boundary_spec(mesh), P(None, model_entry(mesh)), tokens, tokens),
                           out_specs=(P(), P()))
        return fn(x, head, targets, loss_mask)
