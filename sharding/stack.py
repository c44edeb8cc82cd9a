"""Executing a plan over a stack of layers whose weights are stored once, stacked.

The weights of all layers form one tree with a leading layers axis, in the unified storage
layout; a plan slices it into runs, and each run executes under one `lax.scan` with its remat
policy and its strategy's attention and MLP. The final norm and the loss head follow the stack.

The stack owns the one platform workaround (`sharding.ops.ordering`): on a mesh whose platform
starts independent collectives in any order (XLA:CPU), each run's and each sub-layer's weights,
the final norm and the head are tied to the activation stream, so their collectives follow the
previous ones on every device.
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from sharding import layout as L
from sharding.ops.blocks import BlockSpec, rms_norm
from sharding.ops.ordering import Ordering
from sharding.plan import Plan
from sharding.remat import checkpointed, keep
from sharding.strategies import get_strategy


def layer_weight_shapes(spec: BlockSpec) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """Per-layer weight shapes and logical axes (without the leading layers axis)."""
    d, h, k, f = spec.d_model, spec.n_heads, spec.head_dim, spec.d_ff
    shapes = {"attn_norm": (d,), "wq": (d, h, k), "wkv": (d, 2, spec.kv_heads, k), "wo": (h, k, d),
              "mlp_norm": (d,), "w_in": (d, 2 if spec.gated else 1, f), "w_out": (f, d)}
    return {name: (shape, L.LAYER_WEIGHT_AXES[name]) for name, shape in shapes.items()}


ATTENTION_WEIGHTS = ("attn_norm", "wq", "wkv", "wo")


def layer_forward(strategy, spec: BlockSpec, mesh: Mesh, w, x, segment_ids, positions, ordered: bool = True):
    """One pre-norm Transformer layer computed by `strategy`.

    ordered: each sub-layer's weights are tied to its input (`sharding.ops.ordering`), so their
    gathers follow the previous sub-layer's collectives on XLA:CPU (False inside shard_map)."""
    order = Ordering.for_mesh(mesh) if ordered else Ordering()
    attn, x = order.tie({k: w[k] for k in ATTENTION_WEIGHTS}, x)
    w = dict(w, **attn)
    h = rms_norm(x, w["attn_norm"], spec.norm_eps)
    x = keep(x + strategy.attention(w, h, segment_ids, positions, spec, mesh))
    mlp, x = order.tie({k: v for k, v in w.items() if k not in ATTENTION_WEIGHTS}, x)
    w = dict(w, **mlp)
    h = rms_norm(x, w["mlp_norm"], spec.norm_eps)
    return x + strategy.mlp(w, h, spec, mesh)


def run_layers(plan: Plan, stacked, x, segment_ids, positions, spec: BlockSpec, mesh: Mesh,
               default_remat: str = "none", scan: bool = True, active=None):
    """Apply the plan's runs to the stacked layer weights in order.

    active: optional [n_layers] booleans; a layer whose flag is False is the identity (the
    padding slots of a pipeline stage with fewer layers than the others)."""
    order, start = Ordering.for_mesh(mesh), 0
    for run in plan.runs:
        strategy = get_strategy(run.strategy)
        weights = jax.tree.map(lambda p: p[start:start + run.n_layers], stacked)
        weights, x = order.tie(weights, x)  # this run's weight collectives after the previous run's
        weights = strategy.run_weights(weights, mesh)
        x, seg, pos = strategy.enter(x, segment_ids, positions, mesh)
        layer = checkpointed(partial(layer_forward, strategy, spec, mesh), run.remat or default_remat)
        body = _masked(layer) if active is not None else (lambda w, on, x, *tokens: layer(w, x, *tokens))
        flags = None if active is None else active[start:start + run.n_layers]  # None: no masking traced
        if scan:
            x, _ = jax.lax.scan(lambda carry, item: (body(*item, carry, seg, pos), None), x, (weights, flags))
        else:
            for i in range(run.n_layers):
                x = body(jax.tree.map(lambda p: p[i], weights), None if flags is None else flags[i], x, seg, pos)
        start += run.n_layers
    return x


def _masked(body):
    """`body(w, x, ...)` as `f(w, on, x, ...)`: x itself where `on` is False."""
    return lambda w, on, x, *tokens: jnp.where(on, body(w, x, *tokens), x)


def final_hidden(plan: Plan, stacked, final_norm, x, segment_ids, positions, spec: BlockSpec, mesh: Mesh,
                 default_remat: str = "none", scan: bool = True):
    """The plan's layers, then the final RMSNorm: hidden states [B, S, D] in the last strategy's
    boundary layout."""
    x = run_layers(plan, stacked, x, segment_ids, positions, spec, mesh, default_remat, scan)
    final_norm, x = Ordering.for_mesh(mesh).tie(final_norm, x)  # its gradient's all-reduce before the layers' backward
    return rms_norm(x, final_norm, spec.norm_eps)


def head_loss(plan: Plan, x, head, targets, loss_mask, mesh: Mesh, chunk: int = 0):
    """(sum of token NLLs, loss tokens) of final hidden states and the [D, V] head, computed by
    the plan's last strategy `chunk` tokens at a time (<= 0: one chunk)."""
    head, x = Ordering.for_mesh(mesh).tie(head, x)  # the head's collectives after the layers'
    return get_strategy(plan.runs[-1].strategy).loss_sums(x, head, targets, loss_mask, mesh, chunk)
