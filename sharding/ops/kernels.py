"""The kernel that computes a device's local attention, and its differentiable entry point.

Every strategy attends its local queries to local (or visiting) keys through one `Kernel`:

- `xla`: the flash kernel written in XLA ops (`sharding.ops.flash`), any platform;
- `pallas`: the Pallas flash kernel (`sharding.ops.pallas_flash`): Triton on GPUs, Pallas's
  interpret mode on CPU (tests).

Both give (out, log-sum-exp) forward and (dq, dk, dv) from (lse, delta) backward, with masks
from segment ids and absolute indices, so the plain strategies call it on whole rows and the
ring kernels (`ring`, `metp`) per visiting block, merged by log-sum-exp. Each runs per device,
inside the strategy's `shard_map` where it has one, so a `pallas_call` needs no partitioning rule.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp

from sharding.ops.flash import Tiling, check_heads, default_scale, flash_backward, flash_forward
from sharding.remat import keep

_F32 = jnp.float32
NAMES = ("xla", "pallas")


@dataclass(frozen=True)
class Kernel:
    """A local attention kernel: its name, the tile bounds it is given (None: whole lengths;
    each kernel shrinks them to what suits it) and, for Pallas, whether it is interpreted."""

    name: str = "xla"
    block_q: Optional[int] = None
    block_k: Optional[int] = None
    interpret: bool = False

    def __post_init__(self):
        if self.name not in NAMES:
            raise ValueError(f"unknown attention kernel {self.name!r} (known: {', '.join(NAMES)})")

    def _pallas_block(self) -> dict:
        from sharding.ops.pallas_flash import BLOCK
        block = min(b for b in (self.block_q, self.block_k, BLOCK) if b)
        return dict(block=1 << (block.bit_length() - 1), interpret=self.interpret)

    def forward(self, q, k, v, ids, *, causal: bool, scale: float):
        """(out [B, Sq, H, D] float32, lse [B, Sq, H] float32); not differentiable by itself."""
        if self.name == "pallas":
            from sharding.ops.pallas_flash import pallas_forward
            return pallas_forward(q, k, v, ids, causal=causal, scale=scale, **self._pallas_block())
        return flash_forward(q, k, v, ids, Tiling.of(q, k, self.block_q, self.block_k), causal=causal, scale=scale)

    def backward(self, q, k, v, ids, lse, dout, delta, *, causal: bool, scale: float):
        """float32 (dq, dk, dv) from lse and delta = rowsum(dout * out) - dlse."""
        if self.name == "pallas":
            from sharding.ops.pallas_flash import pallas_backward
            return pallas_backward(q, k, v, ids, lse, dout, delta, causal=causal, scale=scale, **self._pallas_block())
        return flash_backward(q, k, v, ids, lse, dout, delta, Tiling.of(q, k, self.block_q, self.block_k),
                              causal=causal, scale=scale)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _attention(q, k, v, ids, kernel, causal, scale, out_dtype):
    out, lse = kernel.forward(q, k, v, ids, causal=causal, scale=scale)
    return out.astype(out_dtype), lse


def _attention_fwd(q, k, v, ids, kernel, causal, scale, out_dtype):
    out, lse = kernel.forward(q, k, v, ids, causal=causal, scale=scale)
    out, lse = keep((out.astype(out_dtype), lse))  # q, k, v are marked by whoever made them
    return (out, lse), (q, k, v, ids, out, lse)


def _attention_bwd(kernel, causal, scale, out_dtype, res, cts):
    q, k, v, ids, out, lse = res
    dout, dlse = cts
    delta = jnp.sum(out.astype(_F32) * dout.astype(_F32), axis=-1) - dlse
    dq, dk, dv = kernel.backward(q, k, v, ids, lse, dout, delta, causal=causal, scale=scale)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_attention.defvjp(_attention_fwd, _attention_bwd)


def flash_attention(q, k, v, ids, kernel: Kernel = Kernel(), *, causal: bool = True, scale: Optional[float] = None,
                    out_dtype=None):
    """(out [B, Sq, H, D] in `out_dtype` (default q's), lse [B, Sq, H] float32) of q over k, v
    (`[B, Skv, G, D]`) with the ids of `flash.materialize_ids`, by `kernel`; differentiable
    (a custom VJP: the backward recomputes the probabilities from lse, whose own cotangent is
    honoured, so partial results may be merged by log-sum-exp under autodiff)."""
    check_heads(q, k, v)
    scale = default_scale(q.shape[-1]) if scale is None else float(scale)
    out_dtype = jnp.dtype(q.dtype if out_dtype is None else out_dtype)
    return _attention(q, k, v, tuple(ids), kernel, bool(causal), scale, out_dtype)
