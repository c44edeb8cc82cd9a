"""Fused accelerator attention kernels, each with the cases it serves; where none does, the XLA
flash kernel (`sharding.ops.flash`) runs.

- `cudnn`: cuDNN flash attention through `jax.nn.dot_product_attention`, for whole rows that
  hold one document each (segment ids 1...1 then padding 0): padding is given as sequence
  lengths, as cuDNN takes it (it has no segment ids). Plain strategies and Ulysses (after its
  all-to-all) call it on their local rows.
- `pallas`: our Pallas flash kernel (`sharding.ops.pallas_flash`, through
  `sharding.ops.kernels.Kernel("pallas")`), which takes segment ids and absolute indices and
  returns the log-sum-exp: packed rows, and every ring step of `ring` and `metp`. On CPU it runs
  in Pallas's interpret mode (slow: tests only).

Both run per device (in the strategy's `shard_map`; `dp` / `fsdp` enter one around attention
for them), so neither needs a partitioning rule; both match the dense reference's semantics
(checked on CPU).
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from sharding.ops import pallas_flash

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


def pallas_unserved(head_dim: int, platform: str) -> Optional[str]:
    """Why the Pallas kernel cannot run here, or None when it can."""
    return pallas_flash.unserved(head_dim, platform)


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
