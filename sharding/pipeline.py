"""Pipeline parallelism: the layer stack split into stages along the mesh's `stage` axis.

Layers go to stages by a partition (layers per stage; uneven allowed: the stacked weights are
regrouped into [stages, max layers per stage, ...], a stage reading only its own layers). A
batch is split into m micro-batches (rows j, j+m, ...) that flow from stage to stage with
`ppermute`, inside one `shard_map` that is manual over the `stage` axis only. The embedding
runs before the pipeline in the plan's layout; the final norm, the head and the loss run per
micro-batch on the last stage (by the plan's last strategy, `sharding.stack.head_loss`). All
stages run the same program in lockstep ticks (idle slots compute and are masked).

Inside a stage the layers run exactly as without a pipeline (`sharding.stack.run_layers`):
each stage runs the slice of the plan's runs that covers its layers (a run crossing a stage
boundary is cut there), each run under its own remat policy, its strategy splitting the work
over the other mesh axes with its own `shard_map`s, gathers and rings (those axes are left to
the strategy and GSPMD, so gradient reductions over them are theirs too). The pipeline knows no
strategy: its checks are the strategies' own, on a micro-batch.

All stages run one program, so every stage's slice must be the same sequence of (strategy,
remat) runs (their lengths may differ: each run is as long as its longest slice, and a shorter
slice's extra slots are the identity, as are those of an uneven partition). A plan cut
otherwise is refused with a PipelineError: align its runs with the partition (e.g.
`tp_sp:1,metp:1,tp_sp:1,metp:1` over two stages of two layers). Letting stages run different
programs by `lax.switch` on the stage index was tried: a branch holding a ring's
`collective-permute` (e.g. `metp` on one stage, `tp_sp` on the other) aborts XLA:CPU.

Schedules, with p stages (the head and loss are computed on every stage and kept on the last;
the last stage is the slowest of each tick anyway):
- `gpipe`: m + p - 1 forward ticks; the backward is autodiff through them (`ppermute`
  transposes to the reverse shift). A stage keeps the residuals of m + p - 1 ticks (with the
  plan's remat policies applied per layer).
- `1f1b`: m + 2p - 2 ticks, each one forward of a newer micro-batch and one backward of an
  older one, in a `custom_vjp` whose forward returns loss and gradients. Each forward stashes
  its stage's input; the backward runs the stage again from it (its layers under the plan's
  remat policies) and differentiates. Stage s holds 2(p - s) - 1 micro-batches in flight (a
  buffer of 2p - 1 whatever m), against m + p - 1 ticks for `gpipe`, so it needs less memory
  for m > p. Its losses and gradients equal `gpipe`'s.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from sharding import layout as L
from sharding.mesh import STAGE_AXIS
from sharding.ops.blocks import BlockSpec, rms_norm
from sharding.ops.ordering import Ordering
from sharding.plan import Plan, Run, compress
from sharding.stack import head_loss, run_layers
from sharding.strategies import StrategyShapeError, get_strategy
from sharding.strategies.description import LayerShape

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

    def ticks(self) -> int:
        """Lockstep ticks of one step: m + p - 1 forward (and as many backward) for `gpipe`,
        m + 2p - 2 forward + backward for `1f1b` (see the module doc)."""
        m, p = self.microbatches, self.stages
        return m + p - 1 if self.schedule == "gpipe" else m + 2 * p - 2

    def residual_sets(self) -> int:
        """Micro-batches whose stage residuals (under the plan's remat) are alive at a stage's
        peak: every forward tick's for `gpipe`, one (the stage run again in its backward) for
        `1f1b`, whose stash holds stage inputs only."""
        return self.microbatches + self.stages - 1 if self.schedule == "gpipe" else 1

    def batch_multiple(self, n_devices: int) -> int:
        """Batch sizes that are multiples of this split into micro-batches on every stage."""
        return self.microbatches * (n_devices // self.stages)

    def stage_plans(self, plan: Plan) -> tuple[Plan, ...]:
        """Each stage's slice of the plan's runs (a run crossing a stage boundary is cut there)."""
        layers = [(r.strategy, r.remat) for r in plan.runs for _ in range(r.n_layers)]
        starts = np.cumsum((0,) + self.layers_per_stage(plan.n_layers))
        return tuple(compress(*zip(*layers[a:b])) for a, b in zip(starts[:-1], starts[1:]))

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
        kinds = [[(r.strategy, r.remat) for r in sub.runs] for sub in self.stage_plans(plan)]
        if any(k != kinds[0] for k in kinds):
            raise PipelineError(f"every pipeline stage must run the same sequence of (strategy, remat) runs, but plan "
                                f"{plan.id!r} cut by partition {list(part)} gives {kinds}: align the plan's runs "
                                "with parallel.pipeline.partition")
        shape = LayerShape.of_mesh(spec, mesh, batch, seq_len)
        split = math.lcm(*(get_strategy(name).boundary.split(L.BATCH, shape) for name in plan.strategies()))
        if batch % (self.microbatches * split):
            raise PipelineError(f"parallel.pipeline.microbatches ({self.microbatches}) x the in-stage batch split "
                                f"({split}) must divide the batch size ({batch}): change "
                                "parallel.pipeline.microbatches or data.tokens_per_batch")
        for name in plan.strategies():
            try:
                get_strategy(name).check(spec, mesh, batch // self.microbatches, seq_len)
            except StrategyShapeError as e:
                raise PipelineError(f"in a pipeline stage (micro-batches of {batch // self.microbatches} rows): "
                                    f"{e}") from None


def micro_batches(x, m: int):
    """[B, ...] -> [m, B/m, ...]; micro-batch j = rows j, j+m, ... (each keeps the row sharding)."""
    return jnp.swapaxes(x.reshape(x.shape[0] // m, m, *x.shape[1:]), 0, 1)


# -- inside the stage shard_map ------------------------------------------------------------


def _at(xs, i):
    return jax.lax.dynamic_index_in_dim(xs, i, 0, keepdims=False)


def _put(xs, x, i):
    return jax.lax.dynamic_update_index_in_dim(xs, x, i, 0)


def _shift(x, p: int, step: int):
    """Send x to the next (step=1) or previous (step=-1) stage; the end stage receives zeros."""
    pairs = [(j, j + step) for j in range(p) if 0 <= j + step < p]
    return jax.lax.ppermute(x, STAGE_AXIS, perm=pairs)


# -- the stage computation -----------------------------------------------------------------


class _Stages:
    """One stage's layers, the same program on every stage: the runs' common (strategy, remat)
    sequence, each run as wide as its longest stage slice (shorter slices' extra slots are the
    identity)."""

    def __init__(self, pipe: Pipeline, plan: Plan, spec: BlockSpec, mesh: Mesh):
        slices = pipe.stage_plans(plan)
        widths = [max(sub.runs[r].n_layers for sub in slices) for r in range(len(slices[0].runs))]
        self.template = Plan(tuple(Run(run.strategy, n, run.remat) for run, n in zip(slices[0].runs, widths)))
        # each stage's slot -> its layer (padding repeats the run's last one) and whether it is one
        self.index, self.active, first = [], [], 0
        for sub in slices:
            index, active, start = [], [], first
            for run, width in zip(sub.runs, widths):
                index += [start + min(j, run.n_layers - 1) for j in range(width)]
                active += [j < run.n_layers for j in range(width)]
                start += run.n_layers
            self.index.append(index)
            self.active.append(active)
            first = start
        self.masked = not all(all(a) for a in self.active)
        self.spec, self.mesh = spec, mesh

    def weights(self, stacked):
        """[n_layers, ...] stacked weights -> [stages, slots, ...]."""
        index = np.array(self.index)
        return jax.tree.map(lambda w: w[index], stacked)

    def __call__(self, s, w, x, segment_ids, positions):
        """Stage s's output for input x, with w the stage's [slots, ...] weights."""
        active = jnp.asarray(np.array(self.active))[s] if self.masked else None
        return run_layers(self.template, w, x, segment_ids, positions, self.spec, self.mesh, active=active)


class _Schedule:
    """The stage-manual pipeline programs of one (pipeline, plan, shape) on a mesh."""

    def __init__(self, pipe: Pipeline, plan: Plan, spec: BlockSpec, mesh: Mesh, loss_chunk: int = 0):
        self.p, self.m, self.mesh, self.spec, self.plan = pipe.stages, pipe.microbatches, mesh, spec, plan
        self.loss_chunk = loss_chunk
        self.stage = _Stages(pipe, plan, spec, mesh)
        self.order = Ordering.for_mesh(mesh)  # the final norm's collectives after the stage's (XLA:CPU)
        self.weight_spec = P(STAGE_AXIS)
        self.in_specs = (self.weight_spec, P(), P(), P(), P(), P(), P(), P())

    def _local(self, w, final_norm, head):
        """Local stage weights (leading stage dim dropped), final norm, head and the stage index."""
        return jax.tree.map(lambda a: a[0], w), final_norm, head, jax.lax.axis_index(STAGE_AXIS)

    def _loss(self, y, final_norm, head, targets, loss_mask):
        """(sum of token NLLs, loss tokens) of one micro-batch's last-layer output."""
        final_norm, y = self.order.tie(final_norm, y)
        h = rms_norm(y, final_norm, self.spec.norm_eps)
        return head_loss(self.plan, h, head, targets, loss_mask, self.mesh, self.loss_chunk)

    def gpipe(self, w, final_norm, head, xs, segs, poss, targets, masks):
        """Forward ticks with the loss on the last stage; differentiated by autodiff."""
        p, m = self.p, self.m
        w, final_norm, head, s = self._local(w, final_norm, head)
        loss = jax.checkpoint(self._loss)

        def tick(carry, t):
            recv, loss_sum, count = carry
            i = jnp.clip(t - s, 0, m - 1)
            take = (s == p - 1) & (t - s >= 0) & (t - s < m)
            x_in = jnp.where(s == 0, _at(xs, i), recv)
            y = self.stage(s, w, x_in, _at(segs, i), _at(poss, i))
            ls, cnt = loss(y, final_norm, head, _at(targets, i), _at(masks, i))
            return (_shift(y, p, 1), loss_sum + jnp.where(take, ls, 0.0), count + jnp.where(take, cnt, 0.0)), None

        zero = jnp.zeros((), jnp.float32)
        init = (jnp.zeros(xs.shape[1:], xs.dtype), zero, zero)
        (_, loss_sum, count), _ = jax.lax.scan(tick, init, jnp.arange(m + p - 1))
        return jax.lax.psum(loss_sum, STAGE_AXIS), jax.lax.psum(count, STAGE_AXIS)

    def one_f_one_b(self, w, final_norm, head, xs, segs, poss, targets, masks):
        """Loss, count and the gradients of (w, final_norm, head, xs) by the 1F1B schedule."""
        p, m, k = self.p, self.m, 2 * self.p - 1
        w, final_norm, head, s = self._local(w, final_norm, head)
        last = s == p - 1

        def tick(carry, t):
            recv_f, recv_b, stash, grads, dxs, loss_sum, count = carry
            # forward slot: micro-batch t - s; its stage input is stashed for its backward
            i_f = jnp.clip(t - s, 0, m - 1)
            ok_f = (t - s >= 0) & (t - s < m)
            x_in = jnp.where(s == 0, _at(xs, i_f), recv_f)
            y = self.stage(s, w, x_in, _at(segs, i_f), _at(poss, i_f))
            slot = i_f % k
            stash = _put(stash, jnp.where(ok_f, x_in, _at(stash, slot)), slot)
            # backward slot: micro-batch t - 2(p - 1) + s. On the last stage it is the one just
            # forwarded, and the loss's cotangent starts it; elsewhere the next stage's does.
            j = t - 2 * (p - 1) + s
            i_b, ok_b = jnp.clip(j, 0, m - 1), (j >= 0) & (j < m)
            (ls, cnt), head_vjp = jax.vjp(
                lambda y, final_norm, head: self._loss(y, final_norm, head, _at(targets, i_b), _at(masks, i_b)),
                y, final_norm, head)
            g_ls = jnp.where(ok_b & last, 1.0, 0.0).astype(ls.dtype)
            g_head_y, g_norm, g_head = head_vjp((g_ls, jnp.zeros_like(cnt)))
            g_y = jnp.where(ok_b, jnp.where(last, g_head_y, recv_b), jnp.zeros_like(recv_b))
            seg_b, pos_b = _at(segs, i_b), _at(poss, i_b)
            _, stage_vjp = jax.vjp(lambda w, x: self.stage(s, w, x, seg_b, pos_b), w, _at(stash, i_b % k))
            g_w, g_x = stage_vjp(g_y)
            grads = jax.tree.map(jnp.add, grads, (g_w, g_norm, g_head))
            dxs = _put(dxs, jnp.where(ok_b & (s == 0), g_x, _at(dxs, i_b)), i_b)
            take = ok_b & last
            carry = (_shift(y, p, 1), _shift(g_x, p, -1), stash, grads, dxs,
                     loss_sum + jnp.where(take, ls, 0.0), count + jnp.where(take, cnt, 0.0))
            return carry, None

        x0, zero = jnp.zeros(xs.shape[1:], xs.dtype), jnp.zeros((), jnp.float32)
        init = (x0, x0, jnp.zeros((k, *xs.shape[1:]), xs.dtype), jax.tree.map(jnp.zeros_like, (w, final_norm, head)),
                jnp.zeros(xs.shape, xs.dtype), zero, zero)
        (_, _, _, grads, dxs, loss_sum, count), _ = jax.lax.scan(tick, init, jnp.arange(m + 2 * p - 2))
        # each stage holds its own layers' gradients; those of what every stage shares are summed
        g_w, g_norm, g_head = grads
        g_w = jax.tree.map(lambda g: g[None], g_w)
        shared = jax.lax.psum((loss_sum, count, g_norm, g_head, dxs), STAGE_AXIS)
        return (*shared[:2], g_w, *shared[2:])

    def shard_map(self, f, out_specs):
        """`f` in a shard_map manual over the stage axis only (the strategies own the others).

        Unchecked (check_vma=False): under autodiff, JAX 0.10 gives a nested shard_map's
        residuals the outer manual axes its values vary over (`nospec`), which Shardy refuses
        ('operates on axis "stage" which is already bound'). The strategies' own shard_maps
        stay checked; the reductions over stages here are explicit, and the transpose sums
        the cotangents of inputs shared by all stages."""
        return jax.shard_map(f, mesh=self.mesh, in_specs=self.in_specs, out_specs=out_specs,
                             axis_names=frozenset({STAGE_AXIS}), check_vma=False)


def pipeline_loss(pipe: Pipeline, plan: Plan, spec: BlockSpec, mesh: Mesh, layers, final_norm, head, x,
                  segment_ids, positions, targets, loss_mask, default_remat: str = "none", loss_chunk: int = 0):
    """(sum of token NLLs, loss tokens) of the layer stack as a pipeline, from embeddings x [B, S, D]."""
    pipe.check(plan, spec, mesh, x.shape[0], x.shape[1])
    sched = _Schedule(pipe, plan.with_default_remat(default_remat), spec, mesh, loss_chunk)
    m = pipe.microbatches
    args = (sched.stage.weights(dict(layers)), final_norm, head,
            *(micro_batches(a, m) for a in (x, segment_ids, positions, targets, loss_mask)))
    gpipe = sched.shard_map(sched.gpipe, (P(), P()))
    if pipe.schedule == "gpipe":
        return gpipe(*args)
    one_f_one_b = sched.shard_map(sched.one_f_one_b, (P(), P(), sched.weight_spec, P(), P(), P()))

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
