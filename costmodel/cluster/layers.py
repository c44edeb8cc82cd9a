"""What the cluster planners read from the shared cost model: a group of devices and its layer options.

A group is the devices that run each layer together (a node for the ILP, a tensor-parallel
group for PTIP, a pipeline stage for HPH; by default the mesh {"data": width}, on which every
registered strategy splits its work over the whole group), `batch` sequences of `seq_len` per
micro-step. Every figure is per device and comes from the cost model `parallel.plan: auto`
uses: the cost table (`costmodel.table.cost_table`: layer time, stored and peak bytes, switch
costs, the embedding / head / loss / optimizer base) and the layer memory
(`costmodel.memory.layer_memory`: the stored bytes split into states and activations).

    states[k]       a layer's parameters, gradients and optimizer moments (unified storage)
    activations[k]  what a layer keeps for its backward, per micro-batch in flight
    peak[k]         a layer's transient while it runs (the table's peak also covers the loss)
    time_s[k]       a layer's forward + backward
    ends_bytes / ends_time_s      the model's ends: embedding, head and loss (the table's base
                                  without layers), per micro-step for the time
    update_bytes / update_time_s  per layer: the optimizer update's buffer and time, once per
                                  iteration (the rest of the base, which is linear in the layers)
    grad_bytes[k]   a layer's gradient: states / (2 + optimizer slots) (the storage keeps
                    parameters, gradients and each moment at the parameter's width)
    ends_grad_bytes the embedding table's gradient (vocab x d_model, split over the group)

All figures are model predictions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Optional, Sequence, Union

import numpy as np

from costmodel.cluster.workload import Model
from costmodel.hardware import DeviceProfile
from costmodel.memory import Shape, layer_memory
from costmodel.table import Choice, CostTable, cost_table, default_choices

__all__ = ["GroupCosts", "group_costs"]


@dataclass(frozen=True)
class GroupCosts:
    """Per-device costs of the layer options of one group (see the module doc)."""

    table: CostTable
    states: np.ndarray
    activations: np.ndarray
    peak: np.ndarray
    ends_bytes: float
    ends_time_s: float
    update_bytes: float
    update_time_s: float
    grad_bytes: np.ndarray
    ends_grad_bytes: float

    @property
    def choices(self) -> tuple[Choice, ...]:
        return self.table.choices

    @property
    def time_s(self) -> np.ndarray:
        return self.table.layer_time_s

    def index(self, strategy: str, remat: str = "none") -> Optional[int]:
        """Position of an option, None when the group cannot run it."""
        try:
            return self.table.index(strategy, remat)
        except KeyError:
            return None


def group_costs(model: Model, profile: DeviceProfile, mesh: Union[int, Mapping[str, int]], batch: int,
                seq_len: int, *, strategies: Optional[Sequence[str]] = None,
                remats: Sequence[str] = ("none",)) -> Optional[GroupCosts]:
    """The layer options (every feasible strategy, or those of `strategies`, x `remats`) of a group
    of devices (`mesh`: a width, or named axis sizes) running `batch` sequences of `seq_len`;
    None when no option can serve the shape."""
    axes = (("data", int(mesh)),) if isinstance(mesh, (int, np.integer)) else tuple(dict(mesh).items())
    return _group_costs(model, profile, axes, int(batch), int(seq_len),
                        None if strategies is None else tuple(strategies), tuple(remats))


@lru_cache(maxsize=512)
def _group_costs(model, profile, axes, batch, seq_len, strategies, remats) -> Optional[GroupCosts]:
    mesh = dict(axes)
    choices = [c for c in default_choices(model.spec, mesh, batch, seq_len, remats)
               if strategies is None or c.strategy in strategies]
    if not choices:
        return None
    kw = dict(param_bytes=model.param_bytes, optimizer_slots=model.optimizer_slots, hardware=profile,
              loss_chunk=model.loss_chunk)
    table = cost_table(model.spec, mesh, batch, seq_len, model.n_layers, model.vocab, choices=choices, **kw)
    ends = cost_table(model.spec, mesh, batch, seq_len, 0, model.vocab, choices=choices[:1], **kw)
    shape = Shape(model.spec, mesh, batch, seq_len, param_bytes=model.param_bytes,
                  optimizer_slots=model.optimizer_slots)
    mem = [layer_memory(shape, c.strategy, c.remat) for c in choices]
    states = np.array([m.states for m in mem])
    L = max(model.n_layers, 1)
    return GroupCosts(table=table, states=states, activations=np.array([m.activations for m in mem]),
                      peak=np.array([m.peak for m in mem]), ends_bytes=float(ends.base_bytes),
                      ends_time_s=float(ends.base_time_s),
                      update_bytes=(table.base_bytes - ends.base_bytes) / L,
                      update_time_s=(table.base_time_s - ends.base_time_s) / L,
                      grad_bytes=states / (2 + model.optimizer_slots),
                      ends_grad_bytes=model.vocab * model.spec.d_model * model.param_bytes / math.prod(mesh.values()))
