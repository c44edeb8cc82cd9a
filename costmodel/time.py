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
  Two tiers of links (`devices_per_node` > 0): a collective's group is placed on the mesh as
  `sharding.mesh.build_mesh` lays devices out (a host's devices along the last axes: a model
  group is p consecutive devices, the batch axes stride p, the devices role is all of them), so
  a group spans nodes when it has more devices than share a node. Crossing nodes, a ring
  collective runs at the slower of NVLink and the NICs of its members in a node (NCCL runs one
  ring per NIC: every byte crosses each node boundary once, through one of those NICs); an
  all-to-all sends its bytes for peers in other nodes through the device's NIC while those for
  peers in the node move over NVLink; a ring attention hop (ppermute) runs at the NIC's pace
  (the lockstep ring waits for its node-crossing hop); hops cost the inter-node latency.
* weight gathers and weight gradients' reduce-scatters (`Collective.prefetch`) overlap with the
  layer's compute where collectives are asynchronous (`overlap`: GPU schedulers such as XLA's
  latency-hiding scheduler with pipelined all-gather / reduce-scatter, which MaxText's GPU
  scripts enable): only the part longer than the layer's compute costs time.
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
from sharding.strategies.description import BATCH_ROLE, MODEL_ROLE, DEVICES_ROLE, LayerShape
from sharding.strategies.description import recomputes, recomputes_attention

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
# Fraction of NVLink an all-to-all reaches inside a node: fitted on FlexSP's measured all-to-all
# over 8 A100s (96.5 GB/s of the local array, its solver.py); held out there: 2 and 4 GPUs
# (benchmarks/gpu_reference.py prints their errors). Other collectives: `link_efficiency`.
ALLTOALL_EFFICIENCY = 0.313


@dataclass
class TimeCoefficients:
    """Device rates the time model uses (per device).

    matmul_flops: achievable FLOP/s of matmuls; attn_flops: of attention score/PV matmuls;
    elem_rate: score elements / s of softmax-type elementwise work; mem_bw: bytes / s of
    memory-bound activation traffic; bandwidth / latency: per collective kind (bytes / s of one
    link direction, seconds per message hop) inside a node; inter_bandwidth / inter_latency: the
    same across nodes (a device's NIC share), used for groups that span nodes of
    `devices_per_node` devices (0: every group within one node); overlap: ring steps overlap
    compute and transfer, and weight collectives overlap the layer's compute;
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
    inter_bandwidth: dict = field(default_factory=dict)
    inter_latency: dict = field(default_factory=dict)
    devices_per_node: int = 0

    def bw(self, kind: str) -> float:
        return self.bandwidth.get(kind, self.bandwidth.get("default", 1e11))

    def lat(self, kind: str) -> float:
        return self.latency.get(kind, self.latency.get("default", 5e-6))

    def inter_bw(self, kind: str) -> float:
        """Bytes / s of a device's share of the inter-node links (the intra-node rate if unset)."""
        return self.inter_bandwidth.get(kind, self.bw(kind))

    def inter_lat(self, kind: str) -> float:
        return self.inter_latency.get(kind, self.lat(kind))

    def link_time(self, kind: str, intra_bytes: float, inter_bytes: float, hops: float) -> float:
        """Seconds of one collective whose bytes split over NVLink and the NIC (concurrently)."""
        if inter_bytes > 0:
            return max(intra_bytes / self.bw(kind), inter_bytes / self.inter_bw(kind)) + hops * self.inter_lat(kind)
        return intra_bytes / self.bw(kind) + hops * self.lat(kind)

    @classmethod
    def from_profile(cls, profile: DeviceProfile, mesh_shape: Optional[Mapping[str, int]] = None,
                     matmul_efficiency: float = 0.6, attn_efficiency: float = 0.45,
                     link_efficiency: float = 0.75,
                     alltoall_efficiency: Optional[float] = ALLTOALL_EFFICIENCY) -> "TimeCoefficients":
        """Rates from a vendor profile: a fraction of peak FLOP/s and of the link bandwidths, NVLink
        inside a node of `profile.devices_per_node` devices and the NIC across nodes (which link a
        collective uses follows from its group's place on the mesh, `layer_work`; `mesh_shape` is
        accepted for callers that pass it). alltoall_efficiency: the fraction of NVLink an
        all-to-all reaches inside a node (None: link_efficiency; the default is fitted on
        FlexSP's measured 8-GPU all-to-all, benchmarks/gpu_reference.py)."""
        link_eff = {k: link_efficiency for k in KINDS}
        if alltoall_efficiency is not None:
            link_eff["all-to-all"] = alltoall_efficiency
        return cls(matmul_flops=profile.flops * matmul_efficiency, attn_flops=profile.flops * attn_efficiency,
                   elem_rate=profile.flops / 64, mem_bw=profile.hbm_bw * 0.7,
                   bandwidth={k: profile.intra_node_bw * link_eff[k] for k in KINDS},
                   latency={k: profile.link_latency_s for k in KINDS}, overlap=True, shared_compute=False,
                   layer_overhead=20e-6, iter_overhead=4e-6, name=profile.name,
                   inter_bandwidth={k: profile.inter_node_bw * link_efficiency for k in KINDS},
                   inter_latency={k: profile.inter_node_latency_s for k in KINDS},
                   devices_per_node=profile.devices_per_node)

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
    comm: dict = field(default_factory=dict)  # {kind: (wire bytes, hops)} of the collectives below
    # one entry per collective (x its count): (kind, bytes over NVLink, bytes through the NIC,
    # hops, prefetch: a weight collective that may overlap the layer's compute)
    links: list = field(default_factory=list)
    # ring steps whose transfer can hide behind compute: [(hops, bytes per hop, (matmul FLOPs,
    # attention FLOPs, score elements) of the compute that runs while one hop is in flight)];
    # that compute is part of the totals above.
    ring_steps: list = field(default_factory=list)
    ring_links: list = field(default_factory=list)  # per ring step: (NVLink bytes, NIC bytes) per hop


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
    hidden: float = 0.0  # weight collectives' seconds run during the compute (not in the total)

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


def in_node(layer: LayerShape, role: str, devices_per_node: int) -> int:
    """Devices of one `role` group that share a node, with the mesh laid out as
    `sharding.mesh.build_mesh` lays it (a host's devices along the last axes): a model group is p
    consecutive devices, the batch axes stride p, the devices role is all N in order.
    devices_per_node 0: one node holds every group."""
    size = layer.size(role)
    if devices_per_node <= 0:
        return size
    if role == BATCH_ROLE:
        return min(size, max(1, devices_per_node // layer.p))
    return min(size, devices_per_node)


def links(kind: str, size: float, p: int, local: int) -> tuple[float, float, float]:
    """(bytes over NVLink, bytes through the NIC, hops) of one collective over p devices, `local`
    of which share a node (see the module doc: ring collectives at the slower of NVLink and the
    NICs of the group's devices in a node, all-to-all bytes for other nodes through the NIC, a
    ppermute hop at the NIC's pace)."""
    wire, hops = _wire(kind, size, p)
    if p <= local:
        return wire, 0.0, hops
    if kind == "all-to-all":
        return size * (local - 1) / p, size * (p - local) / p, hops
    if kind == "collective-permute":
        return 0.0, wire, hops
    return wire, wire / local, hops


def shape_shared(shape: Shape) -> bool:
    """Devices share cores (simulated CPU devices): the mean device's work is what costs time."""
    return shape.backend == "cpu"


def collective_time(coeffs: "TimeCoefficients", kind: str, size: float, p: int, local: int) -> float:
    """Seconds of one collective of `kind` over p devices handling `size` bytes (as `_wire`),
    `local` of the p devices in one node."""
    return coeffs.link_time(kind, *links(kind, size, p, local))


def layer_work(shape: Shape, strategy: str, remat: str = "none", skip_masked: bool = True,
               devices_per_node: int = 0) -> LayerWork:
    """FLOPs, elementwise work and communication of one layer of `strategy`, per device, from
    the strategy's description (`Strategy.describe`); collectives split over NVLink and the NICs
    for nodes of `devices_per_node` devices (0: one node).

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
        p = layer.size(c.role)
        _add(w.comm, c.kind, c.size, p, c.count)
        intra, inter, hops = links(c.kind, c.size, p, in_node(layer, c.role, devices_per_node))
        w.links.append((c.kind, c.count * intra, c.count * inter, c.count * hops, c.prefetch))
    # ring steps: the compute that runs while one hop is in flight, on the priced device
    sel = mean if shape_shared(shape) else crit
    fwd_flops = 4 * att.rows * att.heads * spec.head_dim * att.s_q * att.s_kv * sel
    fwd_elems = att.rows * att.heads * att.s_q * att.s_kv * sel
    local = in_node(layer, MODEL_ROLE, devices_per_node)  # ring steps run over the model group
    for r in desc.ring_steps:
        size = r.size if r.kind == "collective-permute" else _wire(r.kind, r.size, shape.p)[0]
        w.ring_steps.append((r.hops, size, (r.matmul_flops, fwd_flops * r.attention, fwd_elems * r.scores)))
        intra, inter, _ = links(r.kind, r.size, shape.p, local)
        w.ring_links.append((intra, inter))
    return w


def layer_time(shape: Shape, strategy: str, remat: str, coeffs: TimeCoefficients) -> LayerTime:
    """Predicted seconds of one layer's forward + backward per device."""
    w = layer_work(shape, strategy, remat, devices_per_node=coeffs.devices_per_node)
    attn = w.attn_flops_mean if coeffs.shared_compute else w.attn_flops
    elems = w.score_elems_mean if coeffs.shared_compute else w.score_elems
    attention = attn / coeffs.attn_flops + elems / coeffs.elem_rate + w.iterations * coeffs.iter_overhead
    compute = w.matmul_flops / coeffs.matmul_flops + w.act_bytes / coeffs.mem_bw
    comm, weights = 0.0, 0.0
    for kind, intra, inter, hops, prefetch in w.links:
        t = coeffs.link_time(kind, intra, inter, hops)
        if prefetch and coeffs.overlap:
            weights += t
        else:
            comm += t
    exposed = max(weights - attention - compute, 0.0)  # weight collectives longer than the compute
    ring = 0.0
    for (hops, _, (mm, at, el)), (intra, inter) in zip(w.ring_steps, w.ring_links):
        transfer = coeffs.link_time("collective-permute", intra, inter, 0.0)
        lat = coeffs.inter_lat("collective-permute") if inter else coeffs.lat("collective-permute")
        if coeffs.overlap:
            # a step costs max(its compute, the next block's transfer) + latency: only the
            # transfer not hidden behind compute (the METP full-overlap condition) is added
            step_compute = mm / coeffs.matmul_flops + at / coeffs.attn_flops + el / coeffs.elem_rate
            ring += hops * (max(transfer - step_compute, 0.0) + lat)
        else:
            ring += hops * (transfer + lat)
    return LayerTime(compute=compute, comm=comm + exposed, ring=ring, overhead=coeffs.layer_overhead,
                     attention=attention, hidden=weights - exposed)


def switch_time(shape: Shape, a: str, b: str, coeffs: TimeCoefficients) -> float:
    """Seconds to move [b, s, h] activations from a's boundary layout to b's (forward and the
    gradient back): a gather over the model group into a layout replicated over it, an
    all-to-all over all devices otherwise (between batch- and sequence-sharded)."""
    if same_boundary(a, b):
        return 0.0
    size = max(boundary_bytes(shape, a), boundary_bytes(shape, b))
    if not all(get_strategy(x).boundary.uses_model_group() for x in (a, b)):
        kind, role = "all-gather", MODEL_ROLE
    else:
        kind, role = "all-to-all", DEVICES_ROLE
    layer = shape.layer
    return 2 * collective_time(coeffs, kind, size, layer.size(role), in_node(layer, role, coeffs.devices_per_node))


def base_time(shape: Shape, vocab: int, n_layers: int, coeffs: TimeCoefficients,
              optimizer_slots: Optional[int] = None, grad_accum: int = 1) -> float:
    """Embedding + head matmul + loss (worst over the strategies' layouts) + optimizer update.

    The chunked loss (`sharding.ops.chunked_loss`) runs the head matmul four times (forward,
    its recompute in the backward, and the two gradients) and moves the head's bytes three times
    (a gather, or the ring's blocks forward; blocks and their gradients backward). With
    `grad_accum` > 1, `shape` is one micro-batch: the head and loss run once per micro-batch,
    each adds its gradients into the running sum, and the update runs once."""
    spec, N = shape.spec, shape.n_devices
    h = spec.d_model
    tokens = shape.batch * shape.seq_len / N  # every strategy spreads the loss's tokens over N devices
    head = 4 * 2 * tokens * h * vocab / coeffs.matmul_flops
    softmax = 3 * tokens * vocab / coeffs.elem_rate
    local_layer, _ = layer_param_elems(spec, N)
    params = local_layer * n_layers + embedding_elems(vocab, h, N) + h
    slots = shape.optimizer_slots if optimizer_slots is None else optimizer_slots
    update = params * shape.param_bytes * (3 + 2 * slots) / coeffs.mem_bw
    local = in_node(shape.layer, DEVICES_ROLE, coeffs.devices_per_node)
    gather = collective_time(coeffs, "all-gather", vocab * h * shape.param_bytes, N, local)
    accumulate = 3 * params * shape.param_bytes / coeffs.mem_bw if grad_accum > 1 else 0.0
    return grad_accum * (head + softmax + 3 * gather + accumulate) + update


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
