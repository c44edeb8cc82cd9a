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
from costmodel.memory import (BATCH_PARALLEL, F32, Shape, analytical_features, boundary_bytes,
                              boundary_kind, embedding_elems, layer_param_elems)

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


def _causal_fraction(spec, s_q: int, s_kv: int, tiled: bool) -> float:
    """Share of a causal diagonal block's score tiles that are computed (tiles above the diagonal
    skipped when tiled; a dense kernel computes the whole square)."""
    if not tiled:
        return 1.0
    nt = max(1, math.ceil(s_q / min(spec.attention_block, s_q)))
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
    """FLOPs, elementwise work and communication of one layer of `strategy`, per device.

    skip_masked=False counts every attention tile / ring block as computed (what compiled HLO
    holds: both branches of the kernels' `lax.cond`), for cross-checks against `hlo_dot_flops`."""
    spec, s, p, e, g = shape.spec, shape.seq_len, shape.p, shape.e, shape.g
    h, n, k, f = spec.d_model, spec.n_heads, spec.head_dim, spec.d_ff
    G, Gp = spec.kv_heads, max(spec.kv_heads, p)  # K/V heads; as the model group holds them (replicated when < p)
    qkv = (n + 2 * G) * h * k  # q, k, v projection weights
    N, pb, d = shape.n_devices, shape.param_bytes, shape.d
    bl = shape.local_batch(strategy)
    _, w_full = layer_param_elems(spec, N)
    big = w_full - 2 * h
    per_token_mm = 2 * (qkv + n * k * h + g * h * f + f * h)  # fwd matmul FLOPs per token
    blockwise = spec.use_blockwise(s)
    rec = 1.0 if remat == "full" else 0.0  # extra forward passes of the matmuls
    rec_attn = 1.0 if remat in ("full", "dots") else 0.0  # attention forward recomputed
    w = LayerWork()
    st, _ = analytical_features(shape, strategy, "none")
    w.act_bytes = 3 * (st["act"] + st["quad"]) * (1 + (rec_attn + rec) / 2)
    blk = spec.attention_block
    tiles = lambda sq, skv: math.ceil(sq / min(blk, sq)) * math.ceil(skv / min(blk, skv))  # noqa: E731
    passes = 2 + rec_attn  # forward, backward (+ the recomputed forward)
    if strategy in ("ring", "metp"):
        c = max(1, s // p)
        per_block = tiles(c, c) if (blockwise or strategy == "metp") else 1
        groups = p if strategy == "metp" else 1
        w.iterations = passes * groups * p * (per_block + 1) + (passes * p if strategy == "metp" else 0)
    elif blockwise:
        w.iterations = passes * tiles(s, s)

    def attention(bq_rows, heads, s_q, s_kv, frac, mean_frac=None, flash=True):
        """Score + PV matmul FLOPs and score elements: fwd 2 matmuls, bwd 5 (flash) or 4 (dense)."""
        base = 4 * bq_rows * heads * k * s_q * s_kv
        n_mm = (2 + (5 if flash else 4)) / 2 + rec_attn
        elems = bq_rows * heads * s_q * s_kv * (2 + rec_attn)
        mf = frac if mean_frac is None else mean_frac
        return base * frac * n_mm, base * mf * n_mm, elems * frac, elems * mf

    if strategy in BATCH_PARALLEL or strategy in ("tp", "tp_sp"):
        div = 1 if strategy in BATCH_PARALLEL else p
        tokens = bl * s
        w.matmul_flops = per_token_mm * tokens / div * (3 + rec)
        frac = _causal_fraction(spec, s, s, blockwise and skip_masked)
        a, am, el, elm = attention(bl, n / div, s, s, frac, flash=blockwise)
        w.attn_flops, w.attn_flops_mean, w.score_elems, w.score_elems_mean = a, am, el, elm
        X = tokens * h * e
        if strategy == "dp":
            _add(w.comm, "all-gather", big * pb, N)  # the run's one gather, per layer
            _add(w.comm, "reduce-scatter", big * F32, N)
        elif strategy == "fsdp":
            _add(w.comm, "all-gather", big * pb, N, 1 + (1 if remat != "none" else 0))
            _add(w.comm, "reduce-scatter", big * F32, N)
        elif strategy == "tp":
            _add(w.comm, "all-reduce", X, p, 4)
        else:  # tp_sp: 2 gathers + 2 reduce-scatters forward; re-gathers and transposes backward
            _add(w.comm, "all-gather", X, p, 6)
            _add(w.comm, "reduce-scatter", X, p, 4)
        if strategy in ("tp", "tp_sp") and d > 1:
            _add(w.comm, "all-gather", big / p * pb, d, 1 + (1 if remat != "none" else 0))
            _add(w.comm, "reduce-scatter", big / p * F32, d)
    elif strategy in ("ring", "ulysses"):
        c = s / p
        tokens = bl * c
        w.matmul_flops = per_token_mm * tokens * (3 + rec)
        _add(w.comm, "all-gather", big * pb, N, 1 + (1 if remat != "none" else 0))
        _add(w.comm, "reduce-scatter", big * F32, N)
        A = tokens * n * k * e
        if strategy == "ulysses":
            frac = _causal_fraction(spec, s, s, blockwise and skip_masked)
            a, am, el, elm = attention(bl, n / p, s, s, frac, flash=blockwise)
            w.attn_flops, w.attn_flops_mean, w.score_elems, w.score_elems_mean = a, am, el, elm
            _add(w.comm, "all-to-all", A * (2 * n + 2 * Gp) / (4 * n), p, 4 * (2 + rec_attn / 2))  # q, k, v, o
        else:
            tiled = blockwise
            diag = _causal_fraction(spec, int(c), int(c), tiled)
            # slowest device: p - 1 full blocks + the diagonal; mean device: (p - 1) / 2 full + diagonal
            crit, mean = ((p - 1) + diag, (p - 1) / 2 + diag) if skip_masked else (p, p)
            a, am, el, elm = attention(bl, n, c, c, crit, mean, flash=True)
            w.attn_flops, w.attn_flops_mean, w.score_elems, w.score_elems_mean = a, am, el, elm
            kv = 2 * A * G / n
            fwd_passes = 1 + rec_attn
            # per visiting block: forward 2 score matmuls, backward 5 (flash); each step's block
            # computes while the next hops. Forward: p - 1 K/V hops; backward: p - 1 K/V hops with
            # p dK/dV (f32) hops, one K/V + one dK/dV per step.
            blk_fwd = 4 * bl * n * k * c * c * (mean if shape_shared(shape) else crit) / p
            el_fwd = bl * n * c * c * (mean if shape_shared(shape) else crit) / p
            w.ring_steps.append((fwd_passes * (p - 1), kv, (0.0, blk_fwd, el_fwd)))
            w.ring_steps.append((p - 1, kv + 2 * tokens * G * k * F32, (0.0, 2.5 * blk_fwd, el_fwd)))
            w.ring_steps.append((1, 2 * tokens * G * k * F32, (0.0, 0.0, 0.0)))
    elif strategy == "metp":
        c = s / p
        tokens = bl * c
        w.matmul_flops = per_token_mm * tokens * (3 + rec)
        diag = _causal_fraction(spec, int(c), int(c), True)
        crit, mean = ((p - 1) + diag, (p - 1) / 2 + diag) if skip_masked else (p, p)
        a, am, el, elm = attention(bl, n, c, c, crit, mean, flash=True)
        w.attn_flops, w.attn_flops_mean, w.score_elems, w.score_elems_mean = a, am, el, elm
        # the hand-written backward recomputes the MLP's input projection and q/k/v (not the output
        # projections): matches the dot FLOPs of the compiled HLO
        w.matmul_flops += 2 * tokens * (g * h * f + qkv) * (1 - rec)
        wblk_mlp = (g * h * f + f * h) / p * e
        qkv_grp = (n + 2 * Gp) * h * k  # with K/V heads replicated to whole heads per group
        wblk_att = (qkv_grp + n * k * h) / p * e
        kv = 2 * tokens * (Gp / p) * k * e
        passes = 1 + (1 if remat != "none" else 0)
        mlp_blk = 2 * tokens * (g * h * f + f * h) / p  # forward FLOPs of one weight block on the chunk
        # MLP: a weight block hops while the previous one computes: p - 1 hops per forward; the
        # backward (recompute + 2 gradient matmuls per block) moves block and f32 gradient per step
        w.ring_steps.append((passes * (p - 1), wblk_mlp, (mlp_blk, 0.0, 0.0)))
        w.ring_steps.append((p - 1, wblk_mlp + wblk_mlp / e * F32, (3 * mlp_blk, 0.0, 0.0)))
        w.ring_steps.append((1, wblk_mlp / e * F32, (0.0, 0.0, 0.0)))
        # attention: head group j + 1's weights are broadcast (a masked psum) while group j computes
        # its projections; its K/V blocks then hop an inner ring while each visiting block computes
        proj_grp = 2 * tokens * (qkv_grp + n * k * h) / p
        bw_ar, _ = _wire("all-reduce", wblk_att, p)
        w.ring_steps.append((passes * (p - 1), bw_ar, (proj_grp, 0.0, 0.0)))
        w.ring_steps.append((p - 1, bw_ar, (3 * proj_grp, 0.0, 0.0)))
        _add(w.comm, "all-reduce", wblk_att / e * F32, p * d, p)  # group gradients to their owner
        share = (mean if shape_shared(shape) else crit) / p  # visiting-block work per step
        blk_fwd = 4 * bl * (n / p) * k * c * c * share
        el_fwd = bl * (n / p) * c * c * share
        w.ring_steps.append((passes * p * (p - 1), kv, (0.0, blk_fwd, el_fwd)))
        w.ring_steps.append((p * (p - 1), kv + kv / e * F32, (0.0, 2.5 * blk_fwd, el_fwd)))
        w.ring_steps.append((p, kv / e * F32, (0.0, 0.0, 0.0)))
        if d > 1:
            _add(w.comm, "all-gather", big / p * pb, d, passes)
    else:
        raise KeyError(f"no time model for strategy {strategy!r}")
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
    gradient back): an all-to-all between batch- and sequence-sharded, a gather/slice otherwise."""
    ka, kb = boundary_kind(a), boundary_kind(b)
    if ka == kb:
        return 0.0
    N = shape.n_devices
    size = max(boundary_bytes(shape, a), boundary_bytes(shape, b))
    if "replicated" in (ka, kb):
        kind, size = "all-gather", boundary_bytes(shape, "tp")
        bwire, hops = _wire(kind, size, shape.p)
    else:
        kind = "all-to-all"
        bwire, hops = _wire(kind, size, N)
    return 2 * (bwire / coeffs.bw(kind) + hops * coeffs.lat(kind))


def base_time(shape: Shape, vocab: int, n_layers: int, coeffs: TimeCoefficients,
              optimizer_slots: Optional[int] = None) -> float:
    """Embedding + head matmul + loss (worst over the strategies' layouts) + optimizer update."""
    spec, N = shape.spec, shape.n_devices
    h = spec.d_model
    tokens = shape.batch * shape.seq_len / N  # every strategy spreads the loss's tokens over N devices
    head = 3 * 2 * tokens * h * vocab / coeffs.matmul_flops
    softmax = 3 * tokens * vocab / coeffs.elem_rate
    local_layer, _ = layer_param_elems(spec, N)
    params = local_layer * n_layers + embedding_elems(vocab, h, N) + h
    slots = shape.optimizer_slots if optimizer_slots is None else optimizer_slots
    update = params * shape.param_bytes * (3 + 2 * slots) / coeffs.mem_bw
    gather = vocab * h * shape.param_bytes * (N - 1) / N / coeffs.bw("all-gather") + (N - 1) * coeffs.lat("all-gather")
    return head + softmax + update + 2 * gather


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
