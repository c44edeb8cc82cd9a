"""Rotary position embedding (rotate-half / Llama / GPT-NeoX convention)."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def rope_frequencies(head_dim: int, theta: float = 10000.0) -> jax.Array:
    """inv_freq[i] = theta^(-2i/D) for i < D/2, float32."""
    if head_dim % 2:
        raise ValueError(f"rope needs an even head dim, got {head_dim}")
    return 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))


def apply_rope(x: jax.Array, positions: jax.Array, theta: float = 10000.0) -> jax.Array:
    """Rotate x [B, S, H, D] by integer positions [B, S] (per-document positions).

    With x = [x1, x2] (halves of D) and angle a_i = pos * inv_freq[i]:
    out = [x1 cos a - x2 sin a, x2 cos a + x1 sin a]. Computed in float32, returned in x.dtype.
    """
    D = x.shape[-1]
    inv_freq = rope_frequencies(D, theta)
    ang = jnp.asarray(positions).astype(jnp.float32)[..., None] * inv_freq  # [B, S, D/2]
    cos = jnp.cos(ang)[:, :, None, :]  # [B, S, 1, D/2]
    sin = jnp.sin(ang)[:, :, None, :]
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., : D // 2], xf[..., D // 2 :]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)
