"""`parallel.plan: auto`: plans per bucket from the cost model, ranked for the program cache.

For each bucket (length s, batch b) the cost table of every feasible strategy x remat policy
(`costmodel.table.cost_table`) is searched for the fastest per-layer plan within the memory
budget (`costmodel.search.ranked_plans`, the exact optimum). The program cache then compiles the
candidates in order and keeps the first whose XLA figure fits, so the candidates are: the
optimum, a ladder of optima each needing 5% fewer bytes than the one before (a prediction that
is too low for one is caught by the next), the leanest plan, and last every layer under `full`
remat with the strategy predicted leanest there (the floor, in case the model misjudges which
plan is leanest).

Under a pipeline (`parallel.pipeline`) the search prices one stage, as the pipeline runs it:
the largest stage's layers on the stage's devices (the cost model never counts the `stage` axis),
one pipeline micro-batch's rows, the residuals the schedule keeps alive
(`Pipeline.residual_sets`), the gradients summed over micro-batches, and a step of
`Pipeline.ticks` stage passes; the stage plan it finds is every stage's plan.

The figures are predictions for `parallel.hardware`: the devices here (a GPU by its profile;
on CPU the calibration `costmodel.profile` fitted in `parallel.costmodel_dir`, else the shipped one)
or a named GPU profile, to plan a cluster that is not here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from costmodel.hardware import PROFILES
from costmodel.search import ranked_plans
from costmodel.table import CostTable, cost_table
from dysejax.errors import ConfigError
from sharding.pipeline import Pipeline
from sharding.plan import Plan, Run, compress
from sharding.remat import LEANEST

OPTIMIZER_SLOTS = {"adamw": 2, "adam": 2, "adabelief": 2, "adam3": 2, "sgdm": 1}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


@dataclass(frozen=True)
class BucketPlan:
    """What the search chose for one bucket, with the model's predictions (per device)."""

    seq_len: int
    batch_size: int
    plan: Plan
    predicted_bytes: int
    predicted_step_s: float
    fits: bool
    candidates: tuple[Plan, ...]
    method: str


def check_hardware(name: str) -> str:
    """`parallel.hardware`, lower-cased, if it is `auto` or a known profile; else ConfigError."""
    key = str(name).lower()
    if key != "auto" and key not in PROFILES:
        raise ConfigError(f"parallel.hardware: unknown {name!r}: use auto or one of {', '.join(PROFILES)}")
    return key


def resolve_hardware(name: str, mesh, calibration_dir: Optional[str], log=print):
    """What `cost_table` prices with: a profile name (planning for devices that are not here),
    or a `Calibration` of the devices here: on CPU the one fitted in `calibration_dir`, else the
    shipped one; on an accelerator its profile's rates under its own device kind. A device kind
    with no profile is named and priced with H100 rates, which only measured layer times
    (`parallel.profile_time`) correct."""
    from costmodel.calibration import Calibration, default_calibration, device_kind_of, load_calibration
    from costmodel.time import TimeCoefficients

    key = check_hardware(name)
    if key in PROFILES:
        return key
    mesh_shape = {a: int(n) for a, n in mesh.shape.items()}
    kind = device_kind_of(mesh)
    cal = load_calibration(calibration_dir, kind, mesh_shape) if calibration_dir else None
    if cal is not None:
        return cal
    device = mesh.devices.flat[0]
    if device.platform == "cpu":
        return default_calibration()
    profile = profile_for_kind(device.device_kind)
    if profile is None:
        profile = "h100"
        log(f"cost model: no profile for the device kind {device.device_kind!r}: its time model uses "
            f"{PROFILES[profile].name}'s rates (set parallel.hardware to one of {', '.join(PROFILES)}, or "
            "parallel.profile_time: true to correct them with layer times measured here)")
    coeffs = TimeCoefficients.from_profile(PROFILES[profile], mesh_shape)
    return Calibration(device_kind=kind, mesh_shape=mesh_shape, time=coeffs, meta={"profile": profile})


def profile_for_kind(device_kind: str) -> Optional[str]:
    """The hardware profile whose name matches a device kind (e.g. 'NVIDIA H200' -> h200), or None."""
    kind = device_kind.lower()
    for profile in PROFILES:
        if profile.split("-")[0] in kind:
            return profile
    return None


def layer_rows(batch_size: int, grad_accum: int, pipeline: Optional[Pipeline]) -> int:
    """Rows a layer runs at once: one `train.grad_accum` micro-batch of the batch, and of it one
    pipeline micro-batch if there is a pipeline."""
    return batch_size // grad_accum // (pipeline.microbatches if pipeline else 1)


def calibrate_memory_here(calibration, mesh, spec, shapes, directory: str, log=print, progress=None):
    """`calibration` with memory corrections fitted for this model on the devices here: each
    strategy at the shortest and longest of `shapes` it can serve (`costmodel.profile`, cached in
    `directory`). `progress(what)`, if given, is called after each program measured."""
    from costmodel.profile import calibrate_memory_for, calibration_jobs
    jobs = calibration_jobs(spec, dict(mesh.shape), shapes)
    return _timed(lambda: calibration.with_memory(calibrate_memory_for(
        mesh, spec, jobs, directory, progress=progress and (lambda sample: progress("memory")))),
        f"fitted this model's memory to XLA at {sorted(s for _, s in jobs)}", directory, log)


def calibrate_time_here(planner: "AutoPlanner", mesh, shapes, directory: str, log=print, progress=None
                        ) -> "AutoPlanner":
    """`planner` pricing with this model's layer measured per option on the devices here
    (`costmodel.profile.calibrate_time_for`, cached in `directory`): each option (strategy x
    remat) at the shortest and the longest of the (batch, seq_len) `shapes` where it can appear
    in a plan within the budget, so it is measured at two lengths where it may be chosen (at the
    rows a layer runs at once, `planner.layer_rows`, as the train step runs the layer)."""
    from costmodel.profile import calibrate_time_for
    where: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for batch, seq_len in sorted(set(shapes), key=lambda bs: (bs[1], bs[0])):
        for option in planner.useful_options(seq_len, batch):
            where.setdefault(option, []).append((batch, seq_len))
    jobs: dict[tuple[int, int], list[tuple[str, str]]] = {}
    for option, at in where.items():
        for bs in dict.fromkeys(at[:1] + at[-1:]):
            batch, seq_len = bs
            jobs.setdefault((planner.layer_rows(batch), seq_len), []).append(option)
    n = sum(len(v) for v in jobs.values())
    cal = _timed(lambda: calibrate_time_for(planner.hardware, mesh, planner.spec, jobs, directory,
                                            progress=progress and (lambda sample: progress("time"))),
                 f"timed {n} layer programs (strategy x remat at {sorted(s for _, s in jobs)})", directory, log)
    return planner.with_hardware(cal)


def _timed(fit, what: str, directory: str, log):
    import time
    t0 = time.perf_counter()
    out = fit()
    if time.perf_counter() - t0 > 1.0:  # (a cached fit says nothing)
        log(f"cost model: {what} in {time.perf_counter() - t0:.0f} s (cached in {directory})")
    return out


class AutoPlanner:
    """Ranked plans per bucket for one model, mesh shape, hardware and per-device budget."""

    def __init__(self, spec, mesh_shape: dict, n_layers: int, vocab: int, hardware, budget: Optional[int],
                 param_dtype: str = "float32", optimizer: str = "adamw", default_remat: str = "none",
                 loss_chunk: int = 1024, grad_accum: int = 1, pipeline: Optional[Pipeline] = None):
        self.loss_chunk = loss_chunk  # tokens per chunk of the loss (`model.loss_chunk`)
        self.grad_accum = grad_accum  # a batch runs as this many micro-batches (`train.grad_accum`)
        self.default_remat = default_remat  # runs under the model's default policy are written without one
        self.spec, self.mesh_shape, self.n_layers, self.vocab = spec, dict(mesh_shape), n_layers, vocab
        self.hardware, self.budget = hardware, budget
        self.param_dtype, self.optimizer = param_dtype, optimizer
        self.param_bytes = DTYPE_BYTES[param_dtype]
        self.optimizer_slots = OPTIMIZER_SLOTS.get(optimizer, 2)
        self.pipeline = pipeline
        self.stage_layers = max(pipeline.layers_per_stage(n_layers)) if pipeline else n_layers  # what a table prices
        self._cache: dict[tuple[int, int], BucketPlan] = {}

    def layer_rows(self, batch_size: int) -> int:
        """Rows a layer of this model runs at once (`layer_rows`)."""
        return layer_rows(batch_size, self.grad_accum, self.pipeline)

    def passes(self) -> int:
        """Stage passes (forward + backward of one micro-batch) per step: 1, or a pipeline's ticks."""
        return self.pipeline.ticks() if self.pipeline else 1

    def table(self, seq_len: int, batch_size: int, choices=None) -> CostTable:
        """The cost table of this bucket (every feasible strategy x remat policy by default); under
        a pipeline, of its largest stage for one pipeline micro-batch (times per stage pass)."""
        pipe = self.pipeline  # (the cost model prices a layer on its stage's devices)
        return cost_table(self.spec, self.mesh_shape, batch_size, seq_len, self.stage_layers, self.vocab,
                          param_bytes=self.param_bytes, optimizer_slots=self.optimizer_slots,
                          hardware=self.hardware, choices=choices, loss_chunk=self.loss_chunk,
                          grad_accum=self.grad_accum, microbatches=pipe.microbatches if pipe else 1,
                          in_flight=pipe.residual_sets() if pipe else 1)

    def whole(self, stage_plan: Plan) -> Plan:
        """The model's plan when every pipeline stage runs `stage_plan` (a smaller stage its first
        layers); `stage_plan` itself without a pipeline."""
        if self.pipeline is None:
            return stage_plan
        per_layer = [(r.strategy, r.remat) for r in stage_plan.runs for _ in range(r.n_layers)]
        layers = [c for n in self.pipeline.layers_per_stage(self.n_layers) for c in per_layer[:n]]
        return compress(*zip(*layers))

    def useful_options(self, seq_len: int, batch_size: int, margin: float = 1.1) -> list:
        """The options (strategy x remat) that can appear in a plan within the budget (x margin):
        one layer of the option with every other layer under the leanest option fits. All
        feasible options without a budget."""
        table = self.table(seq_len, batch_size)
        if self.budget is None:
            return [(c.strategy, c.remat) for c in table.choices]
        leanest = int(np.argmin(table.layer_stored_bytes + table.layer_peak_bytes / max(1, self.stage_layers)))
        out = []
        for k, c in enumerate(table.choices):
            rest = [leanest] * (self.stage_layers - 1)
            need = min(table.plan_bytes_backward(rest + [k]), table.plan_bytes_backward([k] + rest))
            if need <= self.budget * margin:
                out.append((c.strategy, c.remat))
        return out

    def with_hardware(self, hardware) -> "AutoPlanner":
        """This planner pricing with other hardware (e.g. a calibration with measured layer times)."""
        return AutoPlanner(self.spec, self.mesh_shape, self.n_layers, self.vocab, hardware, self.budget,
                           self.param_dtype, self.optimizer, self.default_remat, self.loss_chunk, self.grad_accum,
                           self.pipeline)

    def plan(self, seq_len: int, batch_size: int) -> BucketPlan:
        """The chosen plan of a bucket and its fallbacks (cached per shape)."""
        key = (seq_len, batch_size)
        if key not in self._cache:
            self._cache[key] = self._search(seq_len, batch_size)
        return self._cache[key]

    def written(self, plan: Plan) -> Plan:
        """`plan` with runs under the model's default remat policy written without one."""
        return Plan(tuple(Run(r.strategy, r.n_layers, None if r.remat == self.default_remat else r.remat)
                          for r in plan.runs))

    def predict(self, seq_len: int, batch_size: int, plan: Plan) -> tuple[int, float]:
        """(bytes, seconds) the model predicts for any plan of this bucket (under a pipeline: the
        bytes of its largest stage, the seconds of the step)."""
        from costmodel.table import Choice
        if self.pipeline is not None:
            plan = max(self.pipeline.stage_plans(plan), key=lambda p: p.n_layers)
        per_layer = [Choice(r.strategy, r.remat or self.default_remat) for r in plan.runs for _ in range(r.n_layers)]
        choices = tuple(dict.fromkeys(per_layer))
        table = self.table(seq_len, batch_size, choices)
        idx = [choices.index(c) for c in per_layer]
        return table.plan_bytes_backward(idx), table.plan_time(idx) * self.passes()

    def _floor(self, table: CostTable) -> list[Plan]:
        """Every layer under the policy that keeps least, with the strategy whose predicted bytes
        are fewest there (none if no strategy serves the bucket under it)."""
        lean = [k for k, c in enumerate(table.choices) if c.remat == LEANEST]
        if not lean:
            return []
        k = min(lean, key=lambda k: table.plan_bytes(table.uniform(k)))
        return [Plan((Run(table.choices[k].strategy, table.n_layers, LEANEST),))]

    def _search(self, seq_len: int, batch_size: int) -> BucketPlan:
        table = self.table(seq_len, batch_size)
        ranking = ranked_plans(table, self.budget)
        best = ranking.best
        plans = [r.plan() for r in ranking.candidates] + self._floor(table)
        candidates = tuple(dict.fromkeys(self.written(self.whole(p)) for p in plans))
        return BucketPlan(seq_len=seq_len, batch_size=batch_size, plan=candidates[0],
                          predicted_bytes=table.plan_bytes_backward(best.per_layer),
                          predicted_step_s=best.time_s * self.passes(), fits=best.fits, candidates=candidates,
                          method=best.method)
