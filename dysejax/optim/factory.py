"""`OptimizerConfig` -> `Optimizer`: the optax chain, its lr schedule, what weight prediction reads."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import optax

from dysejax.config import OptimizerConfig
from dysejax.errors import ConfigError
from dysejax.optim.adam3 import adam3
from dysejax.optim.schedule import lr_schedule


@dataclass(frozen=True)
class Optimizer:
    """An optax transformation with its lr schedule and the hyper-parameters XGrad needs.

    `tx` schedules the lr over the default `horizon`; `with_horizon(h)` is the same chain (same
    state) over horizon `h`, which may be a traced value: the train step takes it as an input.
    """

    name: str  # sgdm | adam | adamw | adabelief | adam3
    tx: optax.GradientTransformation
    make_tx: Callable  # horizon -> the chain with its lr schedule over that horizon
    make_schedule: Callable  # horizon -> (step -> lr)
    horizon: int  # the default schedule horizon
    b1: float
    b2: float
    eps: float
    prediction_steps: int = 0  # XGrad s; 0: no weight prediction

    def schedule(self, step, horizon=None):
        """The lr at `step` over `horizon` (default: the optimizer's own)."""
        return self.make_schedule(self.horizon if horizon is None else horizon)(step)

    def with_horizon(self, horizon) -> optax.GradientTransformation:
        """The chain with its lr schedule over `horizon` (an int or a traced scalar)."""
        return self.make_tx(horizon)

    def init(self, params):
        """The initial optimizer state for `params`."""
        return self.tx.init(params)

    def update(self, grads, opt_state, params=None):
        """(updates, new_state) for `grads`; apply with `optax.apply_updates`."""
        return self.tx.update(grads, opt_state, params)


def weight_decay_mask(params):
    """True for parameters that get weight decay: matrices and up (ndim >= 2), not biases/norms."""
    return jax.tree.map(lambda p: jnp.ndim(p) >= 2, params)


def schedule_horizon(cfg: OptimizerConfig, total_steps: int) -> int:
    """The lr schedule's horizon: `cfg.total_steps`, else `total_steps` (the run's step target)."""
    horizon = cfg.total_steps if cfg.total_steps is not None else total_steps
    if horizon <= 0:
        raise ConfigError(f"optimizer schedule horizon must be positive, got total_steps={horizon}")
    return horizon


def build_optimizer(cfg: OptimizerConfig, total_steps: Optional[int] = None) -> Optimizer:
    """The optimizer `cfg` describes; its default horizon is `schedule_horizon(cfg, total_steps)`."""
    horizon = schedule_horizon(cfg, 1 if total_steps is None else total_steps)

    def make_schedule(h):
        return lr_schedule(cfg.lr, cfg.warmup_steps, h, cfg.min_lr_ratio)

    def make_tx(h):
        tx = _base(cfg, make_schedule(h))
        if cfg.clip_norm is not None:
            tx = optax.chain(optax.clip_by_global_norm(cfg.clip_norm), tx)
        return tx

    return Optimizer(name=cfg.name, tx=make_tx(horizon), make_tx=make_tx, make_schedule=make_schedule,
                     horizon=horizon, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
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
