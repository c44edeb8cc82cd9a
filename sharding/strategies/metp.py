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
from jax.sharding import Mesh, PartitionSpec as P

from sharding.mesh import mesh_roles
from sharding.ops import blocks
from sharding.ops.metp import metp_attention, metp_mlp
from sharding.ops.ring import Ring
from sharding.strategies.base import Strategy, batch_entry, model_entry, model_size


class MemoryEfficientTensorParallel(Strategy):
    name = "metp"

    def boundary_spec(self, mesh: Mesh) -> P:
        return P(batch_entry(mesh), model_entry(mesh), None)

    def check(self, spec, mesh, batch, seq_len):
        super().check(spec, mesh, batch, seq_len)
        p = model_size(mesh)
        self._require_divisible("sequence length", seq_len, p, "the model-parallel size")
        self._require_divisible("n_heads", spec.n_heads, p, "the model-parallel size")
        self._require_kv_split(spec, p)
        self._require_divisible("d_ff", spec.d_ff, p, "the model-parallel size")

    def ring(self, mesh: Mesh) -> Ring:
        batch_axes, axes = mesh_roles(mesh)
        return Ring.over(mesh, axes, batch_axes)

    def attention(self, w, x, segment_ids, positions, spec, mesh):
        self.check(spec, mesh, x.shape[0], x.shape[1])
        m, act, tokens = model_entry(mesh), self.boundary_spec(mesh), self.token_spec(mesh)
        specs = {"wq": P(None, m, None), "wkv": P(None, None, m, None), "wo": P(m, None, None)}
        fn = jax.shard_map(partial(metp_attention, spec=spec, ring=self.ring(mesh)),
                           mesh=mesh, in_specs=(act, tokens, tokens, specs), out_specs=act)
        w = blocks.attention_weights(w)
        w["wkv"] = blocks.kv_heads_for_group(w["wkv"], model_size(mesh))  # whole K/V heads per group
        w = jax.tree.map(lambda t: t.astype(spec.dtype), w)
        return fn(x, segment_ids, positions, w)

    def mlp(self, w, x, spec, mesh):
        self.check(spec, mesh, x.shape[0], x.shape[1])
        m, act = model_entry(mesh), self.boundary_spec(mesh)
        fn = jax.shard_map(partial(metp_mlp, spec=spec, ring=self.ring(mesh)), mesh=mesh,
                           in_specs=(act, P(None, None, m), P(m, None)), out_specs=act)
        return fn(x, w["w_in"].astype(spec.dtype), w["w_out"].astype(spec.dtype))
