"""What one pipeline stage costs: a slice of `width` identical devices running n layers.

Priced by the shared cost model (`costmodel.cluster.layers`: the cost table `parallel.plan:
auto` searches) on the stage's devices (mesh {data: width}), one micro-batch of b sequences of
length s. Inside the stage the devices run one registered strategy (`dp`, `fsdp`, `tp`,
`tp_sp`, `ring`, `ulysses`, `metp`: whichever can split this shape `width` ways); per device:

  time    forward + backward of a layer: the table's layer time, split 1 : 2 (the backward is
          about twice the forward); the model's ends (embedding, head, loss: the table's base
          without layers) on the last stage, split the same way; the optimizer update of the
          stage's layers after its last backward (`sync_s`).
  memory  static: the layers' states and update buffer, the largest transient (the loss's on
          the last stage), the model's ends on the first and the last stage (a tied table is
          copied there, as Megatron does); per micro-batch in flight: the layers' stored
          activations.
  recompute (HPH's recomputation): the stage keeps only its input per micro-batch in flight
          (the activations a layer keeps under remat `full`) and re-runs its forward just before
          each backward (the table's `full` time minus its `none` time, per layer), holding one
          micro-batch's full activations from then until that backward ends.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from costmodel.cluster.layers import GroupCosts, group_costs
from costmodel.cluster.workload import Model, Workload
from costmodel.hardware import DeviceProfile

__all__ = ["StageCost", "StageOptions", "stage_options"]

FORWARD_SHARE = 1.0 / 3.0  # of a layer's forward + backward time


@dataclass(frozen=True)
class StageCost:
    """Per-micro-batch times and per-device bytes of one stage (a choice of mode and recompute)."""

    mode: str
    recompute: bool
    fwd_s: float
    bwd_s: float
    recompute_s: float
    sync_s: float
    static_bytes: float  # model states, update buffer, the largest transient, the model's ends
    act_bytes: float  # kept per in-flight micro-batch
    recompute_bytes: float  # one micro-batch's re-materialised activations (0 without recompute)

    @property
    def time_s(self) -> float:
        """Busy time per micro-batch (forward + recompute + backward)."""
        return self.fwd_s + self.recompute_s + self.bwd_s

    def peak_bytes(self, in_flight: int) -> float:
        return self.static_bytes + in_flight * self.act_bytes + self.recompute_bytes


class StageOptions:
    """Every (strategy, recompute) option of one kind of stage, as arrays over (option, n, first, last).

    Each field of `StageCost` is c + p n + f F + l La + fl F La for a stage of n layers holding the
    model's first end (F = 1) and/or its last (La = 1); `cost(o, n, first, last)` builds one
    option's cost, `field(name)` the [option, n - 1, first, last] array the partitioner's DP reads.
    """

    def __init__(self, gc: GroupCosts, n_layers: int, microbatches: int):
        none = {c.strategy: i for i, c in enumerate(gc.choices) if c.remat == "none"}
        full = {c.strategy: i for i, c in enumerate(gc.choices) if c.remat == "full"}
        self.options = [(s, rec) for s in none for rec in (False, True) if not rec or s in full]
        self.n_layers, self.microbatches = n_layers, microbatches
        k = np.array([none[s] for s, _ in self.options])
        kf = np.array([full.get(s, none[s]) for s, _ in self.options])
        rec = np.array([r for _, r in self.options], dtype=float)
        t, z, one = gc.time_s[k], np.zeros(len(k)), np.ones(len(k))
        fwd, bwd, ends = FORWARD_SHARE, 1 - FORWARD_SHARE, gc.ends_bytes
        loss_extra = gc.table.layer_peak_bytes[k] - gc.peak[k]  # the loss's transient over a layer's
        # field: (constant, per layer, first end, last end, both ends), each [option]
        self._terms = {
            "fwd_s": (z, fwd * t, z, fwd * gc.ends_time_s * one, z),
            "bwd_s": (z, bwd * t, z, bwd * gc.ends_time_s * one, z),
            "recompute_s": (z, rec * (gc.time_s[kf] - t), z, z, z),
            "sync_s": (z, gc.update_time_s * one, z, z, z),
            "static_bytes": (gc.peak[k], gc.states[k] + gc.update_bytes, ends * one, ends + loss_extra, -ends * one),
            "act_bytes": (rec * gc.activations[kf], (1 - rec) * gc.activations[k], z, z, z),
            "recompute_bytes": (z, rec * gc.activations[k], z, z, z),
        }

    def field(self, name: str) -> np.ndarray:
        """[option, n - 1, first, last] array of one `StageCost` field."""
        c, p, f, la, fl = (x[:, None, None, None] for x in self._terms[name])
        n = np.arange(1, self.n_layers + 1)[None, :, None, None]
        F = np.array([0.0, 1.0])[None, None, :, None]
        La = np.array([0.0, 1.0])[None, None, None, :]
        return c + p * n + f * F + la * La + fl * F * La

    def load(self) -> np.ndarray:
        """[option, n - 1, first, last]: the stage's busy time per iteration."""
        busy = self.field("fwd_s") + self.field("recompute_s") + self.field("bwd_s")
        return self.microbatches * busy + self.field("sync_s")

    def cost(self, o: int, n: int, first: bool, last: bool) -> StageCost:
        """The cost of option o on n layers (holding the first / the last end)."""
        values = {}
        for name, terms in self._terms.items():
            c, p, f, la, fl = (float(x[o]) for x in terms)
            values[name] = c + p * n + f * first + la * last + fl * first * last
        mode, rec = self.options[o]
        return StageCost(mode=mode, recompute=rec, **values)


def stage_options(model: Model, wl: Workload, device: DeviceProfile, width: int) -> Optional[StageOptions]:
    """The options of a stage of `width` devices of this kind (None: no strategy can split it)."""
    gc = group_costs(model, device, width, wl.micro_batch, wl.seq_len, remats=("none", "full"))
    return None if gc is None else StageOptions(gc, model.n_layers, wl.microbatches)
