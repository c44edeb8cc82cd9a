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
from sharding.ops.metp import BROADCASTS, Ring, metp_attention, metp_attention_autodiff, metp_mlp, mlp_ring_forward
from sharding.strategies.base import Strategy, batch_entry, model_entry, model_size


class MemoryEfficientTensorParallel(Strategy):
    """`broadcast` picks how a head group's weights reach every device ("psum": one masked
    all-reduce per group, the default; "ring": p - 1 ring hops). `hand_backward=False` runs
    autodiff through the rings instead (for memory comparisons only)."""

    name = "metp"

    def __init__(self, broadcast: str = "psum", hand_backward: bool = True):
        if broadcast not in BROADCASTS:
            raise ValueError(f"metp: broadcast must be one of {BROADCASTS}, got {broadcast!r}")
        self.broadcast = broadcast
        self.hand_backward = hand_backward

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
        return Ring(axis=axes, size=model_size(mesh), batch_axes=batch_axes)

    def attention(self, w, x, segment_ids, positions, spec, mesh):
        self.check(spec, mesh, x.shape[0], x.shape[1])
        kernel = metp_attention if self.hand_backward else metp_attention_autodiff
        m, act, tokens = model_entry(mesh), self.boundary_spec(mesh), self.token_spec(mesh)
        specs = {"wq": P(None, m, None), "wkv": P(None, None, m, None), "wo": P(m, None, None)}
        fn = jax.shard_map(partial(kernel, spec=spec, ring=self.ring(mesh), broadcast=self.broadcast),
                           mesh=mesh, in_specs=(act, tokens, tokens, specs), out_specs=act)
        w = blocks.attention_weights(w)
        w["wkv"] = blocks.kv_heads_for_group(w["wkv"], model_size(mesh))  # whole K/V heads per group
        w = jax.tree.map(lambda t: t.astype(spec.dtype), w)
        return fn(x, segment_ids, positions, w)

    def mlp(self, w, x, spec, mesh):
        self.check(spec, mesh, x.shape[0], x.shape[1])
        kernel = metp_mlp if self.hand_backward else mlp_ring_forward
        m, act = model_entry(mesh), self.boundary_spec(mesh)
        fn = jax.shard_map(partial(kernel, spec=spec, ring=self.ring(mesh)), mesh=mesh,
                           in_specs=(act, P(None, None, m), P(m, None)), out_specs=act)
        return fn(x, w["w_in"].astype(spec.dtype), w["w_out"].astype(spec.dtype))
