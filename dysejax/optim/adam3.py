"""AdaM3 (AdaMomentum, Wang et al., arXiv 2106.11514) as an optax transformation.

Adam whose second moment tracks the squared *momentum* instead of the squared gradient:

    m_t = b1 m_{t-1} + (1 - b1) g_t
    v_t = b2 v_{t-1} + (1 - b2) m_t^2 + eps_root
    update = m̂_t / (sqrt(v̂_t) + eps),   m̂_t = m_t / (1 - b1^t),  v̂_t = v_t / (1 - b2^t)

`eps_root` (default 0) is added to the stored moment each step, as optax's AdaBelief does;
set it to `eps` for the AdaBelief-style variant with epsilon inside the second moment.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax


class ScaleByAdam3State(NamedTuple):
    """State of `scale_by_adam3`: step count, first moment, second moment of the first moment."""

    count: jax.Array  # shape (), int32
    mu: optax.Updates
    nu: optax.Updates


def scale_by_adam3(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                   eps_root: float = 0.0) -> optax.GradientTransformation:
    """Rescale gradients by the AdaM3 rule (no learning rate applied)."""

    def init_fn(params):
        return ScaleByAdam3State(count=jnp.zeros([], jnp.int32),
                                 mu=optax.tree.zeros_like(params), nu=optax.tree.zeros_like(params))

    def update_fn(updates, state, params=None):
        del params
        mu = optax.tree.update_moment(updates, state.mu, b1, 1)
        nu = optax.tree.update_moment_per_elem_norm(mu, state.nu, b2, 2)
        if eps_root:
            nu = jax.tree.map(lambda v: v + eps_root, nu)
        count = optax.safe_increment(state.count)
        mu_hat = optax.tree.bias_correction(mu, b1, count)
        nu_hat = optax.tree.bias_correction(nu, b2, count)
        updates = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu_hat, nu_hat)
        return updates, ScaleByAdam3State(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init_fn, update_fn)


def adam3(learning_rate: optax.ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8, eps_root: float = 0.0) -> optax.GradientTransformation:
    """The AdaM3 optimizer: `scale_by_adam3` followed by the (scheduled) learning rate."""
    return optax.chain(scale_by_adam3(b1, b2, eps, eps_root), optax.scale_by_learning_rate(learning_rate))
