"""The learning-rate schedule: linear warmup from 0, then cosine decay to a floor.

The horizon may be a traced value: the compiled train step takes it as an input, so a longer
run (a new `--steps` or `optimizer.total_steps`) reuses every compiled program.
"""
from __future__ import annotations

import jax.numpy as jnp


def lr_at(step, peak: float, warmup_steps: int, total_steps, min_lr_ratio: float):
    """The lr at `step`: 0 to `peak` over `warmup_steps`, cosine to `peak * min_lr_ratio` at
    `total_steps` (an int or a traced scalar), held there after it.

    With no warmup the cosine starts at step 0. When the warmup is as long as the horizon or
    longer there is no room for the decay: the lr rises over `warmup_steps` and then holds at
    `peak`. The arithmetic is optax's `warmup_cosine_decay_schedule` (bit for bit at a
    constant horizon), with the horizon allowed to be traced.
    """
    step = jnp.asarray(step)
    if warmup_steps <= 0:
        return _cosine(step, peak, jnp.asarray(total_steps, jnp.float32), min_lr_ratio)
    warm = _linear(step, peak, warmup_steps)
    alpha = 0.0 if peak == 0.0 else peak * min_lr_ratio / peak
    decay_steps = jnp.asarray(total_steps, jnp.float32) - warmup_steps
    cosine = _cosine(step - warmup_steps, peak, jnp.maximum(decay_steps, 1.0), alpha)
    after = jnp.where(decay_steps > 0, cosine, warm)  # no room for the decay: hold the peak
    return jnp.where(step < warmup_steps, warm, after)


def _linear(count, peak: float, steps: int):
    """optax.linear_schedule(0, peak, steps)."""
    frac = 1 - jnp.clip(count, 0, steps) / steps
    return (0.0 - peak) * frac + peak


def _cosine(count, peak: float, decay_steps, alpha: float):
    """optax.cosine_decay_schedule(peak, decay_steps, alpha), decay_steps a float32 scalar."""
    count = jnp.minimum(count.astype(jnp.float32), decay_steps)
    cosine_decay = 0.5 * (1 + jnp.cos(jnp.pi * count / decay_steps))
    return peak * ((1 - alpha) * cosine_decay + alpha)


def lr_schedule(peak: float, warmup_steps: int, total_steps, min_lr_ratio: float):
    """Step -> lr (`lr_at` with these settings), an optax schedule."""
    if isinstance(total_steps, int) and total_steps <= 0:
        raise ValueError(f"the schedule needs a positive total_steps, got {total_steps}")
    return lambda step: lr_at(step, peak, warmup_steps, total_steps, min_lr_ratio)
