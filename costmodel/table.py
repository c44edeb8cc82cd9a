"""The cost table the plan search consumes: per-layer options and what they cost, per device.

One `CostTable` describes one (batch, seq_len) bucket on one mesh. Each option (`Choice`) is a
registered strategy with a remat policy; for each the table holds one layer's predicted
forward+backward time, the bytes the layer keeps alive until its backward (stored), and the
transient bytes on top while it runs (peak). Switching between options with different boundary
layouts costs a resharding of the [b, s, h] activations (time and transient bytes).

    plan_bytes(c) = base_bytes + sum_l stored[c_l] + max_l (peak[c_l] + switch_bytes[c_{l-1}, c_l])
    plan_time(c)  = base_time_s + sum_l time[c_l] + sum_l switch_time_s[c_{l-1}, c_l]

(the first layer has no incoming switch: the embedding writes the first layer's layout).
`plan_bytes_backward` is a tighter bound for mixed plans (the backward frees later layers'
stored bytes before earlier layers run); both are equal for uniform plans.

`cost_table(...)` builds a table from the calibrated memory model (`costmodel.memory`, shipped
coefficients fitted against XLA) and the alpha-beta time model (`costmodel.time`), or from a
fitted `Calibration` (`costmodel.calibration`). The embedding / loss transient depends on which
strategy computes the loss (the last layer's); it is folded into each choice's peak as
max(layer peak, loss transient), so `base_bytes` holds only what every plan pays.

Checked against XLA (benchmarks/costmodel_accuracy.py): whole train steps compiled by the
trainer for uniform plans within a few percent per device; mixed plans are overestimated by
`plan_bytes` (Sigma stored + max peak) and less so by `plan_bytes_backward`; a run of a single
layer is not scanned by XLA and needs less than predicted.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence, Union

import numpy as np

from sharding.ops.blocks import BlockSpec
from sharding.remat import NAMES as REMAT_NAMES

REMATS = REMAT_NAMES  # every policy is a per-layer choice of `auto`


@dataclass(frozen=True)
class Choice:
    """One per-layer option: a registered strategy name and a remat policy."""

    strategy: str
    remat: str = "none"  # a name in sharding.remat

    @property
    def label(self) -> str:
        return self.strategy if self.remat == "none" else f"{self.strategy}@{self.remat}"


@dataclass
class CostTable:
    """Costs of one (batch, seq_len) bucket on one mesh, per device, for K per-layer choices."""

    choices: tuple[Choice, ...]
    n_layers: int
    layer_time_s: np.ndarray  # [K] predicted fwd+bwd seconds of one layer per choice
    layer_stored_bytes: np.ndarray  # [K] bytes a layer keeps until its backward (+ its params/grads/opt)
    layer_peak_bytes: np.ndarray  # [K] transient bytes on top while that layer runs (here: also
    # covering the embedding/loss transient when that choice's strategy computes the loss)
    base_bytes: int  # embedding/head + final norm states, the optimizer update, batch inputs
    base_time_s: float  # embedding + head + loss + optimizer update
    switch_time_s: np.ndarray  # [K, K] moving activations from i's boundary layout to j's
    switch_bytes: np.ndarray  # [K, K] transient bytes of that move
    # Descriptive extras (not needed by the search).
    batch: int = 0
    seq_len: int = 0
    mesh_shape: dict = field(default_factory=dict)
    hardware: str = ""

    def __post_init__(self):
        k = len(self.choices)
        self.choices = tuple(self.choices)
        self.layer_time_s = np.asarray(self.layer_time_s, dtype=float).reshape(k)
        self.layer_stored_bytes = np.asarray(self.layer_stored_bytes, dtype=float).reshape(k)
        self.layer_peak_bytes = np.asarray(self.layer_peak_bytes, dtype=float).reshape(k)
        self.switch_time_s = np.asarray(self.switch_time_s, dtype=float).reshape(k, k)
        self.switch_bytes = np.asarray(self.switch_bytes, dtype=float).reshape(k, k)

    # -- lookups -------------------------------------------------------------------------------
    @property
    def K(self) -> int:
        return len(self.choices)

    def index(self, strategy: Union[str, Choice], remat: str = "none") -> int:
        """Position of a choice (a Choice, or a strategy name and remat policy)."""
        choice = strategy if isinstance(strategy, Choice) else Choice(strategy, remat)
        try:
            return self.choices.index(choice)
        except ValueError:
            raise KeyError(f"{choice.label} is not among this table's choices "
                           f"({', '.join(c.label for c in self.choices)})") from None

    def _check(self, per_layer: Sequence[int]) -> np.ndarray:
        idx = np.asarray(list(per_layer), dtype=int)
        if idx.shape != (self.n_layers,):
            raise ValueError(f"a plan gives one choice per layer: expected {self.n_layers}, got {idx.shape[0]}")
        if idx.size and (idx.min() < 0 or idx.max() >= self.K):
            raise ValueError(f"choice indices must be in [0, {self.K}), got {idx.tolist()}")
        return idx

    # -- plan costs ------------------------------------------------------------------------------
    def plan_bytes(self, per_layer: Sequence[int]) -> int:
        """base + sum(stored) + max over layers of (peak + incoming switch bytes)."""
        idx = self._check(per_layer)
        if not idx.size:
            return int(self.base_bytes)
        transient = self.layer_peak_bytes[idx].copy()
        transient[1:] += self.switch_bytes[idx[:-1], idx[1:]]
        return int(round(self.base_bytes + self.layer_stored_bytes[idx].sum() + transient.max()))

    def plan_bytes_backward(self, per_layer: Sequence[int]) -> int:
        """A tighter bound for mixed plans: the backward runs from the last layer to the first and
        frees each layer's stored bytes as it goes, so at layer l only layers <= l still hold
        theirs: base + max over l of (sum of stored up to l + peak_l + incoming switch bytes).
        Equals `plan_bytes` for uniform plans; never larger."""
        idx = self._check(per_layer)
        if not idx.size:
            return int(self.base_bytes)
        transient = self.layer_peak_bytes[idx].copy()
        transient[1:] += self.switch_bytes[idx[:-1], idx[1:]]
        live = np.cumsum(self.layer_stored_bytes[idx]) + transient
        return int(round(self.base_bytes + live.max()))

    def plan_time(self, per_layer: Sequence[int]) -> float:
        """base + sum(layer time) + sum of switch times."""
        idx = self._check(per_layer)
        switches = self.switch_time_s[idx[:-1], idx[1:]].sum() if idx.size > 1 else 0.0
        return float(self.base_time_s + self.layer_time_s[idx].sum() + switches)

    def fits(self, per_layer: Sequence[int], budget_bytes: float) -> bool:
        return self.plan_bytes(per_layer) <= budget_bytes

    def uniform(self, choice: Union[int, str, Choice], remat: str = "none") -> list[int]:
        """Every layer the same choice (index, name or Choice)."""
        i = choice if isinstance(choice, (int, np.integer)) else self.index(choice, remat)
        return [int(i)] * self.n_layers

    def summary(self) -> str:
        """One line per choice: time per layer, stored and peak MiB."""
        rows = [f"bucket b={self.batch} s={self.seq_len} mesh={self.mesh_shape} {self.hardware}: "
                f"base {self.base_bytes / 2**20:.1f} MiB, {self.base_time_s * 1e3:.2f} ms"]
        for i, c in enumerate(self.choices):
            rows.append(f"  {c.label:14s} {self.layer_time_s[i] * 1e3:9.3f} ms  stored "
                        f"{self.layer_stored_bytes[i] / 2**20:9.1f} MiB  peak {self.layer_peak_bytes[i] / 2**20:9.1f} MiB")
        return "\n".join(rows)


def default_choices(spec: BlockSpec, mesh_shape: Mapping[str, int], batch: int, seq_len: int,
                    remats: Sequence[str] = REMATS) -> tuple[Choice, ...]:
    """Every registered strategy that can serve this shape on this mesh, times each remat policy."""
    from costmodel.memory import feasible_strategies
    return tuple(Choice(s, r) for s in feasible_strategies(spec, mesh_shape, batch, seq_len) for r in remats)


def cost_table(spec: BlockSpec, mesh_shape: Mapping[str, int], batch: int, seq_len: int, n_layers: int,
               vocab: int, param_bytes: int = 4, compute_dtype: Optional[str] = None, optimizer_slots: int = 2,
               hardware="a100-80gb", choices: Optional[Sequence[Choice]] = None, loss_chunk: int = 1024,
               grad_accum: int = 1, microbatches: int = 1, in_flight: int = 1) -> CostTable:
    """The cost table of one (batch, seq_len) bucket on a mesh of these named axis sizes.

    spec: the layer's BlockSpec (its compute_dtype is used unless `compute_dtype` is given);
    batch: global batch (rows) of the bucket; vocab: vocabulary size (embedding + head, tied or
    not is irrelevant to per-device bytes within a few percent: counted once);
    param_bytes: bytes of a stored parameter (4 = float32); optimizer_slots: optimizer moments
    per parameter (2 for Adam); hardware: a DeviceProfile, a profile name, or a fitted
    `costmodel.calibration.Calibration` (memory corrections, time coefficients and measured
    layer times of this model).
    choices: default = every feasible strategy x remat policy.
    loss_chunk: tokens per chunk of the loss (`model.loss_chunk`).
    grad_accum: the batch runs as this many micro-batches of batch / grad_accum rows, one after
    another (`train.grad_accum`): layers are stored and peak at a micro-batch, and every time but
    the optimizer update's is paid once per micro-batch.
    microbatches, in_flight: a pipeline splits each of those again into `microbatches`; the
    table is then one stage's (pass `n_layers` of the stage; times per micro-batch pass), whose
    layers keep the activations of `in_flight` micro-batches at once (their states once) and
    whose gradients are summed over the micro-batches.
    """
    from costmodel import memory as M
    from costmodel import time as T
    from costmodel.hardware import DeviceProfile, get_profile
    from costmodel.calibration import Calibration

    if compute_dtype is not None and compute_dtype != spec.compute_dtype:
        from dataclasses import replace
        spec = replace(spec, compute_dtype=str(compute_dtype))
    calib = hardware if isinstance(hardware, Calibration) else None
    backend = "gpu"
    if calib is not None:
        coeffs = calib.time_coefficients()
        hw_name = calib.device_kind
        backend = calib.backend
    else:
        profile = get_profile(hardware) if isinstance(hardware, str) else hardware
        if not isinstance(profile, DeviceProfile):
            raise TypeError(f"hardware must be a DeviceProfile, a profile name or a Calibration, got {hardware!r}")
        coeffs = T.TimeCoefficients.from_profile(profile, mesh_shape)
        hw_name = profile.name
    mesh_shape = dict(mesh_shape)
    if grad_accum < 1 or microbatches < 1 or batch % (grad_accum * microbatches):
        raise ValueError(f"batch {batch} does not split into {grad_accum * microbatches} micro-batches")
    rows = batch // (grad_accum * microbatches)
    if choices is None:
        choices = default_choices(spec, mesh_shape, rows, seq_len)
    choices = tuple(choices)
    if not choices:
        raise ValueError(f"no strategy can serve batch {rows}, length {seq_len} on mesh {mesh_shape}")
    shape = M.Shape(spec, mesh_shape, rows, seq_len, param_bytes=param_bytes, optimizer_slots=optimizer_slots,
                    backend=backend)
    stored, peak, times = [], [], []
    for c in choices:
        mem = M.layer_memory(shape, c.strategy, c.remat)
        if calib is not None:
            mem = calib.correct_memory(c.strategy, c.remat, mem, shape)
        stored.append(mem.states + in_flight * mem.activations)
        # the embedding / loss transient of a choice's strategy (its loss runs while every layer's
        # stored activations are alive) is folded into the choice's peak: max(layer, loss)
        peak.append(max(mem.peak, M.loss_memory(shape, c.strategy, vocab, loss_chunk)))
        times.append(grad_accum * (calib.layer_time(shape, c.strategy, c.remat) if calib is not None
                                   else T.layer_time(shape, c.strategy, c.remat, coeffs).total))
    base = M.base_memory(shape, vocab, n_layers, grad_accum * microbatches)
    base_time = T.base_time(shape, vocab, n_layers, coeffs, grad_accum=grad_accum)
    k = len(choices)
    sw_t, sw_b = np.zeros((k, k)), np.zeros((k, k))
    for i, a in enumerate(choices):
        for j, b in enumerate(choices):
            sw_b[i, j] = M.switch_bytes(shape, a.strategy, b.strategy)
            sw_t[i, j] = grad_accum * T.switch_time(shape, a.strategy, b.strategy, coeffs)
    return CostTable(choices=choices, n_layers=n_layers, layer_time_s=np.array(times),
                     layer_stored_bytes=np.array(stored), layer_peak_bytes=np.array(peak),
                     base_bytes=int(base), base_time_s=float(base_time), switch_time_s=sw_t, switch_bytes=sw_b,
                     batch=batch, seq_len=seq_len, mesh_shape=mesh_shape, hardware=hw_name)
