"""Rotary position embedding (rotate-half / Llama / GPT-NeoX convention), with Llama's scalings."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp

ROPE_SCALINGS = ("linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """Frequency scaling for contexts longer than pre-training (Hugging Face `rope_scaling`).

    linear: every frequency divided by `factor` (position interpolation). llama3: wavelengths
    above original_max_position / low_freq_factor divided by `factor`, below
    original_max_position / high_freq_factor kept, smoothly interpolated in between.
    """

    kind: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192

    def __post_init__(self):
        if self.kind not in ROPE_SCALINGS:
            raise ValueError(f"unknown rope scaling {self.kind!r} (known: {', '.join(ROPE_SCALINGS)})")

    def apply(self, inv_freq: jax.Array) -> jax.Array:
        """Scaled inverse frequencies."""
        if self.kind == "linear":
            return inv_freq / self.factor
        old = float(self.original_max_position)
        wavelen = 2 * math.pi / inv_freq
        scaled = jnp.where(wavelen > old / self.low_freq_factor, inv_freq / self.factor, inv_freq)
        smooth = (old / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = (wavelen >= old / self.high_freq_factor) & (wavelen <= old / self.low_freq_factor)
        return jnp.where(medium, smoothed, scaled)


def rope_frequencies(head_dim: int, theta: float = 10000.0, scaling: Optional[RopeScaling] = None) -> jax.Array:
    """inv_freq[i] = theta^(-2i/D) for i < D/2 (then `scaling`), float32."""
    if head_dim % 2:
        raise ValueError(f"rope needs an even head dim, got {head_dim}")
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    return inv_freq if scaling is None else scaling.apply(inv_freq)


def apply_rope(x: jax.Array, positions: jax.Array, theta: float = 10000.0,
               scaling: Optional[RopeScaling] = None) -> jax.Array:
    """Rotate x [B, S, H, D] by integer positions [B, S] (per-document positions).

    With x = [x1, x2] (halves of D) and angle a_i = pos * inv_freq[i]:
    out = [x1 cos a - x2 sin a, x2 cos a + x1 sin a]. Computed in float32, returned in x.dtype.
    """
    D = x.shape[-1]
    inv_freq = rope_frequencies(D, theta, scaling)
    ang = jnp.asarray(positions).astype(jnp.float32)[..., None] * inv_freq  # [B, S, D/2]
    cos = jnp.cos(ang)[:, :, None, :]  # [B, S, 1, D/2]
    sin = jnp.sin(ang)[:, :, None, :]
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., : D // 2], xf[..., D // 2 :]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)
