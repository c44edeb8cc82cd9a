"""What one pipeline stage costs: a slice of `width` identical devices running n layers.

Per micro-batch of b sequences of length s (forward FLOPs 2 b s P_layer + 4 b s^2 h per layer,
2 b s h V for the head; backward 2x forward; recompute 1x forward), at the group's achievable
FLOP/s. Inside the stage the devices run
  tp  Megatron tensor parallel: FLOPs / width, 2 ring all-reduces of the [b, s, h] activations
      per layer in the forward and 2 in the backward (the group's NVLink); model states and the
      per-layer activations s b h (10 + 24 / width) split as Megatron does (Korthikanti et al.);
  dp  data parallel: b / width sequences per device, full model states, activations
      s (b / width) h 34 per layer, one all-reduce of the bf16 gradients after the last backward.
Memory per device: 16 bytes/param of model states (mixed-precision Adam), the activations of
every in-flight micro-batch (with recompute: only the stage input, plus one micro-batch's full
activations re-materialised for its backward), one layer's MLP workspace and the last stage's
fp32 logits. Embedding on the first stage, head on the last (a tied table is copied there).
"""
from __future__ import annotations

from dataclasses import dataclass

from costmodel.hardware import DeviceProfile
from costmodel.hetero.cluster import Link
from costmodel.hetero.workload import Workload
from costmodel.search.ilp import ModelShape

__all__ = ["StageCost", "stage_cost", "modes", "allreduce_time"]


@dataclass(frozen=True)
class StageCost:
    """Per-micro-batch times and per-device bytes of one stage (a choice of mode and recompute)."""

    mode: str
    recompute: bool
    fwd_s: float
    bwd_s: float
    recompute_s: float
    sync_s: float
    static_bytes: float  # model states + workspace
    act_bytes: float  # kept per in-flight micro-batch
    recompute_bytes: float  # one micro-batch's re-materialised activations (0 without recompute)

    @property
    def time_s(self) -> float:
        """Busy time per micro-batch (forward + recompute + backward)."""
        return self.fwd_s + self.recompute_s + self.bwd_s

    def peak_bytes(self, in_flight: int) -> float:
        return self.static_bytes + in_flight * self.act_bytes + self.recompute_bytes


def allreduce_time(nbytes: float, n: int, link: Link) -> float:
    """Ring all-reduce of `nbytes` over n devices."""
    return 0.0 if n == 1 else 2 * (n - 1) / n * nbytes / link.bandwidth + 2 * (n - 1) * link.latency


def modes(model: ModelShape, wl: Workload, width: int) -> tuple:
    """The in-stage modes that can split work `width` ways."""
    out = []
    if model.n_heads % width == 0 and model.d_ff % width == 0:
        out.append("tp")
    if width > 1 and wl.micro_batch % width == 0:
        out.append("dp")
    return tuple(out)


def stage_cost(model: ModelShape, wl: Workload, device: DeviceProfile, rate: float, width: int, n_layers: int,
               first: bool, last: bool, mode: str, recompute: bool) -> StageCost:
    """The cost of n layers on `width` devices of this kind, each achieving `rate` FLOP/s."""
    link = Link(device.intra_node_bw, device.link_latency_s)
    b, s, h, V = wl.micro_batch, wl.seq_len, model.d_model, model.vocab
    p_layer = model.params("attn") + model.params("mlp")
    params = n_layers * p_layer + first * model.params("embed")
    if last:
        params += model.params("embed") if (model.tied and not first) else model.params("head")
    flops = n_layers * (2.0 * b * s * p_layer + 4.0 * b * s * s * h) + last * 2.0 * b * s * h * V
    compute = flops / (width * rate)
    x = float(b * s * h * wl.act_bytes)  # [b, s, h] activations
    score = 0.0 if wl.flash else 5.0 * model.n_heads * s / h
    if mode == "tp":
        comm = n_layers * 2 * allreduce_time(x, width, link)
        states = 16.0 * params / width
        a_layer = s * b * h * (10 + 24 / width + score / width)
        kept_input, local_b, shard, sync = x, b, width, 0.0
    elif mode == "dp":
        comm = 0.0
        states = 16.0 * params
        a_layer = s * (b / width) * h * (34 + score)
        kept_input, local_b, shard = x / width, b / width, 1
        sync = allreduce_time(2.0 * params, width, link)
    else:
        raise ValueError(f"unknown stage mode {mode!r} (known: tp, dp)")
    workspace = 2.0 * local_b * s * model.d_ff * wl.act_bytes / shard + last * 4.0 * local_b * s * V / shard
    fwd = compute + comm
    return StageCost(mode=mode, recompute=recompute, fwd_s=fwd, bwd_s=2 * compute + comm,
                     recompute_s=fwd if recompute else 0.0, sync_s=sync, static_bytes=states + workspace,
                     act_bytes=kept_input if recompute else n_layers * a_layer,
                     recompute_bytes=n_layers * a_layer if recompute else 0.0)
