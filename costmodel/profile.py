"""Profiling on the current devices: time real layer programs, fit the cost model, cache the fits.

`profile(mesh, spec, lengths, ...)` compiles each strategy's layer step (`costmodel.probe`) at
each length, runs it a few times on the devices here and fits the time model's device rates
(matmul and attention FLOP/s, elementwise rate, memory bandwidth, per-collective-kind bandwidth
and latency, a per-layer overhead) by non-negative least squares on the measured step times; it
can also fit the memory model's per-strategy corrections against XLA's figures
(`costmodel.memory_fit.calibrate`). The result is a `costmodel.calibration.Calibration`.

For one model, `calibrate_memory_for` fits the memory corrections of its layer to XLA, and
`calibrate_time_for` measures its layer per option (strategy x remat policy) at a few shapes
(`costmodel.time_correction`); both cache their samples per model in a directory.

On CPU all simulated devices share the machine's cores, so the fitted "device" is the machine
divided among them (`shared_compute=True`, no overlap of collectives): its coefficients predict
measured step times here, not those of an accelerator.
"""
from __future__ import annotations

import json
import os
import statistics
import time as _time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from costmodel.calibration import Calibration, cache_path, device_kind_of, load_calibration
from costmodel.memory import MemoryCoefficients, Shape, feasible_strategies, strategy_names
from costmodel.time import KINDS, TimeCoefficients, layer_time, layer_work
from costmodel.time_correction import OptionTimes, label_of
from sharding.ops.blocks import BlockSpec
from sharding.remat import NAMES as REMAT_NAMES


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
                  progress: Optional[Callable] = None, min_round_s: float = 0.3,
                  options: Optional[Sequence[tuple[str, str]]] = None) -> list[TimeSample]:
    """Compile each strategy x length x remat's n-layer step (or each (strategy, remat) of
    `options`; a few at once, `costmodel.probe.map_compiling`), then time them all on the
    devices here in interleaved rounds (every program in every round, `repeats` rounds after a
    warmup round; a program shorter than `min_round_s` runs up to 8 times per round), so that a
    change in machine load hits every program alike. Seconds = min of the runs, median kept too.
    Strategies that cannot serve a shape are skipped."""
    import jax

    from costmodel.probe import layer_step, map_compiling
    mesh_shape = dict(mesh.shape)
    if options is None:
        options = [(strat, r) for strat in (strategies or strategy_names()) for r in remats]
    names = list(dict.fromkeys(o[0] for o in options))
    feasible = {s: set(feasible_strategies(spec, mesh_shape, batch, s, names)) for s in lengths}
    jobs = [(s, strat, r) for s in lengths for strat, r in options if strat in feasible[s]]
    compiled = map_compiling(lambda job: layer_step(job[1], spec, mesh, batch, job[0], n_layers=n_layers,
                                                    remat=None if job[2] == "none" else job[2]), jobs)
    programs = [(s, strat, r, c, concrete_inputs(c)) for (s, strat, r), c in zip(jobs, compiled)]
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
             overlap: bool = False, use_cpu_time: Optional[bool] = None,
             prior: Optional[TimeCoefficients] = None) -> tuple[TimeCoefficients, float, dict]:
    """NNLS (in relative error) of measured seconds on n_layers x the per-layer terms + a step
    constant. Returns (coefficients, step overhead seconds, fit report). With shared CPU devices
    (default when every sample has CPU seconds) the target is the load-corrected wall time
    (`step_seconds`), and the collective kinds share one per-byte cost (on CPU every collective
    is a copy between threads).

    A term the samples exercise but the fit leaves at zero cost is not determined by them (its
    effect is absorbed by the others): the report lists it under "undetermined", and it keeps
    the `prior`'s value (a collective kind without a prior: the median of the determined kinds)
    instead of being priced as free. A term no sample exercises is listed under "unused"."""
    from scipy.optimize import nnls
    if use_cpu_time is None:
        use_cpu_time = shared_compute and all(s.cpu_seconds > 0 for s in samples)
    tie = shared_compute

    def feats(smp):
        f = time_features(smp.shape, smp.strategy, smp.remat, shared_compute)
        if tie:
            f["bytes:collective"] = sum(f.pop(f"bytes:{k}") for k in KINDS)
        return f

    names = list(feats(samples[0])) + ["step"]
    rows = [[smp.n_layers * feats(smp)[k] for k in names[:-1]] + [1.0] for smp in samples]
    A, y = np.array(rows, dtype=float), np.array(step_seconds(samples, use_cpu_time), dtype=float)

    def solve(fixed: dict) -> np.ndarray:
        """NNLS in relative error with the `fixed` terms' costs given (subtracted from y)."""
        free = [i for i, k in enumerate(names) if k not in fixed]
        known = sum((A[:, names.index(k)] * v for k, v in fixed.items()), np.zeros_like(y))
        scale = A[:, free].max(axis=0)
        scale[scale == 0] = 1.0
        sol, _ = nnls(A[:, free] / scale / y[:, None], 1 - known / y)
        theta = np.zeros(len(names))
        theta[free] = sol / scale
        for k, v in fixed.items():
            theta[names.index(k)] = v
        return theta

    theta = solve({})
    used = {k for k, col in zip(names, A.T) if np.any(col > 0)}
    undetermined = sorted(k for k in used if theta[names.index(k)] <= 0 and k not in ("step", "layer"))
    unused = sorted(set(names) - used)
    fixed = {k: v for k in undetermined if (v := _prior_cost(prior, k)) is not None}
    if fixed:  # the terms keep the prior's cost and the others are fitted around them
        theta = solve(fixed)
    pred = A @ theta
    err = np.abs(pred - y) / y
    th = dict(zip(names, theta))
    per_byte = {k: th["bytes:collective"] if tie else th[f"bytes:{k}"] for k in KINDS}
    determined = [v for v in per_byte.values() if v > 0]
    inv = lambda v: 1.0 / v if v > 0 else 1e30  # noqa: E731
    coeffs = TimeCoefficients(
        matmul_flops=inv(th["matmul"]), attn_flops=inv(th["attn"]), elem_rate=inv(th["elems"]),
        mem_bw=inv(th["act"]),
        bandwidth={k: inv(v if v > 0 or not determined else float(np.median(determined))) for k, v in per_byte.items()},
        latency={k: th["hops"] for k in KINDS}, overlap=overlap, shared_compute=shared_compute,
        layer_overhead=th["layer"], iter_overhead=th["iters"], name=name)
    report = {"median_rel_err": float(np.median(err)), "max_rel_err": float(err.max()), "n_samples": len(y),
              "target": "cpu-corrected wall" if use_cpu_time else "min wall",
              "wall_per_cpu": wall_per_cpu(samples) if use_cpu_time else None,
              "theta": {k: float(v) for k, v in th.items()}, "undetermined": undetermined, "unused": unused,
              "kept_from_prior": sorted(fixed)}
    return coeffs, float(th["step"]), report


def _prior_cost(prior: Optional[TimeCoefficients], term: str) -> Optional[float]:
    """The cost per unit of a fit term under the prior's rates (None without a prior)."""
    if prior is None:
        return None
    rates = {"matmul": prior.matmul_flops, "attn": prior.attn_flops, "elems": prior.elem_rate, "act": prior.mem_bw}
    if term in rates:
        return 1.0 / rates[term]
    if term.startswith("bytes:"):
        kind = term.split(":", 1)[1]
        kinds = KINDS if kind == "collective" else [kind]
        return float(np.median([1.0 / prior.bw(k) for k in kinds]))
    return {"hops": prior.lat("collective-permute"), "iters": prior.iter_overhead}.get(term)


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
            progress: Optional[Callable] = None, prior: Optional[TimeCoefficients] = None,
            more_shapes: Sequence[tuple[int, int]] = ()) -> Calibration:
    """Time real layer programs on `mesh`'s devices and fit a `Calibration` (cached in `directory`).

    Programs run at every length of `lengths` with `batch` rows, and at each (batch, seq_len) of
    `more_shapes`: a few long rows at the same tokens tell the attention kernel's per-tile loop
    overhead from its FLOPs (at a fixed batch both grow as the length squared).

    With `reuse` and a cached calibration for this device kind and mesh shape, that one is
    returned without running anything. `memory=True` also fits the memory corrections against
    XLA's figures at `memory_lengths` (default `lengths`).

    The fitted rates are the device's, shared by every strategy's prediction; terms the samples
    cannot determine keep the `prior`'s rates (`fit_time`)."""
    mesh_shape = {a: int(n) for a, n in mesh.shape.items()}
    kind = device_kind_of(mesh)
    if directory and reuse:
        cached = load_calibration(directory, kind, mesh_shape)
        if cached is not None:
            return cached
    batch = batch or int(np.prod(list(mesh_shape.values())))
    platform = mesh.devices.flat[0].platform
    shared = platform == "cpu"
    samples = measure_times(mesh, spec, batch, lengths, strategies, remats, n_layers, repeats, progress)
    for rows, seq_len in more_shapes:
        samples += measure_times(mesh, spec, rows, [seq_len], strategies, remats, n_layers, repeats, progress)
    if prior is None and shared:
        from costmodel.calibration import default_calibration
        prior = default_calibration().time
    coeffs, step, report = fit_time(samples, name=kind, shared_compute=shared, overlap=not shared, prior=prior)
    mem = MemoryCoefficients()
    if memory:
        from costmodel.memory_fit import calibrate
        mem, _ = calibrate(mesh, spec, batch, memory_lengths or lengths, strategies, remats)
    cal = Calibration(device_kind=kind, mesh_shape=mesh_shape, time=coeffs, memory=mem, step_overhead_s=step,
                      meta={"lengths": list(lengths), "batch": batch, "more_shapes": [list(bs) for bs in more_shapes], "strategies": list(strategies or strategy_names()),
                            "remats": list(remats), "n_layers": n_layers, "fit": report,
                            "samples": [s.to_json() for s in samples], "created": _time.time()})
    if directory:
        cal.save(directory)
    return cal


def calibration_jobs(spec: BlockSpec, mesh_shape: Mapping[str, int], shapes: Sequence[tuple[int, int]],
                     names: Optional[Sequence[str]] = None) -> dict[tuple[int, int], list[str]]:
    """Where to measure each strategy: at the shortest and the longest of these (batch, seq_len)
    shapes that it can serve (e.g. batch-parallel strategies stop where a batch has fewer rows
    than devices), so every strategy is fitted at two lengths where it can run."""
    jobs: dict[tuple[int, int], list[str]] = {}
    ordered = sorted(set(shapes), key=lambda bs: (bs[1], bs[0]))
    for name in (names or strategy_names()):
        can = [bs for bs in ordered if feasible_strategies(spec, mesh_shape, bs[0], bs[1], [name])]
        for bs in dict.fromkeys(can[:1] + can[-1:]):
            jobs.setdefault(bs, []).append(name)
    return jobs


def calibrate_memory_for(mesh, spec: BlockSpec, jobs: Mapping[tuple[int, int], Sequence[str]],
                         directory: Optional[str] = None, remats: Sequence[str] = REMAT_NAMES,
                         progress: Optional[Callable] = None) -> MemoryCoefficients:
    """Memory corrections for this model's layer on the devices here: XLA's figures of each
    strategy of `jobs` at its (batch, seq_len) shape under every remat policy, fitted from the
    shipped coefficients (which keep what the samples cannot determine). Samples are cached in
    `directory` per device kind, mesh and layer shape; only samples not cached are compiled."""
    from costmodel.memory import default_coefficients
    from costmodel.memory_fit import Sample, fit_coefficients, measure_samples
    path = _model_cache_path(directory, "memory-samples", mesh, spec, [], [])
    cache = _read_json(path) or {}
    key = lambda b, s, strat, r: f"{b}|{s}|{label_of(strat, r)}"  # noqa: E731
    samples = []
    for (batch, seq_len), names in sorted(jobs.items()):
        todo = [n for n in names if any(key(batch, seq_len, n, r) not in cache for r in remats)]
        if todo:
            for smp in measure_samples(todo, spec, mesh, batch, [seq_len], remats, progress):
                cache[key(batch, seq_len, smp.strategy, smp.remat)] = smp.to_json()
            for n in todo:
                for r in remats:
                    cache.setdefault(key(batch, seq_len, n, r), None)  # the strategy cannot serve the shape
            _write_json(path, cache)
        samples += [Sample.from_json(d) for n in names for r in remats if (d := cache.get(key(batch, seq_len, n, r)))]
    return fit_coefficients(samples, prior=0.05, start=default_coefficients(), per_remat=True)


def calibrate_time_for(cal: Calibration, mesh, spec: BlockSpec, jobs: Mapping[tuple[int, int], Sequence[tuple[str, str]]],
                       directory: Optional[str] = None, repeats: int = 2,
                       progress: Optional[Callable] = None) -> Calibration:
    """`cal` with this model's layer times measured on the devices here: for each (batch,
    seq_len) of `jobs`, each of its (strategy, remat) options' 2-layer step is timed
    (`measure_times`, interleaved rounds); seconds per layer become the calibration's
    `OptionTimes`, which correct the time model per option (`costmodel.time_correction`).
    Measured points are cached in `directory` per device kind, mesh and layer shape, and only
    points not cached yet are measured."""
    from dataclasses import asdict
    path = _model_cache_path(directory, "layer-times", mesh, spec, [], [])
    cache = _read_json(path) or {}
    key = lambda b, s, strat, r: f"{b}|{s}|{label_of(strat, r)}"  # noqa: E731
    for (batch, seq_len), options in sorted(jobs.items()):
        todo = [o for o in options if key(batch, seq_len, *o) not in cache]
        if not todo:
            continue
        for smp in measure_times(mesh, spec, batch, [seq_len], options=todo, n_layers=2, repeats=repeats,
                                 progress=progress):
            cache[key(batch, seq_len, smp.strategy, smp.remat)] = max(smp.seconds - cal.step_overhead_s, 1e-9) / 2
        for o in todo:  # options the strategy cannot serve at this shape: remembered as such
            cache.setdefault(key(batch, seq_len, *o), None)
        _write_json(path, cache)
    points: dict = {}
    for (batch, seq_len), options in sorted(jobs.items()):
        for strat, r in options:
            seconds = cache.get(key(batch, seq_len, strat, r))
            if seconds is not None:
                points.setdefault(label_of(strat, r), []).append([batch, seq_len, seconds])
    return cal.with_layer_times(OptionTimes(asdict(spec), points))


def _model_cache_path(directory: Optional[str], what: str, mesh, spec: BlockSpec, shapes, remats) -> Optional[str]:
    """Where a per-model fit's samples live: per device kind, mesh, layer shape, shapes, remats
    and `code_version` (a cache in a shared folder is never read by other code); measured times
    also per runtime setting (XLA_FLAGS, NPROC: the threads of XLA:CPU's pools
    change step times, and a headline run once priced plans with times measured before such a
    change)."""
    import hashlib
    from dataclasses import asdict
    if not directory:
        return None
    mesh_shape = {a: int(n) for a, n in mesh.shape.items()}
    parts = [asdict(spec), sorted(mesh_shape.items()), sorted(shapes), list(remats), code_version()]
    if what == "layer-times":
        parts.append([os.environ.get("XLA_FLAGS", ""), os.environ.get("NPROC", "")])
    key = json.dumps(parts, sort_keys=True)
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    return cache_path(directory, device_kind_of(mesh), mesh_shape).replace(".json", f"__{what}-{digest}.json")


# The costmodel modules that build, compile and measure the calibration programs; the rest of
# `costmodel` (fits, tables, search) only reads the samples, so editing it keeps them valid.
MEASURING_MODULES = ("probe.py", "hlo.py", "memory_fit.py", "profile.py")


def measured_sources() -> list[str]:
    """The source files a cached sample depends on: the `sharding` package (the programs) and
    `MEASURING_MODULES` (how they are built and measured), in a fixed order."""
    import sharding
    root = os.path.dirname(sharding.__file__)
    files = [os.path.join(r, name) for r, _, names in sorted(os.walk(root)) for name in sorted(names)
             if name.endswith(".py")]
    here = os.path.dirname(os.path.abspath(__file__))
    return files + [os.path.join(here, name) for name in MEASURING_MODULES]


def code_version() -> list[str]:
    """What the cached samples depend on besides the model: JAX's and jaxlib's versions and a
    digest of `measured_sources()` (computed once per process)."""
    global _code_version
    if _code_version is None:
        import hashlib

        import jax
        import jaxlib
        digest = hashlib.sha1()
        for path in measured_sources():
            with open(path, "rb") as fh:
                digest.update(os.path.basename(path).encode() + fh.read())
        _code_version = [jax.__version__, jaxlib.__version__, digest.hexdigest()[:12]]
    return _code_version


_code_version: Optional[list[str]] = None


def _read_json(path: Optional[str]):
    if path and os.path.exists(path):
        with open(path) as fh:
            return json.load(fh)
    return None


def _write_json(path: Optional[str], data) -> None:
    """Write atomically (nothing without a path)."""
    if path:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as fh:
            json.dump(data, fh)
        os.replace(path + ".tmp", path)


def _cached_json(path: Optional[str], compute: Callable):
    """The JSON at `path`, else `compute()` written there (no path: just computed)."""
    data = _read_json(path)
    if data is None:
        data = compute()
        _write_json(path, data)
    return data
