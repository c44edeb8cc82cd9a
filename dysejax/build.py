"""`build(config)`: the mesh, data, planner and program cache of one config.

The order is the path of a batch: the mesh over every device (with a `stage` axis for a
pipeline), the data (buckets, batch sizes, epoch order), the state in its storage layout, the
planner (candidate plans per bucket, checked against each bucket's shape; `auto` prices them
with the cost model), and the cache the per-(bucket, plan) programs are compiled into. A bad
input found on the way is a UserError that leaves no folder behind that was not there before.
"""
from __future__ import annotations

import dataclasses
import math
import os
import shutil
from dataclasses import dataclass
from typing import Callable, Optional

import jax
from jax.sharding import Mesh

from dysejax import runtime
from dysejax.config import Config, ModelConfig
from dysejax.data import DataPipeline
from dysejax.errors import ConfigError, UserError
from dysejax.model.transformer import Transformer, block_spec
from dysejax.optim import Optimizer, build_optimizer, schedule_horizon
from dysejax.planner import Planner
from dysejax.programs import ProgramCache
from dysejax.state import StateLayout
from dysejax.step import make_eval_step, make_train_step
from sharding.layout import StorageLayout
from sharding.mesh import MeshError, build_mesh, with_stage_axis
from sharding.pipeline import Pipeline


@dataclass
class Setup:
    """What `build` gives: everything warmup and the training loop use."""

    config: Config
    workdir: str  # absolute
    new_workdir: bool  # it did not exist before: a run that cannot start removes it again
    log: Callable[[str], None]  # prints on process 0 when verbose
    mesh: Mesh
    pipeline: Optional[Pipeline]  # None with one stage
    data: DataPipeline
    budget: Optional[int]  # bytes per device a program may need here; None: unlimited
    planner: Planner
    model: Transformer
    optimizer: Optimizer
    state_layout: StateLayout
    programs: ProgramCache
    compile_cache_dir: Optional[str]  # the persistent compile cache (None: off)
    compile_cache_off: Optional[str] = None  # why it is off although configured on


def default_workdir(config_path: Optional[str]) -> str:
    """`runs/<config file stem>` (or `runs/default`)."""
    stem = os.path.splitext(os.path.basename(config_path))[0] if config_path else "default"
    return os.path.join("runs", stem)


def with_attention_kernel(config: Config, platform: str) -> ModelConfig:
    """`config.model` with `attention: auto` resolved for `platform`: on a GPU cuDNN's fused kernel
    for rows of one document in bfloat16/float16 (data.pack false), Pallas's (segment ids) for
    packed rows; elsewhere auto stays (dense up to attention_block, blockwise above). Checkpoints
    keep the config as written, so a run moves between CPU and GPU."""
    m = config.model
    if m.attention != "auto" or platform != "gpu":
        return m
    unpacked_half = not config.data.pack and m.compute_dtype != "float32"
    return dataclasses.replace(m, attention="cudnn" if unpacked_half else "pallas")


def build(config: Config, workdir: Optional[str] = None, verbose: bool = True) -> Setup:
    """The mesh, data, planner and program cache of `config`, run in `workdir` (default
    config.workdir, else runs/default). Raises UserError (one line) for a bad input."""
    runtime.configure_host_devices(config.parallel.cpu_devices)  # before JAX's backend starts
    workdir = os.path.abspath(workdir or config.workdir or default_workdir(None))
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise ConfigError(f"--workdir {workdir!r} is a file: name a folder (created if missing)")
    new_workdir = not os.path.exists(workdir)
    writer = jax.process_index() == 0

    def log(message: str) -> None:
        if verbose and writer:
            print(message, flush=True)

    pp = config.parallel.pipeline
    try:
        mesh = build_mesh(with_stage_axis(config.parallel.mesh, pp.stages, jax.device_count()))
    except MeshError as e:
        raise ConfigError(str(e)) from None
    pipeline = None if pp.stages == 1 else Pipeline(pp.stages, pp.microbatches, pp.schedule, tuple(pp.partition or ()))
    model_config = with_attention_kernel(config, mesh.devices.flat[0].platform)
    spec = block_spec(model_config)
    optimizer = build_optimizer(config.optimizer, config.train.steps)
    # a bad input found from here on leaves no folder behind that was not there before
    created = next((d for d in (workdir, os.path.join(workdir, "data")) if not os.path.exists(d)), None)
    try:
        data = open_data(config, workdir, mesh.devices.size, pipeline, log)
        budget = runtime.memory_budget_bytes(config.parallel.memory_budget_gb, config.parallel.memory_headroom)
        state_layout = StateLayout(config.model, optimizer, StorageLayout(mesh))
        planner = Planner(config, mesh, spec, pipeline, data, budget, state_layout.bytes_per_device(),
                          config.parallel.costmodel_dir or runtime.user_cache_dir("costmodel"), log,
                          show_progress=verbose and writer)
    except UserError:
        if created is not None and writer:
            shutil.rmtree(created, ignore_errors=True)
        raise
    compile_cache_dir = compile_cache_off = None
    if config.train.compile_cache:  # on after planning: the cost model's calibration programs stay out
        compile_cache_dir = config.train.compile_cache_dir or os.path.join(workdir, "compile_cache")
        compile_cache_off = runtime.enable_compilation_cache(compile_cache_dir)
        if compile_cache_off:
            log(f"compile cache: off ({compile_cache_off})")
            compile_cache_dir = None
    model = Transformer(model_config)
    skip_nonfinite = config.train.nonfinite == "skip"
    programs = ProgramCache(
        mesh, state_layout.abstract, state_layout.shardings,
        make_train=lambda plan: make_train_step(model, optimizer, plan, mesh, config.train.grad_accum,
                                                skip_nonfinite=skip_nonfinite, pipeline=pipeline),
        make_eval=lambda plan: make_eval_step(model, plan, mesh, pipeline))
    # an input of every train program, so a new --steps or optimizer.total_steps compiles nothing
    programs.horizon = schedule_horizon(config.optimizer, config.train.steps)
    check_same_on_every_process(config, data, planner)
    return Setup(config, workdir, new_workdir, log, mesh, pipeline, data, budget, planner, model, optimizer,
                 state_layout, programs, compile_cache_dir, compile_cache_off)


def open_data(config: Config, workdir: str, n_devices: int, pipeline: Optional[Pipeline], log) -> DataPipeline:
    """The data pipeline; a trained BPE and token caches go to WORKDIR/data. Batch sizes are
    multiples of every device (and of every micro-batch of a pipeline stage) x grad_accum."""
    accum = config.train.grad_accum
    multiple = n_devices if pipeline is None else math.lcm(n_devices, pipeline.batch_multiple(n_devices))
    data = DataPipeline(config.data, seed=config.train.seed, batch_multiple=multiple * accum,
                        batch_unit=accum if pipeline is None else None,
                        cache_dir=os.path.join(workdir, "data"), vocab_size=config.model.vocab_size, log=log)
    tok = data.tokenizer
    if tok.vocab_size > config.model.vocab_size:
        raise ConfigError(f"model.vocab_size ({config.model.vocab_size}) is smaller than the {tok.vocab_size} "
                          f"tokens of data.tokenizer {config.data.tokenizer!r}: set model.vocab_size to at "
                          f"least {tok.vocab_size}")
    return data


def check_same_on_every_process(config: Config, data: DataPipeline, planner: Planner) -> None:
    """Every process picks each step's bucket and program from these facts: raise ConfigError
    unless all agree (nothing to check with one process)."""
    if jax.process_count() == 1:
        return
    facts = {"config": config.to_dict(), "data": data.report,
             "epoch0": [(p.bucket, p.batch_size, p.real_tokens) for p in data.epoch_plans(0)],
             "plans": [[p.id for p in planner.candidates(b)] for b in data.buckets]}
    differ = runtime.disagreeing_processes(facts)
    if differ:
        raise ConfigError(f"process(es) {', '.join(map(str, differ))} derived another config, data or plan "
                          "table than process 0: give every process the same config, --set values and data")
