"""A calibration: the cost model fitted to one device kind and mesh shape, cached as JSON.

It holds the time model's device rates (`TimeCoefficients`, fitted by `costmodel.profile` or
derived from a vendor profile), the memory model's corrections fitted against XLA, and
optionally one model's measured layer times per option (`OptionTimes`), which correct the
time model's prediction per strategy and remat policy for that model's layer shape. Cached per
device kind and mesh shape in a directory (the trainer passes `parallel.costmodel_dir`, default ~/.cache/dysejax/costmodel):

    DIR/<device-kind>__<axis>=<size>_...json
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from typing import Mapping, Optional

from costmodel.memory import LayerMemory, MemoryCoefficients, Shape, layer_memory
from costmodel.time import TimeCoefficients, layer_time
from costmodel.time_correction import OptionTimes, Scales, borrowed, label_of, split_label

FORMAT = 2


@dataclass
class Calibration:
    """Fitted coefficients for one device kind and mesh shape (+ one model's layer times)."""

    device_kind: str
    mesh_shape: dict
    time: TimeCoefficients
    memory: MemoryCoefficients = field(default_factory=MemoryCoefficients)
    step_overhead_s: float = 0.0  # fixed seconds per step (dispatch), outside the layers
    meta: dict = field(default_factory=dict)  # what was profiled, fit residuals
    layer_times: Optional[OptionTimes] = None  # one model's measured layer seconds per option
    _scales: Optional[dict] = field(default=None, repr=False, compare=False)

    def time_coefficients(self) -> TimeCoefficients:
        return self.time

    def memory_coefficients(self) -> MemoryCoefficients:
        return self.memory

    @property
    def backend(self) -> str:
        return "cpu" if self.device_kind.lower().startswith("cpu") else "gpu"

    def layer_time(self, shape: Shape, strategy: str, remat: str) -> float:
        """Predicted seconds of one layer (fwd + bwd) of this option: the time model's, corrected
        by the measured layer times when they are of this layer shape (`time_correction`)."""
        lt = layer_time(shape, strategy, remat, self.time)
        if self.layer_times is None or not self.layer_times.serves(shape.spec):
            return lt.total
        scales = self.option_scales(shape)
        label = label_of(strategy, remat)
        s = scales.get(label) or borrowed(label, scales)
        return s.apply(lt.attention, lt.rest) if s else lt.total

    def option_scales(self, shape: Shape) -> dict[str, Scales]:
        """The fitted scales of every measured option (for the model of `shape`)."""
        if self._scales is None:
            def parts(strategy, remat, batch, seq_len):
                at = replace(shape, batch=batch, seq_len=seq_len, param_bytes=4)
                lt = layer_time(at, strategy, remat, self.time)
                return lt.attention, lt.rest
            self._scales = self.layer_times.fit(parts)
        return self._scales

    def correct_memory(self, strategy: str, remat: str, mem: LayerMemory, shape: Shape) -> LayerMemory:
        """The layer's memory with the fitted feature multipliers (the shipped ones for a strategy
        this calibration did not fit)."""
        return layer_memory(shape, strategy, remat, self.memory if self.memory.key(strategy, remat) else None)

    def with_layer_times(self, times: Optional[OptionTimes]) -> "Calibration":
        return replace(self, layer_times=times, _scales=None)

    def with_memory(self, coefficients: MemoryCoefficients) -> "Calibration":
        return replace(self, memory=coefficients)

    # -- JSON ------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"format": FORMAT, "device_kind": self.device_kind, "mesh_shape": dict(self.mesh_shape),
                "time": self.time.to_json(), "memory": self.memory.to_json(),
                "step_overhead_s": self.step_overhead_s, "meta": self.meta,
                "layer_times": self.layer_times.to_json() if self.layer_times else None}

    @classmethod
    def from_json(cls, d: Mapping) -> "Calibration":
        if d.get("format") != FORMAT:
            raise ValueError(f"calibration format {d.get('format')!r} is not {FORMAT}")
        times = d.get("layer_times")
        return cls(device_kind=d["device_kind"], mesh_shape=dict(d["mesh_shape"]),
                   time=TimeCoefficients.from_json(d["time"]), memory=MemoryCoefficients.from_json(d["memory"]),
                   step_overhead_s=float(d.get("step_overhead_s", 0.0)), meta=dict(d.get("meta", {})),
                   layer_times=OptionTimes.from_json(times) if times else None)

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
    """The cached calibration for this device kind and mesh shape, or None (also for one
    written in another format: it is fitted again)."""
    path = cache_path(directory, device_kind, mesh_shape)
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        try:
            cal = Calibration.from_json(json.load(fh))
        except ValueError:
            return None
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
    """`<platform>-<device kind>` of a mesh's devices, e.g. `gpu-NVIDIA H200`."""
    d = mesh.devices.flat[0]
    return f"{d.platform}-{d.device_kind}"


__all__ = ["Calibration", "cache_path", "load_calibration", "default_calibration", "device_kind_of",
           "DEFAULT_CALIBRATION", "split_label"]
