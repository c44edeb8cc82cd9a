"""Optimizers (optax chains with warmup-cosine lr and clipping) and XGrad weight prediction."""
from dysejax.optim.adam3 import ScaleByAdam3State, adam3, scale_by_adam3
from dysejax.optim.factory import Optimizer, build_optimizer, schedule_horizon, weight_decay_mask
from dysejax.optim.prediction import find_state, predict_params, update_direction
from dysejax.optim.schedule import lr_at, lr_schedule

__all__ = [
    "Optimizer", "build_optimizer", "schedule_horizon", "weight_decay_mask", "lr_at", "lr_schedule",
    "predict_params", "update_direction", "find_state",
    "adam3", "scale_by_adam3", "ScaleByAdam3State",
]
