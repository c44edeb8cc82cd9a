"""The train and eval step functions (pure; compiled per bucket by `dysejax.programs`)."""
from __future__ import annotations

from functools import partial
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from dysejax.model.transformer import Transformer, block_spec
from dysejax.optim import Optimizer, predict_params
from sharding.pipeline import Pipeline, pipeline_loss
from sharding.plan import Plan
from sharding.strategies import get_strategy

BATCH_KEYS = ("inputs", "targets", "segment_ids", "positions", "loss_mask")


def loss_sums(model: Transformer, plan: Plan, mesh: Mesh, params, batch, pipeline: Optional[Pipeline] = None):
    """(sum of token cross-entropies, number of loss tokens) for one batch."""
    method = None if pipeline is None else partial(_pipelined, pipeline=pipeline)
    return model.apply({"params": params}, batch["inputs"], batch["segment_ids"], batch["positions"],
                       batch["targets"], batch["loss_mask"], plan=plan, mesh=mesh, method=method)


def _pipelined(module: Transformer, inputs, segment_ids, positions, targets, loss_mask, *, plan, mesh, pipeline):
    """The model's loss with its layers run as a pipeline (embedding before it, head in its last stage)."""
    spec = block_spec(module.cfg)
    x = get_strategy(plan.runs[0].strategy).embed(module.embed, inputs, mesh).astype(spec.dtype)
    return pipeline_loss(pipeline, plan, spec, mesh, module.layers, module.final_norm, module.head(), x,
                         segment_ids, positions, targets, loss_mask, default_remat=module.cfg.remat,
                         loss_chunk=module.cfg.loss_chunk)


def _microbatches(batch, n: int):
    """[B, ...] -> [n, B/n, ...], micro-batch j = rows j, j+n, ... so each keeps the row sharding."""
    def split(x):
        x = x.reshape(x.shape[0] // n, n, *x.shape[1:])
        return jnp.swapaxes(x, 0, 1)
    return jax.tree.map(split, batch)


def make_train_step(model: Transformer, optimizer: Optimizer, plan: Plan, mesh: Mesh,
                    grad_accum: int = 1, skip_nonfinite: bool = False,
                    pipeline: Optional[Pipeline] = None) -> Callable:
    """state, batch, horizon -> new state, metrics. Gradients are taken at XGrad's predicted weights.

    `horizon` (an int32 scalar input, default the optimizer's own) is the lr schedule's length:
    an input, not a constant, so a longer run compiles nothing new. With `skip_nonfinite`, a step whose loss or gradient norm is not finite leaves params and
    optimizer state as they were (metrics report `finite` either way).
    """
    grad_fn = jax.value_and_grad(lambda p, b: loss_sums(model, plan, mesh, p, b, pipeline), has_aux=True)

    def gradients(params, batch):
        if grad_accum == 1:
            (loss_sum, count), grads = grad_fn(params, batch)
            return loss_sum, count, grads

        def accumulate(carry, micro):
            (loss_sum, count), grads = grad_fn(params, micro)
            total_loss, total_count, total_grads = carry
            return (total_loss + loss_sum, total_count + count,
                    jax.tree.map(jnp.add, total_grads, grads)), None

        zeros = jax.tree.map(jnp.zeros_like, params)
        (loss_sum, count, grads), _ = jax.lax.scan(
            accumulate, (jnp.zeros(()), jnp.zeros(()), zeros), _microbatches(batch, grad_accum))
        return loss_sum, count, grads

    def train_step(state, batch, horizon=None):
        params, opt_state, step = state["params"], state["opt_state"], state["step"]
        tx = optimizer.tx if horizon is None else optimizer.with_horizon(horizon)
        params_hat = predict_params(optimizer, params, opt_state, step, horizon)
        loss_sum, count, grads = gradients(params_hat, batch)
        denom = jnp.maximum(count, 1.0)
        grads = jax.tree.map(lambda g: (g / denom).astype(g.dtype), grads)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss_sum) & jnp.isfinite(grad_norm)
        updates, new_opt_state = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        if skip_nonfinite:
            keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
            new_params = jax.tree.map(keep, new_params, params)
            new_opt_state = jax.tree.map(keep, new_opt_state, opt_state)
        metrics = {"loss": loss_sum / denom, "grad_norm": grad_norm, "finite": finite,
                   "lr": optimizer.schedule(step, horizon), "loss_tokens": count}
        return {"step": step + 1, "params": new_params, "opt_state": new_opt_state}, metrics

    return train_step


def make_eval_step(model: Transformer, plan: Plan, mesh: Mesh, pipeline: Optional[Pipeline] = None) -> Callable:
    """params, batch -> (loss sum, loss tokens)."""
    return lambda params, batch: loss_sums(model, plan, mesh, params, batch, pipeline)
