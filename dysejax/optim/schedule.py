"""The learning-rate schedule: linear warmup from 0, then cosine decay to a floor."""
from __future__ import annotations

import optax


def lr_schedule(peak: float, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> optax.Schedule:
    """Step -> lr: 0 to `peak` over `warmup_steps`, cosine to `peak * min_lr_ratio` at `total_steps`.

    With no warmup the cosine starts at step 0. When the warmup is as long as the horizon or
    longer there is no room for the decay: the lr rises over `warmup_steps` and then holds at
    `peak`. After `total_steps` the lr holds at its last value.
    """
    if total_steps <= 0:
        raise ValueError(f"the schedule needs a positive total_steps, got {total_steps}")
    if warmup_steps <= 0:
        return optax.cosine_decay_schedule(peak, total_steps, alpha=min_lr_ratio)
    if warmup_steps >= total_steps:
        return optax.linear_schedule(0.0, peak, warmup_steps)
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=peak, warmup_steps=warmup_steps,
        decay_steps=total_steps, end_value=peak * min_lr_ratio)
