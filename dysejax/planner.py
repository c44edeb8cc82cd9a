"""The Planner: which plans may run each bucket, and what the cost model predicts for any plan.

One object serves the trainer and the plan report (`train.py --plan`) alike. Each bucket has
candidate plans in order of preference (the program cache runs the first whose compiled
program fits the memory budget): its written plan, or for an `auto` entry the cost model's
ranked plans (`dysejax.autoplan.AutoPlanner`). The cost model is built on first use; when the
devices here are the hardware planned for, it is first calibrated on them.
"""
from __future__ import annotations

import time
from typing import Callable, Optional, Union

import jax

from costmodel.hardware import PROFILES
from costmodel.table import CostTable
from dysejax import runtime
from dysejax.autoplan import (AutoPlanner, BucketPlan, calibrate_memory_here, calibrate_time_here,
                              check_hardware, layer_rows, resolve_hardware)
from dysejax.config import Config
from dysejax.errors import ConfigError, PlanError
from dysejax.plans import AUTO, plan_entries
from dysejax.progress import Phase
from sharding.pipeline import Pipeline, PipelineError
from sharding.plan import Plan, PlanSyntaxError, parse_plan
from sharding.strategies import STRATEGIES, StrategyShapeError, get_strategy


class Planner:
    """Candidate plans per bucket (checked against its shape) and the cost model's predictions."""

    def __init__(self, config: Config, mesh, spec, pipeline: Optional[Pipeline], data, budget: Optional[int],
                 state_bytes: int, costmodel_dir: str, log: Callable[[str], None] = print,
                 show_progress: bool = False):
        """`data` gives the bucket lengths and the batch size of a length (`data.batch_size`);
        `state_bytes` is what one device holds of the parameters, their gradients and the
        optimizer state in the storage layout: the floor under every plan."""
        self.config, self.mesh, self.spec, self.pipeline, self.data = config, mesh, spec, pipeline, data
        self.budget, self.state_bytes = budget, state_bytes
        self.costmodel_dir, self.log, self.show_progress = costmodel_dir, log, show_progress
        self._cost_model: Optional[AutoPlanner] = None
        # seconds spent planning: the cost model's calibration on these devices, the plan search
        self.overheads = {"calibrate_memory_s": 0.0, "calibrate_time_s": 0.0, "search_s": 0.0}
        check_hardware(config.parallel.hardware)
        entries = plan_entries(config.parallel.plan, data.buckets, config.model.n_layers, list(STRATEGIES))
        self.auto_buckets = [b for b, e in entries.items() if e == AUTO]
        self._candidates = {b: self._auto_candidates(b) if e == AUTO else [e] for b, e in entries.items()}
        for bucket, plans in self._candidates.items():
            for plan in plans:
                self.check(plan, bucket, data.batch_size(bucket))

    def _auto_candidates(self, bucket: int) -> list[Plan]:
        model = self.cost_model  # built (and calibrated) outside the search's time
        t0 = time.perf_counter()
        plans = list(model.plan(bucket, self.data.batch_size(bucket)).candidates)
        self.overheads["search_s"] += time.perf_counter() - t0
        # the cost model's feasibility is its own; the plans run must pass the check the trainer applies
        serving = [p for p in plans if self._serves(p, bucket, self.data.batch_size(bucket))]
        return serving or plans  # none: the check below names why

    # -- per bucket ------------------------------------------------------------------------
    def candidates(self, bucket: int) -> list[Plan]:
        """Plans for this bucket, most preferred first."""
        return self._candidates[bucket]

    def distinct(self) -> list[Plan]:
        """Every candidate plan of every bucket, once each."""
        return list({p.id: p for plans in self._candidates.values() for p in plans}.values())

    def parse(self, value) -> Plan:
        """A strategy name, written plan or plan id for this model, as a Plan."""
        try:
            return parse_plan(value, self.config.model.n_layers, list(STRATEGIES))
        except PlanSyntaxError as e:
            raise ConfigError(str(e)) from None

    def _serves(self, plan: Plan, seq_len: int, batch_size: int) -> bool:
        try:
            self.check(plan, seq_len, batch_size)
        except (PlanError, ConfigError):
            return False
        return True

    def check(self, plan: Plan, seq_len: int, batch_size: int) -> None:
        """Raise PlanError if a strategy of `plan` cannot serve this shape, split into
        `train.grad_accum` micro-batches as the train step runs it (ConfigError if the pipeline
        cannot)."""
        accum = self.config.train.grad_accum
        rows = batch_size // accum  # one grad-accum micro-batch (a pipeline splits it again in its check)
        where = f"batch {batch_size}" + (f", micro-batches of {rows} rows with train.grad_accum={accum}"
                                          if accum > 1 else "")
        for name in plan.strategies():
            try:
                get_strategy(name).check(self.spec, self.mesh, rows, seq_len)
            except StrategyShapeError as e:
                fix = "; raise data.tokens_per_batch or lower train.grad_accum" if accum > 1 else ""
                raise PlanError(f"bucket {seq_len} ({where}): {e}{fix}") from None
        if self.pipeline is not None:
            try:
                self.pipeline.check(plan, self.spec, self.mesh, rows, seq_len)  # each micro-batch runs it
            except PipelineError as e:
                raise ConfigError(f"bucket {seq_len} ({where}): {e}") from None

    # -- the cost model --------------------------------------------------------------------
    @property
    def cost_model(self) -> AutoPlanner:
        """The cost model of `parallel.hardware` for this model, mesh and budget (built on first use)."""
        if self._cost_model is None:
            cfg = self.config
            directory = self.costmodel_dir
            hardware = resolve_hardware(cfg.parallel.hardware, self.mesh, directory, self.log)
            # timings differ per process, and every process must derive the same plans
            profile_time = cfg.parallel.profile_time and jax.process_count() == 1
            if cfg.parallel.profile_time and not profile_time:
                self.log("parallel.profile_time is ignored with several processes: the shipped time model plans")
            budget = self.budget
            if budget is None and isinstance(hardware, str):  # planning a GPU from here: what JAX could use
                budget = runtime.usable_bytes(PROFILES[hardware].memory_bytes, cfg.parallel.memory_headroom)
            here = not isinstance(hardware, str)
            shapes = [(self.data.batch_size(b), b) for b in self.data.buckets]
            with Phase("cost model: calibrating on these devices", unit="program", log=self.log,
                       enabled=self.show_progress and here) as phase:
                progress = lambda what: phase.update(1, what)  # noqa: E731
                # the devices are here: fit this model's memory to XLA (only a budget needs it: without
                # one every plan fits, and XLA's own figure is reported beside the prediction)
                t0 = time.perf_counter()
                if here and (budget is not None or profile_time):
                    micro = [(layer_rows(batch, cfg.train.grad_accum, self.pipeline), seq_len)
                             for batch, seq_len in shapes]
                    hardware = calibrate_memory_here(hardware, self.mesh, self.spec, micro, directory, self.log,
                                                     progress)
                self.overheads["calibrate_memory_s"] = time.perf_counter() - t0
                planner = AutoPlanner(self.spec, dict(self.mesh.shape), cfg.model.n_layers, cfg.model.vocab_size,
                                      hardware, budget, cfg.model.param_dtype, cfg.optimizer.name, cfg.model.remat,
                                      loss_chunk=cfg.model.loss_chunk, grad_accum=cfg.train.grad_accum,
                                      pipeline=self.pipeline)
                t0 = time.perf_counter()
                if here and profile_time:  # time the options that can appear in a plan, where they decide
                    planner = calibrate_time_here(planner, self.mesh, shapes, directory, self.log, progress)
                self.overheads["calibrate_time_s"] = time.perf_counter() - t0
            self._cost_model = planner
        return self._cost_model

    @property
    def hardware(self):
        """What the cost model prices with: a profile name, or a calibration of the devices here."""
        return self.cost_model.hardware

    @property
    def source(self) -> str:
        """Where the plans come from, as the plan table names it."""
        if not self.auto_buckets:
            return "parallel.plan"
        hw = self.hardware
        return f"auto: cost model for {hw if isinstance(hw, str) else hw.device_kind}"

    def plan(self, seq_len: int, batch_size: int) -> BucketPlan:
        """The search's plan for this shape and its fallbacks, with its predictions."""
        return self.cost_model.plan(seq_len, batch_size)

    def table(self, seq_len: int, batch_size: int, choices=None) -> CostTable:
        """The cost table of this shape (every feasible strategy x remat policy by default)."""
        return self.cost_model.table(seq_len, batch_size, choices)

    def predict(self, seq_len: int, batch_size: int, plan: Plan) -> tuple[int, float]:
        """(bytes per device, step seconds) the cost model predicts for any plan of this shape."""
        return self.cost_model.predict(seq_len, batch_size, plan)

    def predicted_bytes(self, seq_len: int, batch_size: int, plan: Union[Plan, str]) -> Optional[int]:
        """The predicted bytes of a plan (or plan id) when the cost model is built, else None."""
        if self._cost_model is None:
            return None
        return self.predict(seq_len, batch_size, plan if isinstance(plan, Plan) else self.parse(plan))[0]
