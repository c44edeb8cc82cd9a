"""`dp`: data parallel. Each run's weights are gathered once, compute is replicated per batch shard."""
from sharding import layout as L
from sharding.ops import blocks
from sharding.ops.fused_attention import KERNELS
from sharding.strategies.base import Strategy, constrain, shard_map
from sharding.strategies.description import (
    DEVICES_ROLE, F32, AttentionWork, Collective, Description, Extents, Rules, dense_or_tiles, projection_flops,
    keeps_gathered, residuals, saved_under, selective, standard_dots)


class DataParallel(Strategy):
    """Batch split over every device, whole weights. `fsdp` differs only in when it gathers."""

    name = "dp"
    boundary = compute = Rules.of(batch=DEVICES_ROLE)

    def run_weights(self, weights, mesh):
        return self.gather(weights, mesh, stacked=True)

    def layer_weights(self, w, mesh):
        """A sub-layer's weights in the compute layout (gathered per run already)."""
        return w

    def attention(self, w, x, segment_ids, positions, spec, mesh):
        w = self.layer_weights(blocks.attention_weights(w), mesh)
        out = blocks.attention_block(w, x, segment_ids, positions, spec, attend=self.per_device(spec, mesh))
        return constrain(out, mesh, self.boundary_spec(mesh))

    def per_device(self, spec, mesh):
        """For a fused kernel (which has no partitioning rule): the local attention on each
        device's rows, in a shard_map over the compute layout. None: GSPMD partitions the XLA
        kernels as they are."""
        if spec.attention not in KERNELS:
            return None
        qkv, tokens = self.compute.spec(L.ATTENTION_AXES, mesh), self.compute.spec(L.TOKEN_AXES, mesh)
        local = lambda q, k, v, seg: blocks.local_attention(q, k, v, spec, q_segment_ids=seg, kv_segment_ids=seg)  # noqa: E731
        return shard_map(local, mesh, in_specs=(qkv, qkv, qkv, tokens), out_specs=qkv)

    def mlp(self, w, x, spec, mesh):
        w = self.layer_weights({"w_in": w["w_in"], "w_out": w["w_out"]}, mesh)
        return constrain(blocks.mlp_block(w["w_in"], w["w_out"], x, spec), mesh, self.boundary_spec(mesh))

    def describe(self, shape, remat="none"):
        spec, s, rows = shape.spec, shape.seq_len, self.rows(shape)
        dense, score, tiles = dense_or_tiles(shape, rows, spec.n_heads, s)
        ext = Extents(rows, s, s, rows * s, spec.n_heads, spec.kv_heads, rows * s * spec.d_ff, dense, score, tiles)
        kept, transient = self.weight_bytes(shape, remat)
        return Description(
            ext, saved_under(remat, residuals(ext), standard_dots(shape), selective(ext, shape.g)), kept, transient, 0.0,
            projection_flops(shape, rows * s, remat),
            AttentionWork(rows, spec.n_heads, s, s, tiled=shape.blockwise, flash=shape.blockwise),
            shape.tiles(s, s, rows * spec.n_heads) if shape.blockwise else 0, self.weight_collectives(shape, remat))

    def weight_bytes(self, shape, remat):
        """(kept, transient): the run's gathered copy and the stacked full-size float32 gradients
        (+ a compute-dtype cast; XLA:CPU computes bfloat16 in float32 and keeps no separate cast)."""
        big, pb = shape.matrix_elems, shape.param_bytes
        cast = shape.e_mem if shape.converted else 0
        kept = big * (pb + F32 + (cast if shape.backend != "cpu" else 0)) if keeps_gathered(remat) else big * (pb + F32)
        return kept, big * F32

    def weight_collectives(self, shape, remat):
        """The run's one gather, per layer, and the gradients' reduce-scatter."""
        big = shape.matrix_elems
        return (Collective("all-gather", DEVICES_ROLE, big * shape.param_bytes, prefetch=True),
                Collective("reduce-scatter", DEVICES_ROLE, big * F32, prefetch=True))
