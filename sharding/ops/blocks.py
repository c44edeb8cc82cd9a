"""Per-device layer math shared by every strategy: norm, attention block, MLP block.

Strategies decide where these run (which shard of batch, sequence or heads a device holds)
and which collectives surround them; the arithmetic lives here once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp

from sharding.ops.attention import blockwise_attention, dense_attention
from sharding.ops.fused_attention import KERNELS, fused_attention
from sharding.ops.rope import apply_rope


@dataclass(frozen=True)
class BlockSpec:
    """Static shape and numerics of one Transformer layer (hashable: part of a program key)."""

    n_heads: int
    head_dim: int
    d_model: int
    d_ff: int
    gated: bool = True
    activation: str = "silu"
    attention: str = "auto"  # auto | dense | blockwise | cudnn | pallas (fused, blockwise where they do not serve)
    attention_block: int = 512
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    compute_dtype: str = "float32"

    @property
    def dtype(self):
        return jnp.dtype(self.compute_dtype)

    def use_blockwise(self, seq_len: int) -> bool:
        """Whether attention at this length keeps O(S) memory (blockwise, or a fused flash kernel)."""
        if self.attention == "auto":
            return seq_len > self.attention_block
        return self.attention in ("blockwise", *KERNELS)


_ACTIVATIONS = {"silu": jax.nn.silu, "gelu": jax.nn.gelu, "relu": jax.nn.relu}


def rms_norm(x, scale, eps: float):
    """RMSNorm in float32, returned in x's dtype."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


def qkv_projection(wqkv, x, positions, spec: BlockSpec):
    """x [B,S,D] @ wqkv [D,3,H,K] -> rotated q, k and v, each [B,S,H,K]."""
    qkv = jnp.einsum("bsd,dthk->tbshk", x, wqkv.astype(x.dtype))
    q = apply_rope(qkv[0], positions, spec.rope_theta)
    k = apply_rope(qkv[1], positions, spec.rope_theta)
    return q, k, qkv[2]


def local_attention(q, k, v, spec: BlockSpec, *, q_segment_ids=None, kv_segment_ids=None,
                    q_index=None, kv_index=None):
    """Causal, segment-masked attention over the keys this device holds: a fused kernel where
    `spec.attention` names one and it serves the case (self-attention over whole rows), else
    dense or blockwise."""
    kwargs = dict(q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                  q_index=q_index, kv_index=kv_index)
    whole_rows = q_index is None and kv_index is None and q_segment_ids is not None and q_segment_ids is kv_segment_ids
    if spec.attention in KERNELS and whole_rows:
        out, _ = fused_attention(spec.attention, q, k, v, q_segment_ids)
        if out is not None:
            return out
    if spec.use_blockwise(k.shape[1]):
        return blockwise_attention(q, k, v, block_size=spec.attention_block, **kwargs)
    return dense_attention(q, k, v, **kwargs)


def output_projection(o, wo):
    """o [B,S,H,K] @ wo [H,K,D] -> [B,S,D]."""
    return jnp.einsum("bshk,hkd->bsd", o, wo.astype(o.dtype))


def attention_block(wqkv, wo, x, segment_ids, positions, spec: BlockSpec,
                    index: Optional[jax.Array] = None):
    """Attention sub-layer on local data: projections, rotary positions, attention, output."""
    q, k, v = qkv_projection(wqkv, x, positions, spec)
    o = local_attention(q, k, v, spec, q_segment_ids=segment_ids, kv_segment_ids=segment_ids,
                        q_index=index, kv_index=index)
    return output_projection(o, wo)


def mlp_hidden(w_in, x, spec: BlockSpec):
    """act(x W_gate) * (x W_up) for gated MLPs, act(x W_in) otherwise; w_in [D, G, F]."""
    h = jnp.einsum("bsd,dgf->gbsf", x, w_in.astype(x.dtype))
    act = _ACTIVATIONS[spec.activation]
    return act(h[0]) * h[1] if spec.gated else act(h[0])


def mlp_block(w_in, w_out, x, spec: BlockSpec):
    """MLP sub-layer on local data: act(x W_in) W_out."""
    return jnp.einsum("bsf,fd->bsd", mlp_hidden(w_in, x, spec), w_out.astype(x.dtype))
