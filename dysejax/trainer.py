"""The Trainer: `warmup` compiles every bucket's program ahead of time, `fit` runs the loop.

`build(config)` gives the mesh, data, planner and program cache (dysejax/build.py). Each batch
goes to the compiled program of its bucket and plan; parameters and optimizer state stay in the
unified storage layout whatever the plan. Checkpoints hold the state and the data-iterator
position, so a rerun of the same command resumes exactly.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import signal
import sys
import time
from typing import Optional

import jax

from dysejax import run_report, runtime
from dysejax.batches import load_batch
from dysejax.build import build
from dysejax.checkpoint import Checkpointer, restore_params
from dysejax.compile_watch import compile_counter
from dysejax.config import Config
from dysejax.errors import ConfigError, PlanError, TrainingError, UserError
from dysejax.flops import Peak, peak_flops, train_flops
from dysejax.metrics import MetricsWriter
from dysejax.model.transformer import count_params
from dysejax.plan_report import why_nothing_fits
from dysejax.prefetch import Prefetcher
from dysejax.programs import ProgramKey, gib
from dysejax.progress import Phase, on_terminal, step_bar
from sharding.mesh import describe_mesh
from sharding.plan import Plan

PREFETCH_BATCHES = 2  # batches prepared ahead of the step that runs (host memory: this many batches)


class Trainer:
    """Trains `config`'s model on its data; `fit(steps)` returns the metrics rows it wrote."""

    def __init__(self, config: Config, workdir: Optional[str] = None, verbose: bool = True):
        self.config, self.verbose = config, verbose
        setup = build(config, workdir, verbose)
        self.is_writer = jax.process_index() == 0
        self.workdir, self._new_workdir, self.log = setup.workdir, setup.new_workdir, setup.log
        self.mesh, self.data, self.budget, self.planner = setup.mesh, setup.data, setup.budget, setup.planner
        self.model, self.optimizer, self.state_layout = setup.model, setup.optimizer, setup.state_layout
        self.programs, self.compile_cache_dir = setup.programs, setup.compile_cache_dir
        self.compile_cache_off = setup.compile_cache_off  # why the persistent cache is off, if configured on
        self.n_devices = self.mesh.devices.size
        self.compiles = compile_counter()  # from here on: the planner's calibration is not the trainer's
        self._compiles_at_warmup = 0
        self.warmup_report: Optional[list[dict]] = None
        self.last_summary: Optional[dict] = None  # run_report.summarize of the last fit
        self.interrupted: Optional[int] = None  # signal number that stopped the last fit

    # -- programs ----------------------------------------------------------------------------
    def warmup(self) -> list[dict]:
        """Compile every bucket's train (and eval) program ahead of training; returns the report.

        Raises PlanError after reporting if some bucket has no plan within the memory budget.
        """
        report, failures = [], []
        self.state_layout.compiled_init()
        jobs = [("train", b, self.data.batch_size(b)) for b in self.data.buckets]
        if self.config.data.eval_batches > 0:
            jobs += sorted({("eval", p.bucket, p.batch_size) for p in self.data.eval_plans()})
        with Phase("warmup: compiling", total=len(jobs), unit="program", log=self.log,
                   enabled=self.verbose and self.is_writer, bar=self._bar_on(), lazy=False) as phase:
            for kind, seq_len, batch_size in jobs:
                candidates = self.planner.candidates(seq_len)
                try:
                    self.programs.select(kind, seq_len, batch_size, candidates, self.budget)
                except PlanError as e:
                    failures.append(PlanError(f"{e}{why_nothing_fits(self.planner.state_bytes, self.budget)}"))
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
        self.peak_flops  # noqa: B018 (measured now: on CPU it compiles a matmul)
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
        plan = self.planner.parse(plan) if plan is not None else self.planner.candidates(seq_len)[0]
        batch_size = self.data.batch_size(seq_len)
        self.planner.check(plan, seq_len, batch_size)
        return self.programs.get(kind, seq_len, batch_size, plan).compiled

    def program_for(self, kind: str, seq_len: int, batch_size: int):
        """The warmed-up program of this shape (selected on demand if warmup did not see it)."""
        program = self.programs.selected_program(kind, seq_len, batch_size)
        if program is None:
            program = self.programs.select(kind, seq_len, batch_size, self.planner.candidates(seq_len), self.budget)
        return program

    def load_batch(self, plan_b, plan: Plan) -> dict:
        """The batch `plan_b` on the devices under `plan` (this process loads only its block)."""
        return load_batch(self.data, plan_b, plan, self.mesh)

    @property
    def compiles_after_warmup(self) -> int:
        return self.compiles.lowered - self._compiles_at_warmup

    def format_plans(self) -> str:
        """The plan table printed before training: per bucket the plan warmup selected, its remat,
        predicted and XLA bytes per device, compile seconds."""
        rows = run_report.plan_rows(self.warmup_report or [], self.planner.predicted_bytes)
        return run_report.format_plan_table(rows, self.budget, self.planner.source)

    @functools.cached_property
    def peak_flops(self) -> Peak:
        """The device peak MFU is measured against (`dysejax.flops.peak_flops`; on CPU a matmul
        rate measured once per machine, cached with the cost model's files). Warmup reads it, so
        its measurement compiles before `compiles_after_warmup` starts counting."""
        cache = self.config.parallel.costmodel_dir or runtime.user_cache_dir("costmodel")
        return peak_flops(self.mesh, cache, self.config.train.peak_tflops)

    @property
    def optimizer_horizon(self) -> int:
        """The lr schedule's horizon: optimizer.total_steps, else train.steps."""
        return self.programs.horizon

    def evaluate(self, params) -> dict:
        """Held-out token loss and perplexity over the fixed eval batches, overall and per bucket
        (`run_report.eval_metrics`; {} without eval tokens)."""
        sums: dict[int, tuple[float, float]] = {}
        for plan_b in self.data.eval_plans():
            program = self.program_for("eval", plan_b.bucket, plan_b.batch_size)
            loss_sum, n = jax.device_get(program(params, self.load_batch(plan_b, program.plan)))
            total, count = sums.get(plan_b.bucket, (0.0, 0.0))
            sums[plan_b.bucket] = (total + float(loss_sum), count + float(n))
        return run_report.eval_metrics(sums)

    # -- the loop ----------------------------------------------------------------------------
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
        plans = ", ".join(sorted({p.id for p in self.planner.distinct()}))
        self.log(f"model: {count_params(self.state_layout.abstract['params']) / 1e6:.2f}M parameters, "
                 f"plans {plans}; {self.data.summary()}")
        metrics = MetricsWriter(self.workdir, enabled=self.is_writer, tensorboard=cfg.train.tensorboard,
                                wandb=self._wandb_settings())
        ckpt = Checkpointer(os.path.join(self.workdir, "checkpoints"), cfg.train.checkpoint_every,
                            cfg.train.keep_checkpoints, cfg.train.async_checkpoint)
        rows: list[dict] = []
        started = True
        try:
            state, it, start = self._restore_or_init(ckpt, metrics)
            if start >= target:
                self.log(f"already at step {start} (target {target}): nothing to do")
                return rows
            if self.warmup_report is None:
                self.warmup()
            self.log(self.format_plans())
            peak = self.peak_flops
            lines = self._step_lines_on()
            if lines:
                self.log(f"training steps {start + 1}..{target}, a line every {cfg.train.log_every} (MFU of "
                         f"{peak.name}: {peak.source})")
            reported = self.compiles_after_warmup
            skipped = 0
            rates = run_report.BucketRates()

            def produce():  # on the prefetch thread: the next batch on the devices, and the position after it
                plan_b = it.next_plan()
                program = self.program_for("train", plan_b.bucket, plan_b.batch_size)
                return plan_b, it.state(), program, self.load_batch(plan_b, program.plan)

            with runtime.stop_signals() as stop, step_bar(self._bar_on(), start, target) as bar, \
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
                    row["mfu"] = flops / (dt * peak.flops * self.n_devices) if dt > 0 else 0.0
                    row["mfu_of"] = peak.name
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
        except UserError:
            started = False  # e.g. a train.init_from that cannot be read: no trace of the run is kept
            raise
        finally:
            ckpt.close()
            metrics.close()
            if not started and self._new_workdir and self.is_writer:
                shutil.rmtree(self.workdir, ignore_errors=True)
        self._report_run(rows, time.perf_counter() - t_fit)
        return rows

    def _restore_or_init(self, ckpt: Checkpointer, metrics: MetricsWriter):
        """(state, data iterator, step): from the latest checkpoint, else fresh (or train.init_from)."""
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

    def _meta(self) -> dict:
        """What a checkpoint records beside the state (checked on resume)."""
        return {"model": dataclasses.asdict(self.config.model),
                "schedule_horizon": self.optimizer_horizon,
                "config": self.config.to_dict()}

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

    def _bar_on(self) -> bool:
        """Progress bars: train.progress and a terminal to redraw them on."""
        return self.verbose and self.is_writer and self.config.train.progress and on_terminal()

    def _step_lines_on(self) -> bool:
        """Step log lines: whenever a bar does not show them on the terminal stdout goes to."""
        return self.verbose and self.is_writer and not (self._bar_on() and sys.stdout.isatty())
