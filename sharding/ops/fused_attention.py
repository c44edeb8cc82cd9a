"""Fused accelerator attention kernels, each with the cases it serves; the caller falls back to
the blockwise kernel (`sharding.ops.attention`) where none does.

- `cudnn`: cuDNN flash attention through `jax.nn.dot_product_attention`, for rows that hold one
  document each (segment ids 1...1 then padding 0): padding is given as sequence lengths, as
  cuDNN takes it (it has no segment ids). JAX partitions it over batch and heads itself, so it
  serves under any strategy that keeps the sequence whole around attention.
- `pallas`: JAX's Pallas GPU flash attention (`jax.experimental.pallas.ops.gpu.attention.mha`,
  Triton), which takes segment ids: packed rows. A `pallas_call` has no partitioning rule, so
  it serves only a program on one device. On CPU it runs in Pallas's interpret mode (slow:
  tests only).

Both match the dense reference's semantics (causal within a row, attention within equal
nonzero segment ids, padding queries output 0 and get 0 gradient); checked on CPU.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

KERNELS = ("cudnn", "pallas")
_CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)


def cudnn_unserved(q, platform: str) -> Optional[str]:
    """Why the cuDNN kernel cannot run this case here, or None when it can."""
    if platform != "gpu":
        return f"cuDNN attention needs a GPU (platform {platform})"
    if q.dtype not in _CUDNN_DTYPES:
        return f"cuDNN attention needs bfloat16/float16 inputs, got {q.dtype}"
    if q.shape[-1] % 8 or q.shape[-1] > 128:
        return f"cuDNN attention needs a head_dim that is a multiple of 8 up to 128, got {q.shape[-1]}"
    return None


def pallas_unserved(q, platform: str, n_devices: int) -> Optional[str]:
    """Why the Pallas kernel cannot run this case here, or None when it can."""
    if platform not in ("gpu", "cpu"):
        return f"the Pallas GPU attention kernel does not run on {platform}"
    if n_devices != 1:
        return f"a pallas_call is not partitioned: it serves one device, the program has {n_devices}"
    s = q.shape[1]
    if s % min(128, s) or s % min(32, s):
        return f"the Pallas kernel needs a length that is a multiple of 128 (or of 32 below 128), got {s}"
    return None


def _zero_padding(out, segment_ids):
    """Padding queries (segment id 0) output 0 and pass no gradient back."""
    return jnp.where((segment_ids != 0)[:, :, None, None], out, jnp.zeros((), out.dtype))


def cudnn_attention(q, k, v, segment_ids, *, scale: Optional[float] = None, implementation: str = "cudnn"):
    """Causal attention over rows of one document each (`segment_ids` > 0, then padding 0).

    `implementation="xla"` runs the same call through XLA (any platform; used to check the
    lengths mapping on CPU). Rows holding several documents are not masked between them: the
    trainer chooses this kernel only for unpacked data.
    """
    lengths = jnp.sum(segment_ids != 0, axis=1).astype(jnp.int32)
    out = jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True, query_seq_lengths=lengths,
                                       key_value_seq_lengths=lengths, implementation=implementation)
    return _zero_padding(out, segment_ids)


def pallas_attention(q, k, v, segment_ids, *, scale: Optional[float] = None, interpret: bool = False):
    """Causal attention within equal segment ids (packed rows), Pallas flash kernel fwd + bwd."""
    from jax.experimental.pallas.ops.gpu.attention import BlockSizes, mha

    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = mha(q, k, v, segment_ids.astype(jnp.int32), sm_scale=scale, causal=True,
              block_sizes=BlockSizes.get_default(), interpret=interpret)
    return _zero_padding(out, segment_ids)


def fused_attention(kernel: str, q, k, v, segment_ids, *, platform: Optional[str] = None,
                    n_devices: Optional[int] = None):
    """`kernel`'s output for this case, or (None, why) when it does not serve it here."""
    platform = platform or jax.default_backend()
    n_devices = jax.device_count() if n_devices is None else n_devices
    if kernel == "cudnn":
        why = cudnn_unserved(q, platform)
        return (None, why) if why else (cudnn_attention(q, k, v, segment_ids), None)
    if kernel == "pallas":
        why = pallas_unserved(q, platform, n_devices)
        if why is None and k.shape[2] != q.shape[2]:  # grouped-query attention
            why = f"the Pallas kernel needs as many K/V heads as query heads, got {k.shape[2]} and {q.shape[2]}"
        return (None, why) if why else (pallas_attention(q, k, v, segment_ids, interpret=platform == "cpu"), None)
    raise ValueError(f"unknown fused attention kernel {kernel!r} (known: {', '.join(KERNELS)})")
