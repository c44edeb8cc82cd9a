"""Profiling on the current devices: time real layer programs, fit the device coefficients, cache them.

`profile(mesh, spec, lengths, ...)` compiles each strategy's layer step (`costmodel.probe`) at
each length, runs it a few times on the devices here and fits the time model's device rates
(matmul and attention FLOP/s, elementwise rate, memory bandwidth, per-collective-kind bandwidth
and latency, a per-layer overhead) by non-negative least squares on the measured step times; it
can also fit the memory model's per-strategy corrections against XLA's figures
(`costmodel.memory_fit.calibrate`). The result, a `Calibration`, is cached as JSON per device kind
and mesh shape in a directory (the trainer passes WORKDIR/costmodel):

    DIR/<device-kind>__<axis>=<size>_...json

On CPU all simulated devices share the machine's cores, so the fitted "device" is the machine
divided among them (`shared_compute=True`, no overlap of collectives): its coefficients predict
measured step times here, not those of an accelerator.
"""
from __future__ import annotations

import json
import os
import re
import statistics
import time as _time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from costmodel.memory import (STRATEGY_NAMES, LayerMemory, MemoryCoefficients, Shape, feasible_strategies,
                              layer_memory)
from costmodel.time import KINDS, TimeCoefficients, layer_time, layer_work
from sharding.ops.blocks import BlockSpec

FORMAT = 1


# ------------------------------------------------------------------------------------------------
# Calibration: fitted memory corrections + time coefficients
# ------------------------------------------------------------------------------------------------
@dataclass
class Calibration:
    """Fitted coefficients for one device kind and mesh shape."""

    device_kind: str
    mesh_shape: dict
    time: TimeCoefficients
    memory: MemoryCoefficients = field(default_factory=MemoryCoefficients)
    step_overhead_s: float = 0.0  # fixed seconds per step (dispatch), outside the layers
    meta: dict = field(default_factory=dict)  # what was profiled, fit residuals
    # measured / predicted layer time per strategy at profiled lengths: {strategy: [[s, factor], ...]}
    time_scale: dict = field(default_factory=dict)

    def time_coefficients(self) -> TimeCoefficients:
        return self.time

    def memory_coefficients(self) -> MemoryCoefficients:
        return self.memory

    def time_factor(self, strategy: str, seq_len: int) -> float:
        """The measured correction of a strategy's layer time at this length: interpolated in
        log length between the profiled lengths, held constant outside them (1: not profiled)."""
        points = self.time_scale.get(strategy)
        if not points:
            return 1.0
        xs = np.log2([float(x) for x, _ in points])
        ys = np.log([float(f) for _, f in points])
        return float(np.exp(np.interp(np.log2(float(seq_len)), xs, ys)))

    def correct_memory(self, strategy: str, remat: str, mem: LayerMemory, shape: Shape) -> LayerMemory:
        """The layer's memory with the fitted feature multipliers (the shipped ones for a strategy
        this calibration did not fit)."""
        return layer_memory(shape, strategy, remat, self.memory if self.memory.key(strategy, remat) else None)

    # -- JSON ------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"format": FORMAT, "device_kind": self.device_kind, "mesh_shape": dict(self.mesh_shape),
                "time": self.time.to_json(), "memory": self.memory.to_json(),
                "step_overhead_s": self.step_overhead_s, "meta": self.meta, "time_scale": self.time_scale}

    @classmethod
    def from_json(cls, d: Mapping) -> "Calibration":
        if d.get("format") != FORMAT:
            raise ValueError(f"calibration format {d.get('format')!r} is not {FORMAT}")
        return cls(device_kind=d["device_kind"], mesh_shape=dict(d["mesh_shape"]),
                   time=TimeCoefficients.from_json(d["time"]), memory=MemoryCoefficients.from_json(d["memory"]),
                   step_overhead_s=float(d.get("step_overhead_s", 0.0)), meta=dict(d.get("meta", {})),
                   time_scale={k: [list(p) for p in v] for k, v in d.get("time_scale", {}).items()})

    def save(self, directory: str) -> str:
        """Write to DIR/<device-kind>__<mesh>.json (atomically); returns the path."""
        os.makedirs(directory, exist_ok=True)
        path = cache_path(directory, self.device_kind, self.mesh_shape)
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(self.to_json(), fh, indent=1, sort_keys=True)
        os.replace(tmp, path)
        return path


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.\-]+", "-", str(text)).strip("-").lower() or "device"


def cache_path(directory: str, device_kind: str, mesh_shape: Mapping[str, int]) -> str:
    """Where the calibration of this device kind and mesh shape lives in `directory`."""
    mesh = "_".join(f"{_slug(a)}={int(n)}" for a, n in mesh_shape.items())
    return os.path.join(directory, f"{_slug(device_kind)}__{mesh}.json")


def load_calibration(directory: str, device_kind: str, mesh_shape: Mapping[str, int]) -> Optional[Calibration]:
    """The cached calibration for this device kind and mesh shape, or None."""
    path = cache_path(directory, device_kind, mesh_shape)
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        cal = Calibration.from_json(json.load(fh))
    if cal.device_kind != device_kind or dict(cal.mesh_shape) != dict(mesh_shape):
        return None
    return cal


DEFAULT_CALIBRATION = os.path.join(os.path.dirname(os.path.abspath(__file__)), "calibrations", "cpu.json")


def default_calibration() -> Calibration:
    """The shipped CPU calibration (benchmarks/fit_cpu_calibration.py: 8 simulated devices on a
    2-core machine), used when no calibration was fitted for the devices here."""
    with open(DEFAULT_CALIBRATION) as fh:
        return Calibration.from_json(json.load(fh))


def device_kind_of(mesh) -> str:
    d = mesh.devices.flat[0]
    return f"{d.platform}-{d.device_kind}"


# ------------------------------------------------------------------------------------------------
# Timing real programs
# ------------------------------------------------------------------------------------------------
def concrete_inputs(compiled, seed: int = 0):
    """Arrays matching a compiled layer step's inputs: small random weights and activations,
    segment ids 1 and positions arange (so causal tile skipping behaves as in training)."""
    import jax
    import jax.numpy as jnp
    (w_info, x_info, seg_info, pos_info), _ = compiled.args_info
    (w_sh, x_sh, seg_sh, pos_sh), _ = compiled.input_shardings
    rng = np.random.default_rng(seed)

    def put(info, sharding, scale=0.02):
        value = (rng.standard_normal(info.shape) * scale).astype(np.float32)
        return jax.device_put(jnp.asarray(value, dtype=info.dtype), sharding)

    w = {k: put(w_info[k], w_sh[k]) for k in w_info}
    x = put(x_info, x_sh, 1.0)
    b, s = seg_info.shape
    seg = jax.device_put(jnp.ones((b, s), jnp.int32), seg_sh)
    pos = jax.device_put(jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s)), pos_sh)
    return w, x, seg, pos


def time_compiled(compiled, repeats: int = 3, warmup: int = 1, args=None) -> dict:
    """Run a compiled program `warmup + repeats` times; {"median", "min", "runs"} in seconds."""
    import jax
    args = args if args is not None else concrete_inputs(compiled)
    for _ in range(warmup):
        jax.block_until_ready(compiled(*args))
    runs = []
    for _ in range(repeats):
        t0 = _time.perf_counter()
        jax.block_until_ready(compiled(*args))
        runs.append(_time.perf_counter() - t0)
    return {"median": statistics.median(runs), "min": min(runs), "runs": runs}


@dataclass
class TimeSample:
    """One measured layer step: shape, strategy/remat, n_layers, wall seconds (min and median of
    the runs) and the process CPU seconds of the fastest-CPU run (all threads: on a CPU whose
    cores the simulated devices share, the work done, which other tenants' load does not
    inflate as it inflates wall time)."""

    shape: Shape
    strategy: str
    remat: str
    n_layers: int
    seconds: float
    median: float = 0.0
    cpu_seconds: float = 0.0

    def to_json(self) -> dict:
        from dataclasses import asdict
        sh = self.shape
        return {"spec": asdict(sh.spec), "mesh": dict(sh.mesh_shape), "batch": sh.batch, "seq_len": sh.seq_len,
                "backend": sh.backend, "strategy": self.strategy, "remat": self.remat, "n_layers": self.n_layers,
                "seconds": self.seconds, "median": self.median, "cpu_seconds": self.cpu_seconds}

    @classmethod
    def from_json(cls, d: Mapping) -> "TimeSample":
        shape = Shape(BlockSpec(**d["spec"]), dict(d["mesh"]), d["batch"], d["seq_len"], backend=d.get("backend", "cpu"))
        return cls(shape, d["strategy"], d["remat"], d["n_layers"], d["seconds"], d.get("median", d["seconds"]),
                   d.get("cpu_seconds", 0.0))


def measure_times(mesh, spec: BlockSpec, batch: int, lengths: Sequence[int], strategies: Optional[Sequence[str]] = None,
                  remats: Sequence[str] = ("none",), n_layers: int = 2, repeats: int = 3,
                  progress: Optional[Callable] = None, min_round_s: float = 0.3) -> list[TimeSample]:
    """Compile each strategy x length x remat's n-layer step, then time them all on the devices
    here in interleaved rounds (every program in every round, `repeats` rounds after a warmup
    round; a program shorter than `min_round_s` runs up to 8 times per round), so that a change
    in machine load hits every program alike. Seconds = min of the runs, median kept too."""
    import jax

    from costmodel.probe import layer_step
    mesh_shape = dict(mesh.shape)
    programs = []
    for s in lengths:
        ok = set(feasible_strategies(spec, mesh_shape, batch, s, strategies or STRATEGY_NAMES))
        for strat in (strategies or STRATEGY_NAMES):
            if strat not in ok:
                continue
            for r in remats:
                c = layer_step(strat, spec, mesh, batch, s, n_layers=n_layers, remat=None if r == "none" else r)
                programs.append((s, strat, r, c, concrete_inputs(c)))
    runs: list[list[float]] = [[] for _ in programs]
    cpu: list[list[float]] = [[] for _ in programs]
    inner = [1] * len(programs)  # short programs run several times per round (more chances of a quiet moment)
    for round_ in range(repeats + 1):
        for i, (_, _, _, c, args) in enumerate(programs):
            for _ in range(inner[i]):
                t0, c0 = _time.perf_counter(), _time.process_time()
                jax.block_until_ready(c(*args))
                dt, dc = _time.perf_counter() - t0, _time.process_time() - c0
                if round_:
                    runs[i].append(dt)
                    cpu[i].append(dc)
            if not round_:
                inner[i] = int(min(8, max(1, min_round_s // max(dt, 1e-6))))
    out = []
    for (s, strat, r, _, _), times, cpus in zip(programs, runs, cpu):
        shape = Shape(spec, mesh_shape, batch, s, backend=mesh.devices.flat[0].platform)
        sample = TimeSample(shape, strat, r, n_layers, min(times), statistics.median(times), min(cpus))
        out.append(sample)
        if progress:
            progress(sample)
    return out


# ------------------------------------------------------------------------------------------------
# Fitting the time coefficients
# ------------------------------------------------------------------------------------------------
_COMPUTE = ("matmul", "attn", "elems", "act")


def time_features(shape: Shape, strategy: str, remat: str, shared_compute: bool = True) -> dict:
    """The time model's per-layer terms (FLOPs, elements, bytes, hops) that the rates divide."""
    w = layer_work(shape, strategy, remat)
    feats = {"matmul": w.matmul_flops,
             "attn": w.attn_flops_mean if shared_compute else w.attn_flops,
             "elems": w.score_elems_mean if shared_compute else w.score_elems,
             "act": w.act_bytes, "iters": w.iterations, "layer": 1.0}
    hops = 0.0
    for kind in KINDS:
        b, h = w.comm.get(kind, (0.0, 0.0))
        feats[f"bytes:{kind}"] = b
        hops += h
    ring_bytes = sum(st * b for st, b, _ in w.ring_steps)
    hops += sum(st for st, _, _ in w.ring_steps)
    feats["bytes:collective-permute"] += ring_bytes
    feats["hops"] = hops
    return feats


def wall_per_cpu(samples: Sequence[TimeSample]) -> float:
    """Median over samples of (min wall seconds / min process CPU seconds): how many seconds of
    wall time a CPU-second of this machine's work takes (< 1 when the cores run in parallel)."""
    ratios = [s.seconds / s.cpu_seconds for s in samples if s.cpu_seconds > 0]
    return float(np.median(ratios)) if ratios else 1.0


def step_seconds(samples: Sequence[TimeSample], use_cpu_time: bool) -> list[float]:
    """What the fit targets: the min wall time, or (shared CPU devices) the load-corrected wall
    time = process CPU seconds x the median wall-per-CPU ratio, robust to other tenants' load."""
    if not use_cpu_time:
        return [s.seconds for s in samples]
    ratio = wall_per_cpu(samples)
    return [s.cpu_seconds * ratio if s.cpu_seconds > 0 else s.seconds for s in samples]


def fit_time(samples: Sequence[TimeSample], name: str = "fitted", shared_compute: bool = True,
             overlap: bool = False, use_cpu_time: Optional[bool] = None) -> tuple[TimeCoefficients, float, dict]:
    """NNLS (in relative error) of measured seconds on n_layers x the per-layer terms + a step
    constant. Returns (coefficients, step overhead seconds, fit report). With shared CPU devices
    (default when every sample has CPU seconds) the target is the load-corrected wall time
    (`step_seconds`)."""
    from scipy.optimize import nnls
    if use_cpu_time is None:
        use_cpu_time = shared_compute and all(s.cpu_seconds > 0 for s in samples)
    names = list(time_features(samples[0].shape, samples[0].strategy, samples[0].remat, shared_compute)) + ["step"]
    rows, y = [], []
    targets = step_seconds(samples, use_cpu_time)
    for smp, target in zip(samples, targets):
        f = time_features(smp.shape, smp.strategy, smp.remat, shared_compute)
        rows.append([smp.n_layers * f[k] for k in names[:-1]] + [1.0])
        y.append(target)
    A, y = np.array(rows, dtype=float), np.array(y, dtype=float)
    scale = A.max(axis=0)
    scale[scale == 0] = 1.0
    An = A / scale / y[:, None]
    theta, _ = nnls(An, np.ones_like(y))
    theta = theta / scale
    pred = A @ theta
    err = np.abs(pred - y) / y
    th = dict(zip(names, theta))
    inv = lambda v: 1.0 / v if v > 0 else 1e30  # noqa: E731
    coeffs = TimeCoefficients(
        matmul_flops=inv(th["matmul"]), attn_flops=inv(th["attn"]), elem_rate=inv(th["elems"]),
        mem_bw=inv(th["act"]), bandwidth={k: inv(th[f"bytes:{k}"]) for k in KINDS},
        latency={k: th["hops"] for k in KINDS}, overlap=overlap, shared_compute=shared_compute,
        layer_overhead=th["layer"], iter_overhead=th["iters"], name=name)
    report = {"median_rel_err": float(np.median(err)), "max_rel_err": float(err.max()), "n_samples": len(y),
              "target": "cpu-corrected wall" if use_cpu_time else "min wall",
              "wall_per_cpu": wall_per_cpu(samples) if use_cpu_time else None,
              "theta": {k: float(v) for k, v in th.items()}}
    return coeffs, float(th["step"]), report


def predict_step_time(cal: Calibration, shape: Shape, strategy: str, remat: str, n_layers: int) -> float:
    """Predicted seconds of an n-layer `layer_step` (what `measure_times` times)."""
    return n_layers * layer_time(shape, strategy, remat, cal.time).total + cal.step_overhead_s


# ------------------------------------------------------------------------------------------------
# The profile step
# ------------------------------------------------------------------------------------------------
def profile(mesh, spec: BlockSpec, lengths: Sequence[int], batch: Optional[int] = None,
            strategies: Optional[Sequence[str]] = None, remats: Sequence[str] = ("none",),
            directory: Optional[str] = None, n_layers: int = 2, repeats: int = 3,
            memory: bool = False, memory_lengths: Optional[Sequence[int]] = None, reuse: bool = True,
            progress: Optional[Callable] = None) -> Calibration:
    """Time real layer programs on `mesh`'s devices and fit a `Calibration` (cached in `directory`).

    With `reuse` and a cached calibration for this device kind and mesh shape, that one is
    returned without running anything. `memory=True` also fits the memory corrections against
    XLA's figures at `memory_lengths` (default `lengths`).

    The fitted rates are the device's, shared by every strategy's prediction. On CPU the default
    strategies leave out `metp`: XLA:CPU can deadlock on its programs (the 8 simulated devices
    start its independent psum and ppermute in different orders and the runtime aborts the
    process after 40 s); compiling them (memory) is safe."""
    mesh_shape = {a: int(n) for a, n in mesh.shape.items()}
    kind = device_kind_of(mesh)
    if directory and reuse:
        cached = load_calibration(directory, kind, mesh_shape)
        if cached is not None:
            return cached
    batch = batch or int(np.prod(list(mesh_shape.values())))
    platform = mesh.devices.flat[0].platform
    shared = platform == "cpu"
    if strategies is None and shared:
        strategies = tuple(s for s in STRATEGY_NAMES if s != "metp")
    samples = measure_times(mesh, spec, batch, lengths, strategies, remats, n_layers, repeats, progress)
    coeffs, step, report = fit_time(samples, name=kind, shared_compute=shared, overlap=not shared)
    mem = MemoryCoefficients()
    if memory:
        from costmodel.memory_fit import calibrate
        mem, _ = calibrate(mesh, spec, batch, memory_lengths or lengths, strategies, remats)
    cal = Calibration(device_kind=kind, mesh_shape=mesh_shape, time=coeffs, memory=mem, step_overhead_s=step,
                      meta={"lengths": list(lengths), "batch": batch, "strategies": list(strategies or STRATEGY_NAMES),
                            "remats": list(remats), "n_layers": n_layers, "fit": report,
                            "samples": [s.to_json() for s in samples], "created": _time.time()})
    if directory:
        cal.save(directory)
    return cal


def calibrate_memory_for(mesh, spec: BlockSpec, shapes: Sequence[tuple[int, int]], directory: Optional[str] = None,
                         remats: Sequence[str] = ("none", "full"), progress: Optional[Callable] = None
                         ) -> MemoryCoefficients:
    """Memory corrections for this model's layer on the devices here: XLA's figures of every
    feasible strategy at these (batch, seq_len) shapes, fitted from the shipped coefficients
    (which keep what the samples cannot determine). The samples are cached in `directory` per
    device kind, mesh, layer shape and sampled shapes, so a rerun compiles nothing."""
    from costmodel.memory import default_coefficients
    from costmodel.memory_fit import Sample, fit_coefficients, measure_samples

    def measure():
        samples = []
        for batch, seq_len in sorted(set(shapes)):
            samples += measure_samples(STRATEGY_NAMES, spec, mesh, batch, [seq_len], remats, progress)
        return [smp.to_json() for smp in samples]

    path = _model_cache_path(directory, "memory", mesh, spec, shapes, remats)
    samples = [Sample.from_json(d) for d in _cached_json(path, measure)]
    return fit_coefficients(samples, prior=0.05, start=default_coefficients(), per_remat=True)


def calibrate_time_for(cal: Calibration, mesh, spec: BlockSpec, shapes: Sequence[tuple[int, int]],
                       directory: Optional[str] = None, repeats: int = 2,
                       progress: Optional[Callable] = None) -> Calibration:
    """`cal` with each strategy's layer time scaled to what the devices here measure for this
    model: every feasible strategy's 2-layer step (remat none) timed at these (batch, seq_len)
    shapes (`measure_times`, interleaved rounds), factor = measured / `cal`'s prediction. Between
    and beyond the profiled lengths `Calibration.time_factor` interpolates. The factors are
    cached in `directory` per device kind, mesh, layer shape and sampled shapes."""
    def measure():
        factors: dict = {}
        for batch, seq_len in sorted(set(shapes)):
            samples = measure_times(mesh, spec, batch, [seq_len], STRATEGY_NAMES, ("none",), 2, repeats, progress)
            for smp in samples:
                predicted = predict_step_time(cal, smp.shape, smp.strategy, smp.remat, smp.n_layers)
                factors.setdefault(smp.strategy, []).append([seq_len, smp.seconds / predicted])
        return factors

    path = _model_cache_path(directory, "time", mesh, spec, shapes, ("none",))
    return replace(cal, time_scale={k: sorted(v) for k, v in _cached_json(path, measure).items()})


def _model_cache_path(directory: Optional[str], what: str, mesh, spec: BlockSpec, shapes, remats) -> Optional[str]:
    """Where a per-model fit's samples live: per device kind, mesh, layer shape, shapes, remats."""
    import hashlib
    from dataclasses import asdict
    if not directory:
        return None
    mesh_shape = {a: int(n) for a, n in mesh.shape.items()}
    key = json.dumps([asdict(spec), sorted(mesh_shape.items()), sorted(shapes), list(remats)], sort_keys=True)
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    return cache_path(directory, device_kind_of(mesh), mesh_shape).replace(".json", f"__{what}-{digest}.json")


def _cached_json(path: Optional[str], compute: Callable):
    """The JSON at `path`, else `compute()` written there atomically (no path: just computed)."""
    if path and os.path.exists(path):
        with open(path) as fh:
            return json.load(fh)
    data = compute()
    if path:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as fh:
            json.dump(data, fh)
        os.replace(path + ".tmp", path)
    return data


def with_memory(cal: Calibration, coefficients: MemoryCoefficients) -> Calibration:
    """A copy of `cal` with these memory corrections."""
    return replace(cal, memory=coefficients)
