"""XLA's per-device figures of a layer as ground truth, and the fit of `costmodel.memory`'s
feature multipliers to them (non-negative least squares, per strategy and remat policy).

A layer stack compiled with n = 2 and n = 3 layers under `lax.scan` gives the per-layer stored
bytes (the slope in n) and the layer's transient (the intercept)."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Mapping, Optional, Sequence

import numpy as np

from costmodel.memory import (ANALYTICAL, LOSS_FEATURES, PEAK_FEATURES, STORED_FEATURES, MemoryCoefficients, Shape,
                              analytical_features, default_coefficients, embedding_elems, feasible_strategies,
                              layer_memory, loss_features, plan_layer_bytes, strategy_names)
from sharding.ops.blocks import BlockSpec

def measure_layer(strategy: str, spec: BlockSpec, mesh, batch: int, seq_len: int, remat: str = "none",
                  layers: tuple[int, int] = (2, 3), param_dtype=None) -> dict:
    """XLA's per-device figures for a layer: compiles `layers` = (n1, n2) stacks under `lax.scan`
    (n1 >= 2: a length-1 scan is unrolled by XLA and is not representative) and returns
    {"stored": temp slope per layer, "peak": temp intercept (the layer's transient),
     "params": argument+output slope per layer (weights + grads), "total": {n: bytes}, "flops": ...}."""
    import jax.numpy as jnp

    from costmodel.probe import figures, layer_step
    n1, n2 = layers
    figs = {}
    for n in (n1, n2):
        c = layer_step(strategy, spec, mesh, batch, seq_len, n_layers=n, remat=None if remat == "none" else remat,
                       param_dtype=param_dtype or jnp.float32, figures_only=True)
        figs[n] = figures(c)
    t1, t2 = figs[n1]["temp"], figs[n2]["temp"]
    slope = (t2 - t1) / (n2 - n1)
    io1 = figs[n1]["argument"] + figs[n1]["output"]
    io2 = figs[n2]["argument"] + figs[n2]["output"]
    io_slope = (io2 - io1) / (n2 - n1)
    return {"stored": slope, "peak": t1 - n1 * slope, "params": io_slope, "io0": io1 - n1 * io_slope,
            "total": {n: figs[n]["total"] for n in figs}, "flops": {n: figs[n]["flops"] for n in figs},
            "collectives": {n: figs[n]["collectives"] for n in figs}}


@dataclass
class Sample:
    """One calibration point: a shape, a strategy/remat and XLA's measured stored/peak bytes."""

    shape: Shape
    strategy: str
    remat: str
    stored: float
    peak: float
    total: dict = field(default_factory=dict)  # {n_layers: XLA total bytes}

    def to_json(self) -> dict:
        sh = self.shape
        return {"spec": asdict(sh.spec), "mesh": dict(sh.mesh_shape), "batch": sh.batch, "seq_len": sh.seq_len,
                "param_bytes": sh.param_bytes, "backend": sh.backend, "strategy": self.strategy, "remat": self.remat,
                "stored": self.stored, "peak": self.peak, "total": {str(k): v for k, v in self.total.items()}}

    @classmethod
    def from_json(cls, d: Mapping) -> "Sample":
        shape = Shape(BlockSpec(**d["spec"]), dict(d["mesh"]), d["batch"], d["seq_len"], d.get("param_bytes", 4),
                      backend=d.get("backend", "cpu"))
        return cls(shape, d["strategy"], d["remat"], d["stored"], d["peak"],
                   {int(k): v for k, v in d.get("total", {}).items()})


def measure_samples(strategies: Sequence[str], spec: BlockSpec, mesh, batch: int, lengths: Sequence[int],
                    remats: Sequence[str] = ("none",), progress=None) -> list[Sample]:
    """XLA samples for every strategy x length x remat (skipping what a strategy cannot serve),
    a few compiled at once (`costmodel.probe.map_compiling`)."""
    from costmodel.probe import map_compiling
    mesh_shape = dict(mesh.shape)
    backend = mesh.devices.flat[0].platform
    feasible = {s: set(feasible_strategies(spec, mesh_shape, batch, s, strategies)) for s in lengths}
    jobs = [(s, strat, r) for s in lengths for strat in strategies if strat in feasible[s] for r in remats]
    measured = map_compiling(lambda job: measure_layer(job[1], spec, mesh, batch, job[0], job[2]), jobs)
    out = []
    for (s, strat, r), m in zip(jobs, measured):
        sample = Sample(Shape(spec, mesh_shape, batch, s, backend=backend), strat, r, m["stored"], m["peak"],
                        m["total"])
        out.append(sample)
        if progress:
            progress(sample)
    return out


def _nnls(A: np.ndarray, y: np.ndarray, prior: float = 1e-3, start: Optional[np.ndarray] = None) -> np.ndarray:
    """Non-negative least squares in relative error, lightly pulled toward `start` (default 1,
    the analytical coefficient) so that features the samples cannot tell apart keep their prior."""
    from scipy.optimize import nnls
    scale = np.maximum(np.abs(y), 1.0)
    Aw, yw = A / scale[:, None], y / scale
    k = A.shape[1]
    start = np.ones(k) if start is None else np.asarray(start, dtype=float)
    col = np.sqrt(np.maximum((Aw ** 2).sum(axis=0), 1e-30))
    reg = np.diag(prior * col)
    coef, _ = nnls(np.vstack([Aw, reg]), np.concatenate([yw, reg @ start]))
    return coef


def fit_coefficients(samples: Sequence[Sample], prior: float = 0.02,
                     start: Optional[MemoryCoefficients] = None, per_remat: bool = False) -> MemoryCoefficients:
    """Per-strategy multipliers of the stored and peak features fitted to XLA samples (all remat
    policies of a strategy together: the remat-specific features carry the difference; with
    `per_remat`, one fit per (strategy, remat policy), keyed `strategy@remat`).

    The fit is pulled (weight `prior`) toward `start`'s multipliers (default: the analytical 1s);
    calibrating a new model shape on few lengths, pass `default_coefficients()` so that what the
    samples cannot determine keeps the shipped value."""
    coeffs = MemoryCoefficients()
    start = start or ANALYTICAL
    groups: dict[str, list[Sample]] = {}
    for smp in samples:
        groups.setdefault(f"{smp.strategy}@{smp.remat}" if per_remat else smp.strategy, []).append(smp)
    for key, group in groups.items():
        feats = [analytical_features(smp.shape, smp.strategy, smp.remat) for smp in group]
        for which, names, target in (("stored", STORED_FEATURES, [smp.stored for smp in group]),
                                     ("peak", PEAK_FEATURES, [smp.peak for smp in group])):
            A = np.array([[f[0 if which == "stored" else 1][nm] for nm in names] for f in feats], dtype=float)
            used = [i for i in range(len(names)) if np.any(A[:, i] > 0)]
            base = start.get(group[0].strategy, group[0].remat)[0 if which == "stored" else 1]
            coef = {nm: float(base.get(nm, 1.0)) for nm in names}
            if used:
                c = _nnls(A[:, used], np.array(target, dtype=float), prior, [coef[names[i]] for i in used])
                for i, ci in zip(used, c):
                    coef[names[i]] = float(ci)
            getattr(coeffs, which)[key] = coef
    return coeffs


def calibrate(mesh, spec: BlockSpec, batch: int, lengths: Sequence[int], strategies: Optional[Sequence[str]] = None,
              remats: Sequence[str] = ("none",), cache: Optional[str] = None, progress=None,
              start: Optional[MemoryCoefficients] = None, prior: float = 0.05):
    """Measure XLA samples (or read them from the JSON file `cache`) and fit the coefficients,
    starting from (and regularised toward) `start` (default: the shipped coefficients).

    Returns (MemoryCoefficients, samples). Re-run it whenever the kernels change (delete the cache)."""
    strategies = list(strategies or strategy_names())
    samples = None
    if cache and os.path.exists(cache):
        with open(cache) as fh:
            samples = [Sample.from_json(d) for d in json.load(fh)]
    if samples is None:
        samples = measure_samples(strategies, spec, mesh, batch, lengths, remats, progress)
        if cache:
            os.makedirs(os.path.dirname(os.path.abspath(cache)), exist_ok=True)
            with open(cache, "w") as fh:
                json.dump([smp.to_json() for smp in samples], fh)
    return fit_coefficients(samples, prior=prior, start=start or default_coefficients()), samples


def relative_errors(samples: Sequence[Sample], coefficients: Optional[MemoryCoefficients],
                    n_layers: int = 3) -> list[dict]:
    """Predicted vs XLA per sample: stored, peak and the n-layer total (args + output + temp)."""
    rows = []
    for smp in samples:
        m = layer_memory(smp.shape, smp.strategy, smp.remat, coefficients)
        row = {"strategy": smp.strategy, "remat": smp.remat, "seq_len": smp.shape.seq_len,
               "stored": smp.stored, "stored_pred": m.activations, "peak": smp.peak, "peak_pred": m.peak}
        if n_layers in smp.total:
            pred = plan_layer_bytes(smp.shape, smp.strategy, smp.remat, n_layers, coefficients)
            row.update(total=smp.total[n_layers], total_pred=pred,
                       total_err=abs(pred - smp.total[n_layers]) / smp.total[n_layers])
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------------
# The loss transient
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LossSample:
    """XLA's transient bytes per device of one loss program (`costmodel.probe.loss_step`): temp
    plus the gradient of the hidden states (the head's gradient is a state, in `base_memory`)."""

    shape: Shape
    strategy: str
    vocab: int
    chunk: int
    bytes: float

    def features(self) -> tuple[str, dict]:
        """(the key of its multipliers, the analytical loss features)."""
        return loss_features(self.shape, self.strategy, self.vocab, self.chunk)


def measure_loss_samples(strategies: Sequence[str], spec: BlockSpec, mesh, shapes: Sequence[tuple[int, int]],
                         vocabs: Sequence[int], chunks: Sequence[int], progress=None) -> list[LossSample]:
    """XLA loss samples for every strategy x (batch, seq_len) x vocabulary x chunk it can serve,
    a few compiled at once (`costmodel.probe.map_compiling`)."""
    from costmodel.probe import loss_step, map_compiling
    mesh_shape, backend = dict(mesh.shape), mesh.devices.flat[0].platform
    feasible = {bs: set(feasible_strategies(spec, mesh_shape, *bs, strategies)) for bs in shapes}
    jobs = [(batch, seq_len, strategy, vocab, chunk) for batch, seq_len in shapes for strategy in strategies
            if strategy in feasible[(batch, seq_len)] for vocab in vocabs for chunk in chunks]

    def temp_and_output(job):
        batch, seq_len, strategy, vocab, chunk = job
        mem = loss_step(strategy, spec, mesh, batch, seq_len, vocab, chunk).memory_analysis()
        return mem.temp_size_in_bytes + mem.output_size_in_bytes

    out = []
    for (batch, seq_len, strategy, vocab, chunk), nbytes in zip(jobs, map_compiling(temp_and_output, jobs)):
        shape = Shape(spec, mesh_shape, batch, seq_len, backend=backend)
        head_grad = embedding_elems(vocab, spec.d_model, shape.n_devices) * shape.param_bytes
        sample = LossSample(shape, strategy, vocab, chunk, float(nbytes - head_grad))
        out.append(sample)
        if progress:
            progress(sample)
    return out


def fit_loss_coefficients(samples: Sequence[LossSample], prior: float = 0.02) -> dict:
    """{"strategy:loss split": {loss feature: multiplier}} fitted to XLA's loss samples
    (non-negative least squares in relative error, pulled toward the analytical 1s by `prior`)."""
    out = {}
    groups: dict[str, list[tuple[dict, float]]] = {}
    for smp in samples:
        key, features = smp.features()
        groups.setdefault(key, []).append((features, smp.bytes))
    for key, group in groups.items():
        A = np.array([[features[name] for name in LOSS_FEATURES] for features, _ in group], dtype=float)
        used = [i for i in range(len(LOSS_FEATURES)) if np.any(A[:, i] > 0)]
        coef = _nnls(A[:, used], np.array([y for _, y in group]), prior)
        out[key] = {LOSS_FEATURES[i]: round(float(c), 4) for i, c in zip(used, coef)}
    return out
