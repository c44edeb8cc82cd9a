"""XGrad weight prediction (arXiv 2305.18240): θ̂ = θ − s·lr_t·Δ_t from the optimizer state alone.

Δ_t is the direction the next plain update would take per unit learning rate if the moments
stayed as they are (no new gradient):

- sgdm: the momentum buffer (optax's `trace`: t = g + μ t, no dampening);
- adam / adamw: m̂ / (√v̂ + ε), bias-corrected with the state's count (decay is not included);
- adabelief: m̂ / (√ŝ + ε), ŝ from optax's stored belief moment (which already holds its
  `eps_root`), exactly as `optax.scale_by_belief` forms its update;
- adam3: m̂ / (√v̂ + ε) with its momentum-squared v.

At step 0 (fresh state, count = 0, all moments 0) Δ = 0, so θ̂ = θ: the bias corrections are
taken with count max(count, 1) and the result is zeroed while count = 0, so 0/0 never appears.
The moment states are found by type anywhere in the optax state tree, so clipping, masks and
chain order do not matter.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from dysejax.optim.adam3 import ScaleByAdam3State
from dysejax.optim.factory import Optimizer

_MOMENT_STATE = {
    "sgdm": optax.TraceState,
    "adam": optax.ScaleByAdamState,
    "adamw": optax.ScaleByAdamState,
    "adabelief": optax.ScaleByBeliefState,
    "adam3": ScaleByAdam3State,
}


def find_state(opt_state, state_type: type):
    """The one `state_type` node inside an optax state tree, wherever the chain put it."""
    is_match = lambda x: isinstance(x, state_type)  # noqa: E731
    found = [x for x in jax.tree.leaves(opt_state, is_leaf=is_match) if is_match(x)]
    if len(found) != 1:
        raise ValueError(f"expected exactly one {state_type.__name__} in the optimizer state, "
                         f"found {len(found)}")
    return found[0]


def update_direction(optimizer: Optimizer, opt_state):
    """Δ_t, a tree like the params: the next update's direction per unit lr, from the state only."""
    state = find_state(opt_state, _MOMENT_STATE[optimizer.name])
    if optimizer.name == "sgdm":
        return state.trace
    return _debiased_ratio(state.mu, state.nu, state.count, optimizer.b1, optimizer.b2, optimizer.eps)


def predict_params(optimizer: Optimizer, params, opt_state, step, horizon=None):
    """θ̂ = θ − s·lr(step)·Δ (XGrad); `params` itself, untouched, when s = 0. Pure and jit-friendly.

    `step` is the number of updates applied so far: the count the schedule inside `tx` will use
    for the next update; `horizon` the schedule's (default: the optimizer's own).
    """
    s = optimizer.prediction_steps
    if s == 0:
        return params
    scale = s * optimizer.schedule(step, horizon)
    direction = update_direction(optimizer, opt_state)
    return jax.tree.map(lambda p, d: (p - scale * d).astype(p.dtype), params, direction)


def _debiased_ratio(mu, nu, count, b1: float, b2: float, eps: float):
    started = count > 0
    t = jnp.maximum(count, 1)

    def ratio(m, v):
        m_hat = m / (1 - b1 ** t).astype(m.dtype)
        v_hat = v / (1 - b2 ** t).astype(v.dtype)
        return jnp.where(started, m_hat / (jnp.sqrt(v_hat) + eps), jnp.zeros_like(m))

    return jax.tree.map(ratio, mu, nu)
