"""The Trainer: config -> mesh, data, model, programs; `fit` runs the dispatch loop.

Each batch goes to the compiled program of its bucket and plan; parameters and optimizer
state stay in the unified storage layout whatever the plan. Checkpoints hold the state and the
data-iterator position, so a rerun of the same command resumes exactly.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import signal
import sys
import time
from typing import Optional

import jax

from costmodel.hardware import PROFILES
from dysejax import run_report, runtime
from dysejax.autoplan import (AutoPlanner, calibrate_memory_here, calibrate_time_here, check_hardware,
                              resolve_hardware)
from dysejax.checkpoint import Checkpointer, restore_params
from dysejax.compile_watch import compile_counter
from dysejax.config import Config
from dysejax.data import DataPipeline
from dysejax.errors import ConfigError, PlanError, TrainingError, UserError
from dysejax.flops import peak_flops, train_flops
from dysejax.metrics import MetricsWriter
from dysejax.model.transformer import Transformer, block_spec, count_params
from dysejax.optim import build_optimizer, schedule_horizon
from dysejax.plans import PlanTable
from dysejax.prefetch import Prefetcher
from dysejax.programs import ProgramCache, ProgramKey, batch_sharding, gib
from dysejax.progress import Phase, on_terminal
from dysejax.state import StateLayout
from dysejax.step import BATCH_KEYS, make_eval_step, make_train_step
from sharding.layout import StorageLayout
from sharding.mesh import MeshError, build_mesh, describe_mesh, with_stage_axis
from sharding.pipeline import Pipeline, PipelineError
from sharding.plan import Plan, PlanSyntaxError, parse_plan
from sharding.strategies import STRATEGIES, StrategyShapeError, get_strategy


PREFETCH_BATCHES = 2  # batches prepared ahead of the step that runs (host memory: this many batches)


def default_workdir(config_path: Optional[str]) -> str:
    """`runs/<config file stem>` (or `runs/default`)."""
    stem = os.path.splitext(os.path.basename(config_path))[0] if config_path else "default"
    return os.path.join("runs", stem)


def with_attention_kernel(config: Config, platform: str):
    """`config.model` with `attention: auto` resolved for `platform`: on a GPU cuDNN's fused kernel
    for rows of one document in bfloat16/float16 (data.pack false), Pallas's (segment ids) for
    packed rows; elsewhere auto stays (dense up to attention_block, blockwise above). Checkpoints
    keep the config as written, so a run moves between CPU and GPU."""
    m = config.model
    if m.attention != "auto" or platform != "gpu":
        return m
    unpacked_half = not config.data.pack and m.compute_dtype != "float32"
    return dataclasses.replace(m, attention="cudnn" if unpacked_half else "pallas")


class Trainer:
    """Trains `config`'s model on its data; `fit(steps)` returns the metrics rows it wrote."""

    def __init__(self, config: Config, workdir: Optional[str] = None, verbose: bool = True):
        runtime.configure_host_devices(config.parallel.cpu_devices)
        self.config = config
        self.workdir = os.path.abspath(workdir or config.workdir or default_workdir(None))
        if os.path.exists(self.workdir) and not os.path.isdir(self.workdir):
            raise ConfigError(f"--workdir {self.workdir!r} is a file: name a folder (created if missing)")
        self._new_workdir = not os.path.exists(self.workdir)  # removed if the first warmup finds a bad input
        self.verbose = verbose
        self.is_writer = jax.process_index() == 0
        self.interrupted: Optional[int] = None  # signal number that stopped the last fit
        try:
            pp = config.parallel.pipeline
            self.mesh = build_mesh(with_stage_axis(config.parallel.mesh, pp.stages, jax.device_count()))
        except MeshError as e:
            raise ConfigError(str(e)) from None
        self.n_devices = self.mesh.devices.size
        self.model_config = with_attention_kernel(config, self.mesh.devices.flat[0].platform)
        self.spec = block_spec(self.model_config)
        # a bad input found from here on leaves no folder behind that was not there before
        created = next((d for d in (self.workdir, os.path.join(self.workdir, "data")) if not os.path.exists(d)), None)
        try:
            self.data = self._open_data()
            self.budget = runtime.memory_budget_bytes(config.parallel.memory_budget_gb, config.parallel.memory_headroom)
            self._planner: Optional[AutoPlanner] = None
            check_hardware(config.parallel.hardware)
            self.plans = PlanTable(config.parallel.plan, self.data.buckets, config.model.n_layers, list(STRATEGIES),
                                   auto=lambda b: self.planner.plan(b, self.data.batch_size(b)).candidates)
            for bucket in self.data.buckets:
                for plan in self.plans.candidates(bucket):
                    self.check_plan(plan, bucket, self.data.batch_size(bucket))
        except UserError:
            if created is not None and self.is_writer:
                shutil.rmtree(created, ignore_errors=True)
            raise
        self.compile_cache_dir = None
        if config.train.compile_cache:
            self.compile_cache_dir = config.train.compile_cache_dir or os.path.join(self.workdir, "compile_cache")
            runtime.enable_compilation_cache(self.compile_cache_dir)
        self.compiles = compile_counter()
        self.warmup_report: Optional[list[dict]] = None
        self._compiles_at_warmup = 0
        self.model = Transformer(self.model_config)
        self.optimizer = build_optimizer(config.optimizer, config.train.steps)
        self.last_summary: Optional[dict] = None  # run_report.summarize of the last fit
        self.layout = StorageLayout(self.mesh)
        self.state_layout = StateLayout(config.model, self.optimizer, self.layout)
        self.programs = ProgramCache(
            self.mesh, self.state_layout.abstract, self.state_layout.shardings,
            make_train=lambda plan: make_train_step(self.model, self.optimizer, plan, self.mesh,
                                                    config.train.grad_accum,
                                                    skip_nonfinite=config.train.nonfinite == "skip",
                                                    pipeline=self.pipeline),
            make_eval=lambda plan: make_eval_step(self.model, plan, self.mesh, self.pipeline))
        # an input of every train program, so a new --steps or optimizer.total_steps compiles nothing
        self.programs.horizon = schedule_horizon(config.optimizer, config.train.steps)
        self._check_same_on_every_process()

    def _open_data(self) -> DataPipeline:
        """The data pipeline; a trained BPE and token caches go to WORKDIR/data."""
        cfg = self.config
        accum = cfg.train.grad_accum
        data = DataPipeline(cfg.data, seed=cfg.train.seed, batch_multiple=self._batch_multiple() * accum,
                            batch_unit=accum if self.pipeline is None else None,
                            cache_dir=os.path.join(self.workdir, "data"), vocab_size=cfg.model.vocab_size, log=self.log)
        tok = data.tokenizer
        if tok.vocab_size > cfg.model.vocab_size:
            raise ConfigError(f"model.vocab_size ({cfg.model.vocab_size}) is smaller than the {tok.vocab_size} "
                              f"tokens of data.tokenizer {cfg.data.tokenizer!r}: set model.vocab_size to at "
                              f"least {tok.vocab_size}")
        return data

    def _check_same_on_every_process(self) -> None:
        """Every process picks each step's bucket and program from these facts; all must agree."""
        if jax.process_count() == 1:
            return
        facts = {"config": self.config.to_dict(), "data": self.data.report,
                 "epoch0": [(p.bucket, p.batch_size, p.real_tokens) for p in self.data.epoch_plans(0)],
                 "plans": [[p.id for p in self.plans.candidates(b)] for b in self.data.buckets]}
        differ = runtime.disagreeing_processes(facts)
        if differ:
            raise ConfigError(f"process(es) {', '.join(map(str, differ))} derived another config, data or plan "
                              "table than process 0: give every process the same config, --set values and data")

    # -- plans -------------------------------------------------------------------------------
    @property
    def planner(self) -> AutoPlanner:
        """The cost-model planner of `parallel.plan: auto` and `--plan` (built on first use)."""
        if self._planner is None:
            cfg = self.config
            directory = cfg.parallel.costmodel_dir or os.path.join(self.workdir, "costmodel")
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
                       enabled=self.verbose and self.is_writer and here) as phase:
                progress = lambda what: phase.update(1, what)  # noqa: E731
                # the devices are here: fit this model's memory to XLA (only a budget needs it: without
                # one every plan fits, and XLA's own figure is reported beside the prediction)
                if here and (budget is not None or profile_time):
                    hardware = calibrate_memory_here(hardware, self.mesh, self.spec, shapes, directory, self.log,
                                                     progress)
                planner = AutoPlanner(self.spec, dict(self.mesh.shape), cfg.model.n_layers, cfg.model.vocab_size,
                                      hardware, budget, cfg.model.param_dtype, cfg.optimizer.name, cfg.model.remat)
                if here and profile_time:  # time the options that can appear in a plan, where they decide
                    planner = calibrate_time_here(planner, self.mesh, shapes, directory, self.log, progress)
            self._planner = planner
        return self._planner

    def parse_plan(self, value) -> Plan:
        """A strategy name or written plan for this model, as a Plan."""
        try:
            return parse_plan(value, self.config.model.n_layers, list(STRATEGIES))
        except PlanSyntaxError as e:
            raise ConfigError(str(e)) from None

    def check_plan(self, plan: Plan, seq_len: int, batch_size: int) -> None:
        """Raise PlanError if a strategy of `plan` cannot serve this bucket's shape."""
        for name in plan.strategies():
            try:
                get_strategy(name).check(self.spec, self.mesh, batch_size, seq_len)
            except StrategyShapeError as e:
                raise PlanError(f"bucket {seq_len} (batch {batch_size}): {e}") from None
        if self.pipeline is not None:
            try:
                self.pipeline.check(plan, self.spec, self.mesh, batch_size, seq_len)
            except PipelineError as e:
                raise ConfigError(f"bucket {seq_len} (batch {batch_size}): {e}") from None

    @property
    def pipeline(self) -> Optional[Pipeline]:
        """`parallel.pipeline` as a Pipeline (None when it has one stage)."""
        pp = self.config.parallel.pipeline
        if pp.stages == 1:
            return None
        return Pipeline(pp.stages, pp.microbatches, pp.schedule, tuple(pp.partition or ()))

    def _batch_multiple(self) -> int:
        """Batch sizes are multiples of this: every device, and every micro-batch of a pipeline stage."""
        if self.pipeline is None:
            return self.n_devices
        return math.lcm(self.n_devices, self.pipeline.batch_multiple(self.n_devices))

    # -- programs ----------------------------------------------------------------------------
    def _jobs(self) -> list[tuple[str, int, int]]:
        jobs = [("train", b, self.data.batch_size(b)) for b in self.data.buckets]
        if self.config.data.eval_batches > 0:
            jobs += sorted({("eval", p.bucket, p.batch_size) for p in self.data.eval_plans()})
        return jobs

    def warmup(self) -> list[dict]:
        """Compile every bucket's train (and eval) program ahead of training; returns the report.

        Raises PlanError after reporting if some bucket has no plan within the memory budget.
        """
        from dysejax.plan_report import why_nothing_fits

        report, failures = [], []
        self.state_layout.compiled_init()
        jobs = self._jobs()
        with Phase("warmup: compiling", total=len(jobs), unit="program", log=self.log,
                   enabled=self.verbose and self.is_writer, bar=self._bar_on(), lazy=False) as phase:
            for kind, seq_len, batch_size in jobs:
                candidates = self.plans.candidates(seq_len)
                try:
                    self.programs.select(kind, seq_len, batch_size, candidates, self.budget)
                except PlanError as e:
                    failures.append(PlanError(f"{e}{why_nothing_fits(self, seq_len)}"))
                for plan in candidates:
                    p = self.programs.programs.get(ProgramKey(kind, seq_len, batch_size, plan.id))
                    if p is None:
                        continue
                    fits = self.budget is None or p.bytes_per_device <= self.budget
                    report.append({"kind": kind, "seq_len": seq_len, "batch_size": batch_size, "plan": plan.id,
                                   "compile_s": p.compile_s, "bytes_per_device": p.bytes_per_device, "fits": fits,
                                   "selected": self.programs.selected_program(kind, seq_len, batch_size) is p})
                    if not phase.bar_on or not fits:  # the bar is the progress on a terminal
                        self.log(f"warmup {kind:5s} bucket {seq_len:>6} x {batch_size:<4} plan {plan.id:<12} "
                                 f"{p.compile_s:6.2f} s  {gib(p.bytes_per_device)}/device"
                                 + ("" if fits else f"  over budget ({gib(self.budget)})"))
                phase.update(1, f"{kind} {seq_len}")
        self.warmup_report = report
        runtime.agreed_signal(None)  # builds the per-step stop agreement of a multi-process run now
        self._compiles_at_warmup = self.compiles.lowered
        if failures:
            if self._new_workdir and self.is_writer:  # leave no trace of a run that could not start
                shutil.rmtree(self.workdir, ignore_errors=True)
            raise failures[0]
        self._new_workdir = False
        return report

    def compile(self, seq_len: int, plan=None, kind: str = "train"):
        """The `jax.stages.Compiled` for a bucket and plan (default: the bucket's first candidate)."""
        if seq_len not in self.data.buckets:
            raise ConfigError(f"{seq_len} is not a bucket length (buckets: {', '.join(map(str, self.data.buckets))})")
        plan = self.parse_plan(plan) if plan is not None else self.plans.candidates(seq_len)[0]
        batch_size = self.data.batch_size(seq_len)
        self.check_plan(plan, seq_len, batch_size)
        return self.programs.get(kind, seq_len, batch_size, plan).compiled

    def program_for(self, kind: str, seq_len: int, batch_size: int):
        """The warmed-up program of this shape (selected on demand if warmup did not see it)."""
        program = self.programs.selected_program(kind, seq_len, batch_size)
        if program is None:
            program = self.programs.select(kind, seq_len, batch_size, self.plans.candidates(seq_len), self.budget)
        return program

    @property
    def compiles_after_warmup(self) -> int:
        return self.compiles.lowered - self._compiles_at_warmup

    def plan_rows(self) -> list[dict]:
        """Per bucket, the train program warmup selected: plan, remat, predicted and XLA bytes."""
        predicted = {}
        if self._planner is not None:  # the cost model is built (auto): its prediction for each plan
            for r in self.warmup_report or []:
                if r["kind"] == "train" and r["selected"]:
                    plan = self.parse_plan(r["plan"])
                    predicted[(r["seq_len"], r["plan"])] = self.planner.predict(r["seq_len"], r["batch_size"], plan)[0]
        return run_report.plan_rows(self.warmup_report or [], predicted)

    def format_plans(self) -> str:
        """The plan table printed before training."""
        source = "parallel.plan"
        if self.plans.auto_buckets:
            hw = self.planner.hardware
            source = f"auto: cost model for {hw if isinstance(hw, str) else hw.device_kind}"
        return run_report.format_plan_table(self.plan_rows(), self.budget, source)

    @property
    def peak_flops(self) -> tuple[float, str]:
        """(peak FLOP/s per device, its source) that MFU is measured against."""
        return peak_flops(resolve_hardware("auto", self.mesh, None, log=lambda _: None), self.config.train.peak_tflops)

    # -- pieces ------------------------------------------------------------------------------
    def log(self, message: str) -> None:
        if self.verbose and self.is_writer:
            print(message, flush=True)

    def _bar_on(self) -> bool:
        """Progress bars: train.progress and a terminal to redraw them on."""
        return self.verbose and self.is_writer and self.config.train.progress and on_terminal()

    def _step_lines_on(self) -> bool:
        """Step log lines: whenever a bar does not show them on the terminal stdout goes to."""
        return self.verbose and self.is_writer and not (self._bar_on() and sys.stdout.isatty())

    def load_batch(self, plan_b, plan: Plan) -> dict:
        """Global device arrays of one batch; this process materialises only the block of rows
        and columns its devices hold (from the global batch plan every process shares)."""
        sharding = batch_sharding(plan, self.mesh)
        shape = (plan_b.batch_size, plan_b.bucket)
        boxes = list(sharding.addressable_devices_indices_map(shape).values())
        (r0, r1), (c0, c1) = [(min(b[d].indices(n)[0] for b in boxes), max(b[d].indices(n)[1] for b in boxes))
                              for d, n in enumerate(shape)]
        arrays = self.data.materialize(plan_b, rows=slice(r0, r1)).as_dict()
        return {k: jax.make_array_from_process_local_data(sharding, arrays[k][:, c0:c1], shape)
                for k in BATCH_KEYS}

    def _meta(self) -> dict:
        return {"model": dataclasses.asdict(self.config.model),
                "schedule_horizon": self.optimizer_horizon,
                "config": self.config.to_dict()}

    @property
    def optimizer_horizon(self) -> int:
        """The lr schedule's horizon: optimizer.total_steps, else train.steps."""
        return self.programs.horizon

    def evaluate(self, params) -> dict:
        """Held-out token loss and perplexity over the fixed eval batches, overall and per bucket:
        {"eval_loss", "eval_ppl", "eval_tokens", "eval_loss_<L>", "eval_ppl_<L>", "eval_tokens_<L>", ...}
        ({} without eval tokens)."""
        sums: dict[int, list[float]] = {}
        for plan_b in self.data.eval_plans():
            program = self.program_for("eval", plan_b.bucket, plan_b.batch_size)
            loss_sum, n = jax.device_get(program(params, self.load_batch(plan_b, program.plan)))
            acc = sums.setdefault(plan_b.bucket, [0.0, 0.0])
            acc[0], acc[1] = acc[0] + float(loss_sum), acc[1] + float(n)
        out = {}
        for name, (total, count) in [("", [sum(v[i] for v in sums.values()) for i in (0, 1)])] + \
                sorted((f"_{b}", v) for b, v in sums.items()):
            if count:
                out[f"eval_loss{name}"] = total / count
                out[f"eval_ppl{name}"] = math.exp(min(total / count, 80.0))  # exp(80) ~ 5e34: not inf
                out[f"eval_tokens{name}"] = int(count)
        return out

    # -- the loop ----------------------------------------------------------------------------
    def _restore_or_init(self, ckpt: Checkpointer, metrics: MetricsWriter):
        step = ckpt.latest_step()
        if step is None:
            metrics.truncate_after(0)  # rows of a run killed before its first checkpoint
            init_from = self.config.train.init_from
            if init_from is None:
                return self.state_layout.init(self.config.train.seed), self.data.train_iterator(), 0
            params = restore_params(init_from, self.state_layout.abstract["params"])
            self.log(f"parameters from {init_from}")
            return self.state_layout.from_params(params), self.data.train_iterator(), 0
        saved = ckpt.check_compatible(step, self._meta())
        state, data_state = ckpt.restore(step, self.state_layout.abstract)
        metrics.truncate_after(step)
        self.log(f"resumed from checkpoint step {step} in {ckpt.directory}")
        old = saved.get("schedule_horizon")
        if old is not None and old != self.optimizer_horizon:
            self.log(f"note: the lr schedule horizon is now {self.optimizer_horizon} steps (the checkpoint "
                     f"used {old}); set optimizer.total_steps={old} to keep the old schedule")
        return state, self.data.train_iterator(data_state), step

    def fit(self, steps: Optional[int] = None) -> list[dict]:
        """Train until the state reaches `steps` total steps (default train.steps); returns the rows."""
        cfg = self.config
        target = steps if steps is not None else cfg.train.steps
        if target <= 0:
            raise ConfigError(f"--steps must be positive, got {target}")
        os.makedirs(self.workdir, exist_ok=True)
        t_fit = time.perf_counter()
        self.interrupted = None
        self.log(describe_mesh(self.mesh))
        plans = ", ".join(sorted({p.id for p in self.plans.distinct()}))
        self.log(f"model: {count_params(self.state_layout.abstract['params']) / 1e6:.2f}M parameters, "
                 f"plans {plans}; {self.data.summary()}")
        metrics = MetricsWriter(self.workdir, enabled=self.is_writer, tensorboard=cfg.train.tensorboard,
                                wandb=self._wandb_settings())
        ckpt = Checkpointer(os.path.join(self.workdir, "checkpoints"), cfg.train.checkpoint_every,
                            cfg.train.keep_checkpoints, cfg.train.async_checkpoint)
        rows: list[dict] = []
        try:
            state, it, start = self._restore_or_init(ckpt, metrics)
            if start >= target:
                self.log(f"already at step {start} (target {target}): nothing to do")
                return rows
            if self.warmup_report is None:
                self.warmup()
            self.log(self.format_plans())
            peak, peak_source = self.peak_flops
            lines = self._step_lines_on()
            if lines:
                self.log(f"training steps {start + 1}..{target}, a line every {cfg.train.log_every} (MFU vs "
                         f"{peak / 1e12:.4g} TFLOP/s per device: {peak_source})")
            reported = self.compiles_after_warmup
            skipped = 0
            rates = run_report.BucketRates()

            def produce():  # on the prefetch thread: the next batch on the devices, and the position after it
                plan_b = it.next_plan()
                program = self.program_for("train", plan_b.bucket, plan_b.batch_size)
                return plan_b, it.state(), program, self.load_batch(plan_b, program.plan)

            with _stop_signals() as stop, _progress(self, start, target) as bar, \
                    Prefetcher(produce, PREFETCH_BATCHES) as batches:
                for step in range(start + 1, target + 1):
                    t_wait = time.perf_counter()
                    plan_b, data_state, program, batch = batches.next()
                    t0 = time.perf_counter()
                    state, out = program(state, batch)
                    out = jax.device_get(out)
                    dt = time.perf_counter() - t0
                    row = {"step": step, "loss": float(out["loss"]), "tokens": int(plan_b.real_tokens),
                           "loss_tokens": int(out["loss_tokens"]), "bucket": plan_b.bucket,
                           "batch_size": plan_b.batch_size, "plan": program.plan.id,
                           "step_time_s": dt, "data_wait_s": t0 - t_wait, "tokens_per_s": plan_b.real_tokens / dt if dt > 0 else 0.0,
                           "lr": float(out["lr"]), "grad_norm": float(out["grad_norm"]),
                           "bytes_per_device": program.bytes_per_device}
                    flops = train_flops(cfg.model, plan_b.batch_size, plan_b.bucket)
                    row["model_tflops"] = flops / 1e12
                    row["mfu"] = flops / (dt * peak * self.n_devices) if dt > 0 else 0.0
                    row["bucket_tokens_per_s"] = rates.add(plan_b.bucket, row["tokens"], dt)
                    if not bool(out["finite"]):
                        if cfg.train.nonfinite == "stop":
                            raise TrainingError(
                                f"non-finite loss or gradient at step {step} (bucket {plan_b.bucket}, plan "
                                f"{program.plan.id}); nothing was saved for it: lower optimizer.lr, or set "
                                "train.nonfinite=skip to skip such steps")
                        skipped += 1
                    row["skipped_steps"] = skipped
                    if step % cfg.train.eval_every == 0 and cfg.data.eval_batches > 0:
                        row.update(self.evaluate(state["params"]))
                    row["compiles_after_warmup"] = self.compiles_after_warmup
                    if row["compiles_after_warmup"] > reported:
                        reported = row["compiles_after_warmup"]
                        sys.stderr.write(f"WARNING: {reported} compilation(s) after warmup (step {step}, bucket "
                                         f"{plan_b.bucket}): a program was built on the training path\n")
                    metrics.write(row)
                    rows.append(row)
                    bar.update(row)
                    if lines and (step % cfg.train.log_every == 0 or step in (start + 1, target)):
                        self.log(run_report.format_step(row, target))
                    signum = runtime.agreed_signal(stop.signum)  # every process stops after the same step
                    if ckpt.should_save(step) or step == target or signum is not None:
                        ckpt.save(step, state, data_state, self._meta())
                    if signum is not None:
                        self.interrupted = signum
                        ckpt.wait()
                        self.log(f"stopped by {signal.Signals(signum).name} at step {step}: "
                                 f"checkpoint saved in {ckpt.directory}")
                        break
            self.state = state
        finally:
            ckpt.close()
            metrics.close()
        self._report_run(rows, time.perf_counter() - t_fit)
        return rows


    def _report_run(self, rows: list[dict], wall_s: float) -> None:
        """The per-bucket summary of this fit, and WORKDIR/run.png of the whole run."""
        if not rows:
            return
        self.last_summary = run_report.summarize(rows)
        self.log(run_report.format_summary(self.last_summary, wall_s))
        if self.config.train.plot and self.is_writer:
            from dysejax.run_plot import write_run_plot

            path = write_run_plot(self.workdir)
            self.log(f"plot: {path}" if path else "plot: not written (pip install matplotlib)")

    def _wandb_settings(self) -> Optional[dict]:
        t = self.config.train
        if not t.wandb:
            return None
        return {"project": t.wandb_project, "mode": t.wandb_mode, "config": self.config.to_dict(),
                "name": os.path.basename(self.workdir)}


class _StopFlag:
    signum: Optional[int] = None


@contextlib.contextmanager
def _stop_signals():
    """Turn SIGTERM/SIGINT into a flag the loop checks after each step (main thread only)."""
    flag = _StopFlag()
    handled = (signal.SIGTERM, signal.SIGINT)
    try:
        previous = {s: signal.signal(s, lambda signum, frame: setattr(flag, "signum", signum)) for s in handled}
    except ValueError:  # not the main thread: leave signals alone
        previous = {}
    try:
        yield flag
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def _progress(trainer: Trainer, start: int, target: int):
    """A tqdm bar showing tokens/s, loss and bucket (on a terminal; log lines otherwise)."""
    from tqdm import tqdm

    enabled = trainer._bar_on()
    bar = tqdm(total=target, initial=start, disable=not enabled, unit="step", file=sys.stderr,
               dynamic_ncols=True, mininterval=0.5)

    class Bar:
        def update(self, row):
            bar.set_postfix(loss=f"{row['loss']:.3f}", tok_s=f"{row['tokens_per_s']:.0f}",
                            bucket=row["bucket"], plan=row["plan"], refresh=False)
            bar.update(1)
    try:
        yield Bar()
    finally:
        bar.close()
