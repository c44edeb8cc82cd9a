"""`OptimizerConfig` -> `Optimizer`: the optax chain, its lr schedule, what weight prediction reads."""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax

from dysejax.config import OptimizerConfig
from dysejax.errors import ConfigError
from dysejax.optim.adam3 import adam3
from dysejax.optim.schedule import lr_schedule


@dataclass(frozen=True)
class Optimizer:
    """An optax transformation with its lr schedule and the hyper-parameters XGrad needs."""

    name: str  # sgdm | adam | adamw | adabelief | adam3
    tx: optax.GradientTransformation
    schedule: optax.Schedule  # step -> lr, the one inside `tx`
    b1: float
    b2: float
    eps: float
    prediction_steps: int = 0  # XGrad s; 0: no weight prediction

    def init(self, params):
        """The initial optimizer state for `params`."""
        return self.tx.init(params)

    def update(self, grads, opt_state, params=None):
        """(updates, new_state) for `grads`; apply with `optax.apply_updates`."""
        return self.tx.update(grads, opt_state, params)


def weight_decay_mask(params):
    """True for parameters that get weight decay: matrices and up (ndim >= 2), not biases/norms."""
    return jax.tree.map(lambda p: jnp.ndim(p) >= 2, params)


def build_optimizer(cfg: OptimizerConfig, total_steps: int) -> Optimizer:
    """The optimizer `cfg` describes; the schedule's horizon is `cfg.total_steps` or else `total_steps`."""
    horizon = cfg.total_steps if cfg.total_steps is not None else total_steps
    if horizon <= 0:
        raise ConfigError(f"optimizer schedule horizon must be positive, got total_steps={horizon}")
    schedule = lr_schedule(cfg.lr, cfg.warmup_steps, horizon, cfg.min_lr_ratio)
    tx = _base(cfg, schedule)
    if cfg.clip_norm is not None:
        tx = optax.chain(optax.clip_by_global_norm(cfg.clip_norm), tx)
    return Optimizer(name=cfg.name, tx=tx, schedule=schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                     prediction_steps=cfg.weight_prediction_steps)


def _base(cfg: OptimizerConfig, schedule: optax.Schedule) -> optax.GradientTransformation:
    if cfg.name == "sgdm":
        return optax.sgd(schedule, momentum=cfg.momentum)
    if cfg.name == "adam":
        return optax.adam(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
    if cfg.name == "adamw":
        return optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                           weight_decay=cfg.weight_decay, mask=weight_decay_mask)
    if cfg.name == "adabelief":
        return optax.adabelief(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
    if cfg.name == "adam3":
        return adam3(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
    raise ConfigError(f"optimizer.name: unknown optimizer {cfg.name!r} "
                      "(expected sgdm, adam, adamw, adabelief or adam3)")
