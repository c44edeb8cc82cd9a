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
import signal
import sys
import time
from typing import Optional

import jax

from dysejax import runtime
from dysejax.checkpoint import Checkpointer
from dysejax.config import Config
from dysejax.data import DataPipeline
from dysejax.errors import ConfigError, PlanError
from dysejax.metrics import MetricsWriter
from dysejax.model.transformer import Transformer, block_spec, count_params
from dysejax.optim import build_optimizer
from dysejax.programs import ProgramCache, batch_sharding
from dysejax.state import StateLayout
from dysejax.step import BATCH_KEYS, make_eval_step, make_train_step
from sharding.layout import StorageLayout
from sharding.mesh import MeshError, build_mesh, describe_mesh
from sharding.plan import Plan, PlanSyntaxError, parse_plan
from sharding.strategies import STRATEGIES, StrategyShapeError, get_strategy


def default_workdir(config_path: Optional[str]) -> str:
    """`runs/<config file stem>` (or `runs/default`)."""
    stem = os.path.splitext(os.path.basename(config_path))[0] if config_path else "default"
    return os.path.join("runs", stem)


class Trainer:
    """Trains `config`'s model on its data; `fit(steps)` returns the metrics rows it wrote."""

    def __init__(self, config: Config, workdir: Optional[str] = None, verbose: bool = True):
        runtime.configure_host_devices(config.parallel.cpu_devices)
        self.config = config
        self.workdir = os.path.abspath(workdir or config.workdir or default_workdir(None))
        self.verbose = verbose
        self.interrupted: Optional[int] = None  # signal number that stopped the last fit
        try:
            self.mesh = build_mesh(config.parallel.mesh)
        except MeshError as e:
            raise ConfigError(str(e)) from None
        self.n_devices = self.mesh.devices.size
        self.spec = block_spec(config.model)
        self.plan = self._parse_plan(config.parallel.plan)
        self.data = DataPipeline(config.data, seed=config.train.seed,
                                 batch_multiple=self.n_devices * config.train.grad_accum)
        for bucket in self.data.buckets:
            self.check_plan(self.plan, bucket, self.data.batch_size(bucket))
        self.model = Transformer(config.model)
        self.optimizer = build_optimizer(config.optimizer, config.train.steps)
        self.layout = StorageLayout(self.mesh)
        self.state_layout = StateLayout(config.model, self.optimizer, self.layout)
        self.programs = ProgramCache(
            self.mesh, self.state_layout.abstract, self.state_layout.shardings,
            make_train=lambda plan: make_train_step(self.model, self.optimizer, plan, self.mesh,
                                                    config.train.grad_accum),
            make_eval=lambda plan: make_eval_step(self.model, plan, self.mesh))
        self.is_writer = jax.process_index() == 0

    # -- plans -------------------------------------------------------------------------------
    def _parse_plan(self, value) -> Plan:
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

    def plan_for(self, seq_len: int) -> Plan:
        """The plan that runs batches of this bucket."""
        return self.plan

    # -- pieces ------------------------------------------------------------------------------
    def log(self, message: str) -> None:
        if self.verbose and self.is_writer:
            print(message, flush=True)

    def _put(self, batch, plan: Plan):
        sharding = batch_sharding(plan, self.mesh)
        arrays = batch.as_dict()
        rows = arrays["inputs"].shape[0]
        per_process = rows // jax.process_count()
        lo = jax.process_index() * per_process
        return {k: jax.make_array_from_process_local_data(sharding, arrays[k][lo:lo + per_process],
                                                          (rows, arrays[k].shape[1]))
                for k in BATCH_KEYS}

    def _meta(self) -> dict:
        return {"model": dataclasses.asdict(self.config.model),
                "schedule_horizon": self.optimizer_horizon,
                "config": self.config.to_dict()}

    @property
    def optimizer_horizon(self) -> int:
        return self.config.optimizer.total_steps or self.config.train.steps

    def evaluate(self, params) -> Optional[float]:
        """Mean token loss over the fixed held-out batches."""
        total, count = 0.0, 0.0
        for plan_b in self.data.eval_plans():
            program = self.programs.get("eval", plan_b.bucket, plan_b.batch_size, self.plan_for(plan_b.bucket))
            loss_sum, n = jax.device_get(program(params, self._put(self.data.materialize(plan_b), program.plan)))
            total, count = total + float(loss_sum), count + float(n)
        return total / count if count else None

    # -- the loop ----------------------------------------------------------------------------
    def _restore_or_init(self, ckpt: Checkpointer, metrics: MetricsWriter):
        step = ckpt.latest_step()
        if step is None:
            return self.state_layout.init(self.config.train.seed), self.data.train_iterator(), 0
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
        self.interrupted = None
        self.log(describe_mesh(self.mesh))
        self.log(f"model: {count_params(self.state_layout.abstract['params']) / 1e6:.2f}M parameters, "
                 f"plan {self.plan.id}; {self.data.summary()}")
        metrics = MetricsWriter(self.workdir, enabled=self.is_writer, tensorboard=cfg.train.tensorboard)
        ckpt = Checkpointer(os.path.join(self.workdir, "checkpoints"), cfg.train.checkpoint_every,
                            cfg.train.keep_checkpoints, cfg.train.async_checkpoint)
        rows: list[dict] = []
        try:
            state, it, start = self._restore_or_init(ckpt, metrics)
            if start >= target:
                self.log(f"already at step {start} (target {target}): nothing to do")
                return rows
            with _stop_signals() as stop, _progress(self, start, target) as bar:
                for step in range(start + 1, target + 1):
                    plan_b = it.next_plan()
                    program = self.programs.get("train", plan_b.bucket, plan_b.batch_size,
                                                self.plan_for(plan_b.bucket))
                    batch = self._put(self.data.materialize(plan_b), program.plan)
                    t0 = time.perf_counter()
                    state, out = program(state, batch)
                    out = jax.device_get(out)
                    dt = time.perf_counter() - t0
                    row = {"step": step, "loss": float(out["loss"]), "tokens": int(plan_b.real_tokens),
                           "loss_tokens": int(out["loss_tokens"]), "bucket": plan_b.bucket,
                           "batch_size": plan_b.batch_size, "plan": program.plan.id,
                           "step_time_s": dt, "tokens_per_s": plan_b.real_tokens / dt if dt > 0 else 0.0,
                           "lr": float(out["lr"]), "grad_norm": float(out["grad_norm"]),
                           "bytes_per_device": program.bytes_per_device}
                    if not math.isfinite(row["loss"]):
                        raise FloatingPointError(f"non-finite loss at step {step} (bucket {plan_b.bucket})")
                    if step % cfg.train.eval_every == 0 and cfg.data.eval_batches > 0:
                        eval_loss = self.evaluate(state["params"])
                        if eval_loss is not None:
                            row["eval_loss"] = eval_loss
                    metrics.write(row)
                    rows.append(row)
                    bar.update(row)
                    if ckpt.should_save(step) or step == target or stop.signum is not None:
                        ckpt.save(step, state, it.state(), self._meta())
                    if stop.signum is not None:
                        self.interrupted = stop.signum
                        ckpt.wait()
                        self.log(f"stopped by {signal.Signals(stop.signum).name} at step {step}: "
                                 f"checkpoint saved in {ckpt.directory}")
                        break
            self.state = state
        finally:
            ckpt.close()
            metrics.close()
        return rows


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
    """A tqdm bar showing tokens/s, loss and bucket."""
    from tqdm.auto import tqdm

    enabled = trainer.verbose and trainer.is_writer and trainer.config.train.progress
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
