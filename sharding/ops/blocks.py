"""Per-device layer math shared by every strategy: norm, attention block, MLP block.

Strategies decide where these run (which shard of batch, sequence or heads a device holds)
and which collectives surround them; the arithmetic lives here once.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp

from sharding.ops.attention import dense_attention
from sharding.ops.flash import materialize_ids
from sharding.ops.fused_attention import KERNELS, cudnn_attention, cudnn_unserved, pallas_unserved
from sharding.ops.kernels import Kernel, flash_attention
from sharding.ops.rope import RopeScaling, apply_rope
from sharding.remat import keep


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
    n_kv_heads: Optional[int] = None  # K/V heads (grouped-query attention); None: n_heads
    rope_scaling: Optional[RopeScaling] = None

    @property
    def dtype(self):
        return jnp.dtype(self.compute_dtype)

    @property
    def kv_heads(self) -> int:
        """K/V heads G; query head h reads K/V head h // (n_heads / G)."""
        return self.n_kv_heads or self.n_heads

    def use_blockwise(self, seq_len: int) -> bool:
        """Whether attention at this length keeps O(S) memory (blockwise, or a fused flash kernel)."""
        if self.attention == "auto":
            return seq_len > self.attention_block
        return self.attention in ("blockwise", *KERNELS)


# gelu is the tanh approximation (JAX's default; transformers' gelu_pytorch_tanh / gelu_new),
# gelu_exact the erf form (transformers' and torch's gelu)
_ACTIVATIONS = {"silu": jax.nn.silu, "gelu": jax.nn.gelu, "gelu_exact": functools.partial(jax.nn.gelu, approximate=False),
                "relu": jax.nn.relu}


def rms_norm(x, scale, eps: float):
    """RMSNorm in float32, returned in x's dtype."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


ATTENTION_MATRICES = ("wq", "wkv", "wo")  # [D, H, K], [D, 2, G, K], [H, K, D]


def attention_weights(w: dict) -> dict:
    """The attention sub-layer's matrices of a layer's weights."""
    return {name: w[name] for name in ATTENTION_MATRICES}


def qkv_projection(w, x, positions, spec: BlockSpec):
    """x [B,S,D] @ w["wq"] [D,H,K], w["wkv"] [D,2,G,K] -> rotated q [B,S,H,K], rotated k and
    v [B,S,G,K]."""
    H, G = w["wq"].shape[1], w["wkv"].shape[2]
    rope = lambda t: keep(apply_rope(t, positions, spec.rope_theta, spec.rope_scaling))  # noqa: E731
    # One matmul for q, k and v (two would keep another [B, S, D] partial sum in the backward).
    # With as many K/V heads as query heads, a leading q/k/v axis makes the three slices free.
    wqkv = _joined(w["wq"], w["wkv"], grouped=G != H).astype(x.dtype)
    if G == H:
        qkv = jnp.einsum("bsd,dthk->tbshk", x, wqkv)
        return rope(qkv[0]), rope(qkv[1]), keep(qkv[2])
    qkv = jnp.einsum("bsd,dhk->bshk", x, wqkv)
    return rope(qkv[:, :, :H]), rope(qkv[:, :, H:H + G]), keep(qkv[:, :, H + G:])


def _joined(wq, wkv, grouped: bool):
    """[D, 3, H, K] (G = H) or [D, H + 2G, K] (G < H) from wq [D, H, K] and wkv [D, 2, G, K]."""
    if not grouped:
        return jnp.concatenate([wq[:, None], wkv], axis=1)
    D, G, K = wkv.shape[0], wkv.shape[2], wkv.shape[3]
    return jnp.concatenate([wq, wkv.reshape(D, 2 * G, K)], axis=1)


def kv_heads_for_group(wkv, p: int):
    """wkv [..., G, K] with K/V heads repeated so that the p devices of a model-parallel group
    each hold whole heads: unchanged when p divides G, else each head repeated p / G times
    (Megatron's K/V replication; autodiff sums the copies' gradients). Needs G % p == 0 or
    p % G == 0 (`kv_split_error`)."""
    g = wkv.shape[-2]
    return wkv if g % p == 0 else jnp.repeat(wkv, p // g, axis=-2)


def kv_split_error(spec: BlockSpec, p: int) -> Optional[str]:
    """Why the K/V heads cannot be split over p devices (None when they can)."""
    g = spec.kv_heads
    if g % p == 0 or p % g == 0:
        return None
    return f"n_kv_heads ({g}) to divide or be divisible by the model-parallel size ({p})"


def attention_kernel(spec: BlockSpec, seq_len: Optional[int] = None, platform: Optional[str] = None) -> Kernel:
    """The local kernel of `spec` (`sharding.ops.kernels`): Pallas's where `spec.attention` is
    "pallas" and it serves on this platform (interpreted on CPU), else the XLA flash kernel; tiles
    of at most `attention_block`, or whole lengths where `spec` keeps attention dense at this
    sequence length (`use_blockwise`; None: tiled)."""
    platform = platform or jax.default_backend()
    block = spec.attention_block if seq_len is None or spec.use_blockwise(seq_len) else None
    if spec.attention == "pallas" and pallas_unserved(spec.head_dim, platform) is None:
        return Kernel("pallas", block, block, interpret=platform == "cpu")
    return Kernel("xla", block, block)


def local_attention(q, k, v, spec: BlockSpec, *, q_segment_ids=None, kv_segment_ids=None,
                    q_index=None, kv_index=None):
    """Causal, segment-masked attention over the keys this device holds: cuDNN's fused kernel
    where `spec.attention` is "cudnn" and it serves (rows of one document, whole), else the
    dense reference at lengths where `spec` keeps attention dense, else the spec's flash kernel
    (`attention_kernel`)."""
    kwargs = dict(q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                  q_index=q_index, kv_index=kv_index)
    whole_rows = q_index is None and kv_index is None and q_segment_ids is not None and q_segment_ids is kv_segment_ids
    if spec.attention == "cudnn" and whole_rows and cudnn_unserved(q, jax.default_backend()) is None:
        return cudnn_attention(q, k, v, q_segment_ids)
    if not spec.use_blockwise(k.shape[1]):
        return dense_attention(q, k, v, **kwargs)
    ids = materialize_ids(q.shape[0], q.shape[1], k.shape[1], q_segment_ids, kv_segment_ids, q_index, kv_index)
    return flash_attention(q, k, v, ids, attention_kernel(spec))[0]


def output_projection(o, wo):
    """o [B,S,H,K] @ wo [H,K,D] -> [B,S,D]."""
    return jnp.einsum("bshk,hkd->bsd", o, wo.astype(o.dtype))


def attention_block(w, x, segment_ids, positions, spec: BlockSpec, index: Optional[jax.Array] = None,
                    attend=None):
    """Attention sub-layer on local data (w: `attention_weights`): projections, rotary
    positions, attention (`attend(q, k, v, segment_ids)` if given, else `local_attention`),
    output."""
    q, k, v = qkv_projection(w, x, positions, spec)
    if attend is not None:
        o = attend(q, k, v, segment_ids)
    else:
        o = local_attention(q, k, v, spec, q_segment_ids=segment_ids, kv_segment_ids=segment_ids,
                            q_index=index, kv_index=index)
    return output_projection(o, w["wo"])


def mlp_hidden(w_in, x, spec: BlockSpec):
    """act(x W_gate) * (x W_up) for gated MLPs, act(x W_in) otherwise; w_in [D, G, F]."""
    h = keep(jnp.einsum("bsd,dgf->gbsf", x, w_in.astype(x.dtype)))  # the activation is recomputed
    act = _ACTIVATIONS[spec.activation]
    return act(h[0]) * h[1] if spec.gated else act(h[0])


def mlp_block(w_in, w_out, x, spec: BlockSpec):
    """MLP sub-layer on local data: act(x W_in) W_out."""
    return jnp.einsum("bsf,fd->bsd", mlp_hidden(w_in, x, spec), w_out.astype(x.dtype))
