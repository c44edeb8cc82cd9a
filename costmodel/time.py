"""Per-device time of one Transformer layer (forward + backward) under each strategy.

    time = compute + non-overlapped communication + ring steps

* compute: analytical FLOPs per device (the projections and MLP matmuls, attention's two
  score matmuls with causal halving where the blockwise kernel skips tiles above the diagonal,
  the backward's 2x for matmuls and 2.5x for the flash backward, the forward recomputed under
  remat) over an achievable FLOP/s, plus memory-bound elementwise work (activation bytes and
  attention score elements) over a memory bandwidth / elementwise rate.
* communication per collective kind and mesh axis, alpha-beta: latency per message hop +
  wire bytes / bandwidth; ring all-gather / reduce-scatter move (p-1)/p of the gathered size,
  all-reduce 2(p-1)/p, all-to-all (p-1)/p of the local array, a ppermute hop the block.
* ring steps (`ring` attention, `metp` MLP and attention): with overlap (GPU schedulers) each of
  the p steps costs max(compute of the step, transfer of the next block) + latency — the METP
  full-overlap condition; without overlap (XLA:CPU has no async collectives) compute + transfer.

Load balance: contiguous causal chunks leave ring devices unbalanced (device p-1 attends to every
block, device 0 to one); on real devices the lockstep ring runs at the slowest device's pace, so
attention work is the slowest device's. When all devices share the same cores (simulated CPU
devices, `shared_compute=True`) the mean device's work is what costs time.

`TimeCoefficients` holds the device rates; `from_profile` derives them from a vendor
`DeviceProfile` (with achievable fractions), `costmodel.profile` fits them on the devices here.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Mapping, Optional

from costmodel.hardware import DeviceProfile
from costmodel.memory import (Shape, analytical_features, boundary_bytes, describe, embedding_elems,
                              layer_param_elems, same_boundary)
from sharding.ops.flash import tile_sizes
from sharding.strategies import get_strategy
from sharding.strategies.description import recomputes, recomputes_attention

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")

# HBM bandwidth (bytes/s) per profile name, for memory-bound elementwise work.
HBM_BW = {"A100-80GB": 2.0e12, "H100-SXM": 3.35e12, "H200-SXM": 4.8e12}


@dataclass
class TimeCoefficients:
    """Device rates the time model uses (per device).

    matmul_flops: achievable FLOP/s of matmuls; attn_flops: of attention score/PV matmuls;
    elem_rate: score elements / s of softmax-type elementwise work; mem_bw: bytes / s of
    memory-bound activation traffic; bandwidth / latency: per collective kind (bytes / s of one
    link direction, seconds per message hop); overlap: ring steps overlap compute and transfer;
    shared_compute: all devices share one pool of cores (simulated CPU devices); layer_overhead:
    fixed seconds per layer (launches, loop control); iter_overhead: seconds per loop iteration
    of the attention tile loops and ring steps (kernel launches, loop control)."""

    matmul_flops: float
    attn_flops: float
    elem_rate: float
    mem_bw: float
    bandwidth: dict = field(default_factory=dict)
    latency: dict = field(default_factory=dict)
    overlap: bool = True
    shared_compute: bool = False
    layer_overhead: float = 0.0
    iter_overhead: float = 0.0
    name: str = ""

    def bw(self, kind: str) -> float:
        return self.bandwidth.get(kind, self.bandwidth.get("default", 1e11))

    def lat(self, kind: str) -> float:
        return self.latency.get(kind, self.latency.get("default", 5e-6))

    @classmethod
    def from_profile(cls, profile: DeviceProfile, mesh_shape: Optional[Mapping[str, int]] = None,
                     matmul_efficiency: float = 0.6, attn_efficiency: float = 0.45,
                     link_efficiency: float = 0.75) -> "TimeCoefficients":
        """Rates from a vendor profile: a fraction of peak FLOP/s and link bandwidth; the link is
        NVLink when the mesh fits in one node, else the NIC."""
        n = math.prod(mesh_shape.values()) if mesh_shape else 1
        link = profile.intra_node_bw if n <= profile.devices_per_node else profile.inter_node_bw
        bw = link * link_efficiency
        return cls(matmul_flops=profile.flops * matmul_efficiency, attn_flops=profile.flops * attn_efficiency,
                   elem_rate=profile.flops / 64, mem_bw=HBM_BW.get(profile.name, 2e12) * 0.7,
                   bandwidth={k: bw for k in KINDS}, latency={k: profile.link_latency_s for k in KINDS},
                   overlap=True, shared_compute=False, layer_overhead=20e-6, iter_overhead=4e-6,
                   name=profile.name)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping) -> "TimeCoefficients":
        return cls(**dict(d))


# ------------------------------------------------------------------------------------------------
# Work of one layer
# ------------------------------------------------------------------------------------------------
@dataclass
class LayerWork:
    """Analytical work of one layer, fwd + bwd, per device (the terms the time model prices)."""

    matmul_flops: float = 0.0  # projections + MLP (incl. recompute)
    attn_flops: float = 0.0  # attention score / PV matmuls on the time-critical device
    attn_flops_mean: float = 0.0  # the same averaged over devices
    score_elems: float = 0.0  # score elements touched by elementwise softmax work (critical device)
    score_elems_mean: float = 0.0
    act_bytes: float = 0.0  # memory-bound activation traffic
    iterations: float = 0.0  # loop iterations (attention tiles, ring steps): per-iteration overhead
    comm: dict = field(default_factory=dict)  # {kind: (wire bytes, hops)} not overlapped
    # ring steps whose transfer can hide behind compute: [(hops, bytes per hop, (matmul FLOPs,
    # attention FLOPs, score elements) of the compute that runs while one hop is in flight)];
    # that compute is part of the totals above.
    ring_steps: list = field(default_factory=list)


@dataclass
class LayerTime:
    """Predicted seconds of one layer, by part: attention (score/PV matmuls, score elementwise
    work and tile/ring-step loop iterations: the part that grows with the length at fixed
    tokens), the rest of the compute (projections, MLP, activation traffic), communication not
    overlapped, ring transfers, and a fixed overhead."""

    compute: float
    comm: float
    ring: float
    overhead: float
    attention: float = 0.0

    @property
    def total(self) -> float:
        return self.attention + self.compute + self.comm + self.ring + self.overhead

    @property
    def rest(self) -> float:
        """Everything but the attention part."""
        return self.total - self.attention


def _causal_fraction(spec, s_q: int, s_kv: int, tiled: bool, batch_heads: float = 1) -> float:
    """Share of a causal diagonal block's score tiles that are computed (the flash kernel visits
    the lower triangle of its cache-sized tiles, `sharding.ops.flash.tile_sizes`; a dense kernel
    computes the whole square)."""
    if not tiled:
        return 1.0
    bq, _ = tile_sizes(spec.attention_block, spec.attention_block, s_q, s_kv, max(1, int(batch_heads)))
    nt = max(1, math.ceil(s_q / bq))
    return (nt + 1) / (2 * nt)


def _wire(kind: str, size: float, p: int) -> tuple[float, float]:
    """(wire bytes, latency hops) of one collective over p devices handling `size` bytes (the
    gathered array for all-gather / reduce-scatter / all-reduce, the local array for all-to-all,
    the block for a ppermute)."""
    if p <= 1:
        return 0.0, 0.0
    if kind in ("all-gather", "reduce-scatter", "all-to-all"):
        return size * (p - 1) / p, p - 1
    if kind == "all-reduce":
        return 2 * size * (p - 1) / p, 2 * (p - 1)
    return size, 1  # collective-permute hop


def _add(comm: dict, kind: str, size: float, p: int, times: float = 1.0):
    b, h = _wire(kind, size, p)
    old = comm.get(kind, (0.0, 0.0))
    comm[kind] = (old[0] + times * b, old[1] + times * h)


def shape_shared(shape: Shape) -> bool:
    """Devices share cores (simulated CPU devices): the mean device's work is what costs time."""
    return shape.backend == "cpu"


def layer_work(shape: Shape, strategy: str, remat: str = "none", skip_masked: bool = True) -> LayerWork:
    """FLOPs, elementwise work and communication of one layer of `strategy`, per device, from
    the strategy's description (`Strategy.describe`).

    skip_masked=False counts every attention tile / ring block as computed (what compiled HLO
    holds: both branches of the kernels' `lax.cond`), for cross-checks against `hlo_dot_flops`."""
    desc = describe(shape, strategy, remat)
    spec, layer = shape.spec, shape.layer
    rec, rec_attn = recomputes(remat), recomputes_attention(remat)
    w = LayerWork()
    st, _ = analytical_features(shape, strategy, "none")
    w.act_bytes = 3 * (st["act"] + st["quad"]) * (1 + (rec_attn + rec) / 2)
    w.iterations = (2 + rec_attn) * desc.iterations  # forward, backward (+ the recomputed forward)
    w.matmul_flops = desc.matmul_flops

    # attention: score + PV matmuls, forward 2, backward 5 (flash) or 4 (dense); on a causal ring
    # the slowest device computes blocks - 1 full blocks + the diagonal, the mean one half of them
    att = desc.attention
    diag = _causal_fraction(spec, int(att.s_q), int(att.s_kv), att.tiled and (skip_masked or att.blocks > 1),
                            att.rows * att.heads)
    crit, mean = ((att.blocks - 1) + diag, (att.blocks - 1) / 2 + diag) if skip_masked else (att.blocks, att.blocks)
    base = 4 * att.rows * att.heads * spec.head_dim * att.s_q * att.s_kv
    n_mm = (2 + (5 if att.flash else 4)) / 2 + rec_attn
    elems = att.rows * att.heads * att.s_q * att.s_kv * (2 + rec_attn)
    w.attn_flops, w.attn_flops_mean = base * crit * n_mm, base * mean * n_mm
    w.score_elems, w.score_elems_mean = elems * crit, elems * mean

    for c in desc.collectives:
        _add(w.comm, c.kind, c.size, layer.size(c.role), c.count)
    # ring steps: the compute that runs while one hop is in flight, on the priced device
    sel = mean if shape_shared(shape) else crit
    fwd_flops = 4 * att.rows * att.heads * spec.head_dim * att.s_q * att.s_kv * sel
    fwd_elems = att.rows * att.heads * att.s_q * att.s_kv * sel
    for r in desc.ring_steps:
        size = r.size if r.kind == "collective-permute" else _wire(r.kind, r.size, shape.p)[0]
        w.ring_steps.append((r.hops, size, (r.matmul_flops, fwd_flops * r.attention, fwd_elems * r.scores)))
    return w


def layer_time(shape: Shape, strategy: str, remat: str, coeffs: TimeCoefficients) -> LayerTime:
    """Predicted seconds of one layer's forward + backward per device."""
    w = layer_work(shape, strategy, remat)
    attn = w.attn_flops_mean if coeffs.shared_compute else w.attn_flops
    elems = w.score_elems_mean if coeffs.shared_compute else w.score_elems
    attention = attn / coeffs.attn_flops + elems / coeffs.elem_rate + w.iterations * coeffs.iter_overhead
    compute = w.matmul_flops / coeffs.matmul_flops + w.act_bytes / coeffs.mem_bw
    comm = sum(b / coeffs.bw(kind) + hops * coeffs.lat(kind) for kind, (b, hops) in w.comm.items())
    ring = 0.0
    bw, lat = coeffs.bw("collective-permute"), coeffs.lat("collective-permute")
    for hops, nbytes, (mm, at, el) in w.ring_steps:
        transfer = nbytes / bw
        if coeffs.overlap:
            # a step costs max(its compute, the next block's transfer) + latency: only the
            # transfer not hidden behind compute (the METP full-overlap condition) is added
            step_compute = mm / coeffs.matmul_flops + at / coeffs.attn_flops + el / coeffs.elem_rate
            ring += hops * (max(transfer - step_compute, 0.0) + lat)
        else:
            ring += hops * (transfer + lat)
    return LayerTime(compute=compute, comm=comm, ring=ring, overhead=coeffs.layer_overhead, attention=attention)


def switch_time(shape: Shape, a: str, b: str, coeffs: TimeCoefficients) -> float:
    """Seconds to move [b, s, h] activations from a's boundary layout to b's (forward and the
    gradient back): a gather over the model group into a layout replicated over it, an
    all-to-all over all devices otherwise (between batch- and sequence-sharded)."""
    if same_boundary(a, b):
        return 0.0
    size = max(boundary_bytes(shape, a), boundary_bytes(shape, b))
    if not all(get_strategy(x).boundary.uses_model_group() for x in (a, b)):
        kind = "all-gather"
        bwire, hops = _wire(kind, size, shape.p)
    else:
        kind = "all-to-all"
        bwire, hops = _wire(kind, size, shape.n_devices)
    return 2 * (bwire / coeffs.bw(kind) + hops * coeffs.lat(kind))


def base_time(shape: Shape, vocab: int, n_layers: int, coeffs: TimeCoefficients,
              optimizer_slots: Optional[int] = None) -> float:
    """Embedding + head matmul + loss (worst over the strategies' layouts) + optimizer update.

    The chunked loss (`sharding.ops.chunked_loss`) runs the head matmul four times (forward,
    its recompute in the backward, and the two gradients) and moves the head's bytes three times
    (a gather, or the ring's blocks forward; blocks and their gradients backward)."""
    spec, N = shape.spec, shape.n_devices
    h = spec.d_model
    tokens = shape.batch * shape.seq_len / N  # every strategy spreads the loss's tokens over N devices
    head = 4 * 2 * tokens * h * vocab / coeffs.matmul_flops
    softmax = 3 * tokens * vocab / coeffs.elem_rate
    local_layer, _ = layer_param_elems(spec, N)
    params = local_layer * n_layers + embedding_elems(vocab, h, N) + h
    slots = shape.optimizer_slots if optimizer_slots is None else optimizer_slots
    update = params * shape.param_bytes * (3 + 2 * slots) / coeffs.mem_bw
    gather = vocab * h * shape.param_bytes * (N - 1) / N / coeffs.bw("all-gather") + (N - 1) * coeffs.lat("all-gather")
    return head + softmax + update + 3 * gather


# ------------------------------------------------------------------------------------------------
# Cross-check: matmul FLOPs in compiled HLO with loop trip counts
# ------------------------------------------------------------------------------------------------
def hlo_dot_flops(text: str) -> float:
    """2 x (product of result dims) x (contracted size) summed over every dot in the HLO, each
    counted as many times as its loop nests run (`cost_analysis` counts a loop body once). Both
    branches of a conditional count (the blockwise kernel's skipped tiles are included)."""
    import re

    from costmodel.hlo import _ARRAY, _computations, _multiplicities
    comps, entry = _computations(text)
    mult = _multiplicities(comps, entry)
    shapes: dict[str, list[int]] = {}
    total = 0.0
    dot = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(\S+?)\s+dot\((.*?)\),.*lhs_contracting_dims=\{([\d,]*)\}")
    assign = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*([a-z]+\d*[a-z0-9]*)\[([\d,]*)\]")
    for name, lines in comps.items():
        for line in lines:
            m = assign.match(line)
            if m:
                shapes[m.group(1)] = [int(x) for x in m.group(3).split(",") if x]
        times = mult.get(name, 0)
        if not times:
            continue
        for line in lines:
            m = dot.match(line)
            if not m:
                continue
            res = _ARRAY.findall(m.group(2))
            if not res:
                continue
            out = math.prod(int(x) for x in res[0][1].split(",") if x)
            lhs = m.group(3).split(",")[0].strip().lstrip("%")
            lhs_name = lhs.split(" ")[-1].lstrip("%")
            dims = shapes.get(lhs_name)
            if dims is None:
                arr = _ARRAY.findall(m.group(3))
                dims = [int(x) for x in arr[0][1].split(",") if x] if arr else []
            contract = math.prod(dims[int(i)] for i in m.group(4).split(",") if i) if dims else 1
            total += times * 2.0 * out * contract
    return total
