"""Pipeline parallelism: the layer stack split into stages along the mesh's `stage` axis.

Layers go to stages by a partition (layers per stage; uneven allowed: the stacked weights are
regrouped into [stages, max layers per stage, ...] and padded slots act as the identity). A
batch is split into m micro-batches (rows j, j+m, ...) that flow from stage to stage with
`ppermute`, inside one `shard_map` over the whole mesh. The embedding runs before the pipeline
in the plan's layout; the final norm, the head and the loss run per micro-batch on the last
stage. All stages run the same program in lockstep ticks (idle slots compute and are masked).

Schedules, with p stages (the head and loss are computed on every stage and kept on the last;
the last stage is the slowest of each tick anyway):
- `gpipe`: m + p - 1 forward ticks; the backward is autodiff through them (`ppermute`
  transposes to the reverse shift). A stage keeps the residuals of m + p - 1 ticks (with the
  plan's remat policy applied per layer).
- `1f1b`: m + 2p - 2 ticks, each one forward of a newer micro-batch and one backward of an
  older one, in a `custom_vjp` whose forward returns loss and gradients. Each forward stashes
  its layers' inputs; the backward recomputes one layer at a time from them (as remat `full`,
  whatever the plan says). Stage s holds 2(p - s) - 1 micro-batches in flight (a buffer of
  2p - 1 whatever m), against m + p - 1 ticks for `gpipe`, so it needs less memory for m > p.
  Its losses and gradients equal `gpipe`'s.

Inside a stage the plan's one strategy splits the work over the other mesh axes: `dp` (stage
weights gathered once per step), `fsdp` (each layer gathered in turn, gradients
reduce-scattered) or `tp_sp` (Megatron TP + SP over the model axes, batch over the batch axes).
Other strategies, or a plan mixing strategies or remat policies, raise PipelineError.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from sharding import layout as L
from sharding.layout import StorageLayout
from sharding.mesh import STAGE_AXIS, mesh_roles
from sharding.ops import blocks
from sharding.ops.blocks import BlockSpec, rms_norm
from sharding.ops.chunked_loss import chunked_nll_sums
from sharding.ops.varying import vary, varying_axes
from sharding.plan import Plan
from sharding.remat import checkpointed
from sharding.stack import layer_forward, layer_weight_shapes
from sharding.strategies.base import axes_entry

STRATEGIES = ("dp", "fsdp", "tp_sp")
SCHEDULES = ("gpipe", "1f1b")


class PipelineError(ValueError):
    """The pipeline cannot serve this plan, mesh or shape (raised before compiling)."""


@dataclass(frozen=True)
class Pipeline:
    """`stages` stages of `partition` layers each (empty: as even as possible), `microbatches`
    micro-batches per batch, run by `schedule`."""

    stages: int
    microbatches: int
    schedule: str = "gpipe"
    partition: tuple[int, ...] = ()

    def layers_per_stage(self, n_layers: int) -> tuple[int, ...]:
        """The partition, or n_layers split as evenly as possible (earlier stages one more)."""
        if self.partition:
            return tuple(self.partition)
        q, r = divmod(n_layers, self.stages)
        return tuple(q + (i < r) for i in range(self.stages))

    def batch_multiple(self, n_devices: int) -> int:
        """Batch sizes that are multiples of this split into micro-batches on every stage."""
        return self.microbatches * (n_devices // self.stages)

    def check(self, plan: Plan, spec: BlockSpec, mesh: Mesh, batch: int, seq_len: int) -> None:
        """Raise PipelineError naming the field and the fix if this pipeline cannot run."""
        if mesh.shape.get(STAGE_AXIS) != self.stages:
            raise PipelineError(f"pipeline of {self.stages} stages needs a mesh axis 'stage' of that size, "
                                f"got mesh {dict(mesh.shape)}")
        if self.schedule not in SCHEDULES:
            raise PipelineError(f"parallel.pipeline.schedule must be one of {', '.join(SCHEDULES)}, "
                                f"got {self.schedule!r}")
        part = self.layers_per_stage(plan.n_layers)
        if len(part) != self.stages or sum(part) != plan.n_layers or min(part) < 1:
            raise PipelineError(f"parallel.pipeline.partition {list(part)} must give {self.stages} positive "
                                f"layer counts summing to model.n_layers ({plan.n_layers})")
        kinds = {(r.strategy, r.remat) for r in plan.runs}
        if len(kinds) > 1 or plan.runs[0].strategy not in STRATEGIES:
            raise PipelineError(f"a pipelined plan runs one strategy ({', '.join(STRATEGIES)}) with one remat "
                                f"policy in every stage, got plan {plan.id!r}")
        stage = _StageLayout(plan.runs[0].strategy, mesh)
        if batch % (self.microbatches * stage.batch_size):
            raise PipelineError(f"parallel.pipeline.microbatches ({self.microbatches}) x the in-stage batch split "
                                f"({stage.batch_size}) must divide the batch size ({batch}): change "
                                "parallel.pipeline.microbatches or data.tokens_per_batch")
        p = stage.model_size
        for what, value in (("model.n_heads", spec.n_heads), ("model.n_kv_heads", spec.kv_heads),
                            ("model.d_ff", spec.d_ff), ("sequence length", seq_len)):
            if value % p:
                raise PipelineError(f"pipeline stages running tp_sp need {what} ({value}) divisible by the "
                                    f"model-parallel size ({p})")


class _StageLayout:
    """How one stage's strategy splits work over the mesh axes other than `stage`."""

    def __init__(self, strategy: str, mesh: Mesh):
        self.strategy, self.mesh = strategy, mesh
        batch, model = mesh_roles(mesh)
        if strategy == "tp_sp":
            self.batch_axes, self.model_axes = batch, model
        else:
            self.batch_axes, self.model_axes = tuple(a for a in mesh.axis_names if a != STAGE_AXIS), ()
        self.batch_size = math.prod(mesh.shape[a] for a in self.batch_axes)
        self.model_size = math.prod(mesh.shape[a] for a in self.model_axes)

    def micro_spec(self, seq_split: bool, trailing: int) -> P:
        """Layout of [m, b, s, ...] micro-batch arrays (the sequence split over the model axes)."""
        seq = axes_entry(self.model_axes) if seq_split else None
        return P(None, axes_entry(self.batch_axes), seq, *([None] * trailing))

    def layer_specs(self, spec: BlockSpec) -> dict[str, tuple]:
        """Per-layer weight PartitionSpec entries inside a stage (without the layers axis)."""
        if self.strategy == "tp_sp":
            layout = StorageLayout(self.mesh, self.model_axes, (L.HEADS, L.KV_HEADS, L.MLP))
        elif self.strategy == "fsdp" and self.batch_axes:
            layout = StorageLayout(self.mesh, self.batch_axes)
        else:
            layout = None
        out = {}
        for name, (shape, logical) in layer_weight_shapes(spec).items():
            parts = tuple(layout.spec(logical, shape)) if layout is not None else ()
            out[name] = parts + (None,) * (len(shape) - len(parts))
        return out


class _LocalSublayers:
    """Per-device attention and MLP of one stage (for `layer_forward`, inside the shard_map)."""

    def __init__(self, stage: _StageLayout, layer_specs: dict[str, tuple]):
        self.stage = stage
        self.gather = {name: next((i for i, e in enumerate(parts) if e is not None), None)
                       for name, parts in layer_specs.items()} if stage.strategy == "fsdp" else {}

    def _weights(self, w, names):
        """A sub-layer's weights, gathered over the stage's batch axes under fsdp."""
        return {n: self._gathered(w[n], self.gather.get(n)) for n in names}

    def _gathered(self, a, dim):
        return a if dim is None else jax.lax.all_gather(a, self.stage.batch_axes, axis=dim, tiled=True)

    def _sublayer(self, body, x):
        axes = self.stage.model_axes
        if not axes:
            return body(x)
        full = jax.lax.all_gather(x, axes, axis=1, tiled=True)
        return jax.lax.psum_scatter(body(full), axes, scatter_dimension=1, tiled=True)

    def attention(self, w, x, segment_ids, positions, spec, mesh):
        w = self._weights(w, blocks.ATTENTION_MATRICES)
        return self._sublayer(lambda h: blocks.attention_block(w, h, segment_ids, positions, spec), x)

    def mlp(self, w, x, spec, mesh):
        w = self._weights(w, ("w_in", "w_out"))
        return self._sublayer(lambda h: blocks.mlp_block(w["w_in"], w["w_out"], h, spec), x)


def stage_weights(stacked, layers_per_stage):
    """[n_layers, ...] stacked weights -> [stages, max layers per stage, ...] (padded slots repeat
    a layer of their stage and are masked out)."""
    p, most = len(layers_per_stage), max(layers_per_stage)
    if min(layers_per_stage) == most:
        return jax.tree.map(lambda w: w.reshape(p, most, *w.shape[1:]), stacked)
    starts = np.cumsum((0,) + tuple(layers_per_stage))[:-1]
    index = np.array([[s0 + min(j, n - 1) for j in range(most)] for s0, n in zip(starts, layers_per_stage)])
    return jax.tree.map(lambda w: w[index], stacked)


def micro_batches(x, m: int):
    """[B, ...] -> [m, B/m, ...]; micro-batch j = rows j, j+m, ... (each keeps the row sharding)."""
    return jnp.swapaxes(x.reshape(x.shape[0] // m, m, *x.shape[1:]), 0, 1)


# -- varying-ness inside the shard_map -------------------------------------------------------


def _missing(x, axes):
    have = varying_axes(x)
    return tuple(a for a in axes if a not in have)


def _psum(x, axes):
    return jax.lax.psum(x, axes) if axes else x


def _zeros_like(x):
    return vary(jnp.zeros(x.shape, x.dtype), varying_axes(x))


def _at(xs, i):
    return jax.lax.dynamic_index_in_dim(xs, i, 0, keepdims=False)


def _put(xs, x, i):
    return jax.lax.dynamic_update_index_in_dim(xs, x, i, 0)


def _shift(x, p: int, step: int):
    """Send x to the next (step=1) or previous (step=-1) stage; the end stage receives zeros."""
    pairs = [(j, j + step) for j in range(p) if 0 <= j + step < p]
    return jax.lax.ppermute(x, STAGE_AXIS, perm=pairs)


# -- the stage computation -------------------------------------------------------------------


def _layer_fn(sublayers, spec: BlockSpec, remat: str, masked: bool):
    """One layer slot of a stage: (w_j, j, n_active, x, seg, pos) -> x'; slots at or past
    `n_active` (padding of an uneven partition) are the identity."""
    body = checkpointed(partial(layer_forward, sublayers, spec, None, ordered=False), remat)

    def layer(wj, j, n_active, x, segment_ids, positions):
        y = body(wj, x, segment_ids, positions)
        return jnp.where(j < n_active, y, x) if masked else y
    return layer


def _stage_forward(layer, w, n_active, x, segment_ids, positions):
    """This stage's layers over one micro-batch: (output, the input of every layer)."""
    def step(x, item):
        wj, j = item
        return layer(wj, j, n_active, x, segment_ids, positions), x
    return jax.lax.scan(step, x, (w, jnp.arange(jax.tree.leaves(w)[0].shape[0])))


def _stage_backward(layer, w, n_active, inputs, segment_ids, positions, g):
    """(weight gradients, input cotangent) of the stage from its output cotangent g, one layer
    at a time in reverse, each recomputed from its stashed input."""
    def step(g, item):
        wj, j, xj = item
        _, vjp = jax.vjp(lambda wj, xj: layer(wj, j, n_active, xj, segment_ids, positions), wj, xj)
        g_w, g_x = vjp(g)
        return g_x, g_w
    g_x, g_w = jax.lax.scan(step, g, (w, jnp.arange(inputs.shape[0]), inputs), reverse=True)
    return g_w, g_x


def _head_loss(eps, chunk, y, final_norm, head, targets, loss_mask):
    """(sum of token NLLs, loss tokens) of one micro-batch's final hidden states, `chunk` tokens
    at a time."""
    return chunked_nll_sums(rms_norm(y, final_norm, eps), head, targets, loss_mask, chunk)


class _Schedule:
    """The per-device pipeline programs of one (pipeline, plan, shape) on a mesh."""

    def __init__(self, pipe: Pipeline, plan: Plan, spec: BlockSpec, mesh: Mesh, remat: str, loss_chunk: int = 0):
        self.p, self.m, self.mesh, self.spec = pipe.stages, pipe.microbatches, mesh, spec
        self.loss_chunk = loss_chunk
        self.parts = pipe.layers_per_stage(plan.n_layers)
        self.axes = tuple(mesh.axis_names)
        self.stage = _StageLayout(plan.runs[0].strategy, mesh)
        layer_specs = self.stage.layer_specs(spec)
        sublayers, masked = _LocalSublayers(self.stage, layer_specs), len(set(self.parts)) > 1
        self.layer = _layer_fn(sublayers, spec, plan.runs[0].remat or remat, masked)
        self.bare_layer = _layer_fn(sublayers, spec, "none", masked)  # 1f1b recomputes layers itself
        self.weight_specs = {n: P(STAGE_AXIS, None, *parts) for n, parts in layer_specs.items()}
        seq_split = bool(self.stage.model_axes)
        self.x_spec = self.stage.micro_spec(seq_split, 1)
        tokens, loss_tokens = self.stage.micro_spec(False, 0), self.stage.micro_spec(seq_split, 0)
        self.in_specs = (self.weight_specs, P(), P(), self.x_spec, tokens, tokens, loss_tokens, loss_tokens)

    def _local(self, w, final_norm, head):
        """Local stage weights (leading stage dim dropped) and the stage's layer count; params
        varying over every axis, so each tick's gradients stay partial until one final psum."""
        s = jax.lax.axis_index(STAGE_AXIS)
        w = jax.tree.map(lambda a: vary(a[0], self.axes), w)
        return w, vary(final_norm, self.axes), vary(head, self.axes), s, jnp.asarray(self.parts)[s]

    def gpipe(self, w, final_norm, head, xs, segs, poss, targets, masks):
        """Forward ticks with the loss on the last stage; differentiated by autodiff."""
        p, m = self.p, self.m
        w, final_norm, head, s, n_active = self._local(w, final_norm, head)
        loss = jax.checkpoint(partial(_head_loss, self.spec.norm_eps, self.loss_chunk))

        def tick(carry, t):
            recv, loss_sum, count = carry
            i = jnp.clip(t - s, 0, m - 1)
            take = (s == p - 1) & (t - s >= 0) & (t - s < m)
            x_in = jnp.where(s == 0, _at(xs, i), recv)
            y, _ = _stage_forward(self.layer, w, n_active, x_in, _at(segs, i), _at(poss, i))
            ls, cnt = loss(y, final_norm, head, _at(targets, i), _at(masks, i))
            return (_shift(y, p, 1), loss_sum + jnp.where(take, ls, 0.0), count + jnp.where(take, cnt, 0.0)), None

        zero = vary(jnp.zeros((), jnp.float32), self.axes)
        init = (vary(jnp.zeros(xs.shape[1:], xs.dtype), self.axes), zero, zero)
        (_, loss_sum, count), _ = jax.lax.scan(tick, init, jnp.arange(m + p - 1))
        return jax.lax.psum(loss_sum, self.axes), jax.lax.psum(count, self.axes)

    def one_f_one_b(self, w, final_norm, head, xs, segs, poss, targets, masks):
        """Loss, count and the gradients of (w, final_norm, head, xs) by the 1F1B schedule."""
        p, m, k = self.p, self.m, 2 * self.p - 1
        params = (w, final_norm, head)
        w, final_norm, head, s, n_active = self._local(w, final_norm, head)
        last = s == p - 1
        n_slots = jax.tree.leaves(w)[0].shape[0]

        def tick(carry, t):
            recv_f, recv_b, stash, grads, dxs, loss_sum, count = carry
            # forward slot: micro-batch t - s; every layer's input is stashed for its backward
            i_f = jnp.clip(t - s, 0, m - 1)
            ok_f = (t - s >= 0) & (t - s < m)
            x_in = jnp.where(s == 0, _at(xs, i_f), recv_f)
            y, inputs = _stage_forward(self.bare_layer, w, n_active, x_in, _at(segs, i_f), _at(poss, i_f))
            slot = i_f % k
            stash = _put(stash, jnp.where(ok_f, inputs, _at(stash, slot)), slot)
            # backward slot: micro-batch t - 2(p - 1) + s. On the last stage it is the one just
            # forwarded, and the loss's cotangent starts it; elsewhere the next stage's does.
            j = t - 2 * (p - 1) + s
            i_b, ok_b = jnp.clip(j, 0, m - 1), (j >= 0) & (j < m)
            (ls, cnt), head_vjp = jax.vjp(
                lambda y, final_norm, head: _head_loss(self.spec.norm_eps, self.loss_chunk, y, final_norm, head,
                                                       _at(targets, i_b), _at(masks, i_b)), y, final_norm, head)
            g_ls = jnp.where(ok_b & last, 1.0, 0.0) + _zeros_like(ls)
            g_head_y, g_norm, g_head = head_vjp((g_ls, _zeros_like(cnt)))
            g_y = jnp.where(ok_b, jnp.where(last, g_head_y, recv_b), jnp.zeros_like(recv_b))
            g_w, g_x = _stage_backward(self.bare_layer, w, n_active, _at(stash, i_b % k), _at(segs, i_b),
                                       _at(poss, i_b), g_y)
            grads = jax.tree.map(jnp.add, grads, (g_w, g_norm, g_head))
            dxs = _put(dxs, jnp.where(ok_b & (s == 0), g_x, _at(dxs, i_b)), i_b)
            take = ok_b & last
            carry = (_shift(y, p, 1), _shift(g_x, p, -1), stash, grads, dxs,
                     loss_sum + jnp.where(take, ls, 0.0), count + jnp.where(take, cnt, 0.0))
            return carry, None

        x0 = vary(jnp.zeros(xs.shape[1:], xs.dtype), self.axes)
        zero = vary(jnp.zeros((), jnp.float32), self.axes)
        init = (x0, x0, vary(jnp.zeros((k, n_slots, *xs.shape[1:]), xs.dtype), self.axes),
                jax.tree.map(_zeros_like, (w, final_norm, head)),
                vary(jnp.zeros(xs.shape, xs.dtype), self.axes), zero, zero)
        (_, _, _, grads, dxs, loss_sum, count), _ = jax.lax.scan(tick, init, jnp.arange(m + 2 * p - 2))
        # one reduction per gradient, over the axes its parameter is shared on
        shared = (jax.tree.map(lambda a: a[0], params[0]), params[1], params[2])
        g_w, g_norm, g_head = jax.tree.map(lambda g, a: _psum(g, _missing(a, self.axes)), grads, shared)
        g_w = jax.tree.map(lambda g: g[None], g_w)
        g_x = _psum(dxs, _missing(xs, self.axes))
        return jax.lax.psum(loss_sum, self.axes), jax.lax.psum(count, self.axes), g_w, g_norm, g_head, g_x


def pipeline_loss(pipe: Pipeline, plan: Plan, spec: BlockSpec, mesh: Mesh, layers, final_norm, head, x,
                  segment_ids, positions, targets, loss_mask, default_remat: str = "none", loss_chunk: int = 0):
    """(sum of token NLLs, loss tokens) of the layer stack as a pipeline, from embeddings x [B, S, D]."""
    pipe.check(plan, spec, mesh, x.shape[0], x.shape[1])
    sched = _Schedule(pipe, plan, spec, mesh, default_remat, loss_chunk)
    m = pipe.microbatches
    args = (stage_weights(dict(layers), sched.parts), final_norm, head,
            *(micro_batches(a, m) for a in (x, segment_ids, positions, targets, loss_mask)))
    gpipe = jax.shard_map(sched.gpipe, mesh=mesh, in_specs=sched.in_specs, out_specs=(P(), P()))
    if pipe.schedule == "gpipe":
        return gpipe(*args)
    one_f_one_b = jax.shard_map(sched.one_f_one_b, mesh=mesh, in_specs=sched.in_specs,
                                out_specs=(P(), P(), sched.weight_specs, P(), P(), sched.x_spec))

    @jax.custom_vjp
    def run(w, final_norm, head, xs, *tokens):
        return gpipe(w, final_norm, head, xs, *tokens)

    def forward(w, final_norm, head, xs, *tokens):
        loss_sum, count, *grads = one_f_one_b(w, final_norm, head, xs, *tokens)
        return (loss_sum, count), tuple(grads)

    def backward(grads, cotangents):
        g = cotangents[0]
        return (*jax.tree.map(lambda a: (a * g).astype(a.dtype), grads), None, None, None, None)

    run.defvjp(forward, backward)
    return run(*args)
