"""Per-device kernels: attention (dense reference, blockwise/flash), online-softmax pieces, RoPE.

Everything here is local compute (no collectives) and imports only jax/numpy, so parallel
strategies (dense, tensor-parallel, ring attention, Ulysses, METP) can compose it.
"""
from sharding.ops.attention import blockwise_attention, dense_attention
from sharding.ops.online_softmax import (
    Carry,
    attend_block,
    block_grads,
    compute_delta,
    default_scale,
    finish,
    init_carry,
    make_mask,
)
from sharding.ops.rope import apply_rope, rope_frequencies

__all__ = [
    "Carry",
    "apply_rope",
    "attend_block",
    "block_grads",
    "blockwise_attention",
    "compute_delta",
    "default_scale",
    "dense_attention",
    "finish",
    "init_carry",
    "make_mask",
    "rope_frequencies",
]
