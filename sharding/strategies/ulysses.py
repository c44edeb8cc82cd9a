"""`ulysses`: DeepSpeed-Ulysses sequence parallelism with per-layer weight gathering (FSDP).

Boundary layout `[b, s/p, d]` as in `ring`. Around attention an all-to-all trades the sequence
split for a head split, so each device attends over the full sequence for h/p heads (local,
blockwise for long sequences), and a second all-to-all trades back. Segment ids and token
indices (small) are all-gathered over the sequence. Autodiff transposes each all-to-all into
the reverse one. With fewer K/V heads than devices, K/V heads are repeated before the
all-to-all so that every device receives the one its query heads read.
"""
from __future__ import annotations

import jax
from jax import lax

from sharding.ops import blocks
from sharding.ops.ring_attention import chunk_index
from sharding.strategies.base import model_entry, model_size
from sharding.strategies.ring import SequenceSharded


class Ulysses(SequenceSharded):
    name = "ulysses"

    def check(self, spec, mesh, batch, seq_len):
        super().check(spec, mesh, batch, seq_len)
        self._require_divisible("n_heads", spec.n_heads, model_size(mesh), "the model-parallel size")
        self._require_kv_split(spec, model_size(mesh))

    def attend(self, q, k, v, segment_ids, spec, mesh):
        axis = model_entry(mesh)

        def seq_to_heads(x):  # [B, S/p, H, K] -> [B, S, H/p, K]
            return lax.all_to_all(x, axis, split_axis=2, concat_axis=1, tiled=True)

        def heads_to_seq(x):  # [B, S, H/p, K] -> [B, S/p, H, K]
            return lax.all_to_all(x, axis, split_axis=1, concat_axis=2, tiled=True)

        def local(q, k, v, seg):
            index = chunk_index(seg.shape[0], seg.shape[1], axis)
            seg, index = (lax.all_gather(a, axis, axis=1, tiled=True) for a in (seg, index))
            o = blocks.local_attention(seq_to_heads(q), seq_to_heads(k), seq_to_heads(v), spec,
                                       q_segment_ids=seg, kv_segment_ids=seg,
                                       q_index=index, kv_index=index)
            return heads_to_seq(o)

        qkv = self.local_spec(mesh, 4)
        k, v = (blocks.kv_heads_for_group(t, model_size(mesh)) for t in (k, v))  # whole K/V heads per device
        return jax.shard_map(local, mesh=mesh, in_specs=(qkv, qkv, qkv, self.local_spec(mesh, 2)),
                             out_specs=qkv, check_vma=True)(q, k, v, segment_ids)
