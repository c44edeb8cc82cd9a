"""PTIP: DP x TP x PP degrees and the layer -> stage assignment as one mixed-integer program.

Self-contained analytical model of a GPT-like model on a cluster of `n` GPUs (profiles from
`costmodel.hardware`; nodes of `devices_per_node`), for one configuration
(dp, tp, pp, micro-batch, ZeRO-1 on/off, sequence parallel on/off) with `n_k` layers on stage k
(stages hold consecutive layers; the embedding is on stage 0, the head on the last stage):

  time, per micro-batch of `mb` sequences of length s (fwd + bwd = 3x forward FLOPs):
    layer   tau = 3 F_layer / (tp * peak * mfu) + 4 all-reduces of the [mb, s, h] activations
            over the TP group (2 fwd, 2 bwd; 2 (tp-1)/tp bytes per byte, NVLink; tp stays within a
            node). With sequence parallelism: 4 all-gathers + 4 reduce-scatters (same bytes).
    stage   T_k = n_k tau + embedding (k = 0) + head and loss (k = pp-1)
            + p2p: on each of its boundaries activations and gradients, mb s h 2 / tp bytes each
            (InfiniBand when a stage group fills nodes, NVLink otherwise).
    iteration  sum_k T_k + (m - 1) max_k T_k            (1F1B / GPipe fill-drain bubble; m micro-
            batches = global_batch / (dp mb)) + max_k DP gradient all-reduce of the stage's
            2 P_k / tp fp16 gradients over the dp replicas (ring, 2 (dp-1)/dp; NVLink when the DP
            group lies within a node, InfiniBand otherwise; ZeRO-1 = reduce-scatter + all-gather,
            the same bytes) + the optimizer update (memory bound).
  memory, per device of stage k (must be <= memory_fraction x device memory):
    model states 16 bytes/param (ZeRO): P_k / tp x (16, or 4 + 12 / dp with ZeRO-1)
    activations  Megatron (Korthikanti et al. 2022) per layer per micro-batch:
            s b h (10 + 24/tp + 5 a s / (h tp)), with SP s b h (34 + 5 a s / h) / tp
            (the 5 a s / h score term dropped with flash=True); stage k of 1F1B keeps
            min(pp - k, m) micro-batches in flight; + embedding output, fp32 logits on the last
            stage, and one layer's MLP workspace.
  With tied embeddings and pp > 1 the last stage holds a copy of the table (as Megatron does).

The MIP (HiGHS): per candidate configuration c a binary u_c (exactly one chosen), integer
stage sizes n_{c,k} (sum_k n_{c,k} = L u_c, n_{c,k} >= u_c), stage times linear in n, an
auxiliary T_c >= T_{c,k} for the max (the bubble term (m_c - 1) T_c is then linear), an auxiliary
G_c >= DP sync of every stage, memory rows per stage; minimise the iteration time. Layers are
identical, so a contiguous assignment is given by the stage sizes (layers
[sum_{j<k} n_j, sum_{j<=k} n_j) go to stage k).

Megatron-LM's standard configuration: TP = devices per node, PP across nodes only if the model
does not fit (smallest power of two that fits with an even split), DP for the rest,
micro-batch 1, no ZeRO-1 / SP, layers split evenly.
All figures are model predictions (simulated), not measurements.
"""
from __future__ import annotations

import time as _time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from costmodel.hardware import DeviceProfile, get_profile
from costmodel.pipeline import fill_drain_time, flowshop_time, in_flight, transfer_time
from costmodel.search._common import ConstraintRows
from costmodel.search.ilp import ModelShape

__all__ = ["PipeWorkload", "PipeCluster", "PipeConfig", "PipePlan", "evaluate", "even_split", "megatron_config",
           "ptip_plan", "candidate_configs"]


@dataclass(frozen=True)
class PipeWorkload:
    seq_len: int = 2048
    global_batch: int = 512  # sequences per iteration
    flash: bool = False
    act_bytes: int = 2


@dataclass(frozen=True)
class PipeCluster:
    n_devices: int
    profile: DeviceProfile
    mfu: float = 0.5
    memory_fraction: float = 0.9  # usable share of device memory (allocator, buffers, fragmentation)
    mem_bw: float = 2.0e12  # HBM bytes/s for the optimizer update

    def __post_init__(self):
        if isinstance(self.profile, str):
            object.__setattr__(self, "profile", get_profile(self.profile))

    @property
    def node(self) -> int:
        return self.profile.devices_per_node

    @property
    def memory_limit(self) -> float:
        return self.memory_fraction * self.profile.memory_bytes


@dataclass(frozen=True)
class PipeConfig:
    dp: int
    tp: int
    pp: int
    micro_batch: int = 1
    zero1: bool = False
    sp: bool = False

    @property
    def label(self) -> str:
        extra = ("+zero1" if self.zero1 else "") + ("+sp" if self.sp else "")
        return f"dp{self.dp} tp{self.tp} pp{self.pp} mb{self.micro_batch}{extra}"


@dataclass
class PipePlan:
    config: PipeConfig
    layers_per_stage: tuple
    iter_time_s: float
    stage_time_s: tuple  # per micro-batch
    stage_bytes: tuple
    fits: bool
    bubble_s: float
    dp_sync_s: float
    micro_batches: int
    search_s: float = 0.0
    info: dict = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.info.get("tokens", 0) / self.iter_time_s if self.iter_time_s else 0.0

    def summary(self) -> str:
        return (f"{self.config.label}  layers/stage {list(self.layers_per_stage)}  iteration "
                f"{self.iter_time_s:.3f} s  max {max(self.stage_bytes) / 2**30:.1f} GiB"
                f"{'' if self.fits else '  DOES NOT FIT'}")


@dataclass(frozen=True)
class _Coeffs:
    """Stage k: time = a n_k + b[k]; bytes = al[k] n_k + be[k]; DP sync + update = g n_k + de[k]."""

    a: float
    b: np.ndarray
    al: np.ndarray
    be: np.ndarray
    g: float
    de: np.ndarray
    m: int


def _coeffs(model: ModelShape, wl: PipeWorkload, cl: PipeCluster, cfg: PipeConfig) -> _Coeffs:
    prof = cl.profile
    s, h, a, V = wl.seq_len, model.d_model, model.n_heads, model.vocab
    mb, t, pp, d = cfg.micro_batch, cfg.tp, cfg.pp, cfg.dp
    m = max(1, wl.global_batch // (d * mb))
    rate = t * prof.flops * cl.mfu
    lat = prof.link_latency_s
    X = float(mb * s * h * wl.act_bytes)
    # layer time
    f_layer = 2.0 * mb * s * (model.params("attn") + model.params("mlp")) + 4.0 * mb * s * s * h
    tp_comm = 0.0 if t == 1 else 4 * (2 * (t - 1) / t * X / prof.intra_node_bw + 2 * lat)
    tau = 3 * f_layer / rate + tp_comm
    # embedding, head
    t_embed = (0.0 if t == 1 else 2 * (t - 1) / t * X / prof.intra_node_bw + lat)
    t_head = 3 * 2.0 * mb * s * h * V / rate + (0.0 if t == 1 else 2 * (2 * (t - 1) / t * X / prof.intra_node_bw + lat))
    # p2p between stages
    cross = t * d >= cl.node
    bw_pp = prof.inter_node_bw if cross else prof.intra_node_bw
    c1 = transfer_time(X / t, bw_pp, lat)  # one transfer of a micro-batch's activations (or their gradients)
    b = np.zeros(pp)
    if pp > 1:
        b += 2 * 2 * c1  # fwd out/in + bwd in/out on each of the (up to) two boundaries
        b[0] -= 2 * c1
        b[-1] -= 2 * c1
    b[0] += t_embed
    b[-1] += t_head
    # memory
    P_layer = model.params("attn") + model.params("mlp")
    P_embed = model.params("embed")
    P_head = model.params("embed") if (model.tied and pp > 1) else model.params("head")
    per_param = (4.0 + 12.0 / d) if cfg.zero1 else 16.0
    sbh = float(s * mb * h)
    score = 0.0 if wl.flash else 5.0 * a * s / h
    A_layer = sbh * (34 + score) / t if cfg.sp else sbh * (10 + 24 / t + score / t)
    inflight = np.array([in_flight(k, pp, m, "1f1b") for k in range(pp)], dtype=float)
    al = per_param * P_layer / t + inflight * A_layer
    be = np.zeros(pp)
    be[0] += per_param * P_embed / t + inflight[0] * 3 * sbh / (t if cfg.sp else 1)
    be[-1] += per_param * P_head / t + 4.0 * mb * s * V / t + 4 * sbh / (t if cfg.sp else 1)
    be += 2 * mb * s * model.d_ff * wl.act_bytes * 2 / t  # one layer's MLP workspace
    # DP gradient sync per iteration (+ optimizer update, memory bound over the local states)
    bw_dp = prof.intra_node_bw if t * d <= cl.node else prof.inter_node_bw
    ring = 0.0 if d == 1 else 2 * (d - 1) / d / bw_dp
    g = ring * 2.0 * P_layer / t
    de = np.zeros(pp)
    de[0] += ring * 2.0 * P_embed / t
    de[-1] += ring * 2.0 * P_head / t
    if d > 1:
        de += 2 * (d - 1) * lat
    upd = (16.0 / (d if cfg.zero1 else 1)) * 2 / cl.mem_bw  # read + write the fp32 states
    g += upd * P_layer / t
    de[0] += upd * P_embed / t
    de[-1] += upd * P_head / t
    return _Coeffs(a=tau, b=b, al=al, be=be, g=g, de=de, m=m)


def evaluate(model: ModelShape, wl: PipeWorkload, cl: PipeCluster, cfg: PipeConfig,
             layers_per_stage: Sequence[int]) -> PipePlan:
    """Iteration time and per-device bytes of a configuration with these stage sizes."""
    n = np.asarray(layers_per_stage, dtype=float)
    if n.size != cfg.pp or int(n.sum()) != model.n_layers:
        raise ValueError(f"{cfg.pp} stages must hold {model.n_layers} layers, got {list(layers_per_stage)}")
    c = _coeffs(model, wl, cl, cfg)
    T = c.a * n + c.b
    mem = c.al * n + c.be
    sync = float((c.g * n + c.de).max())
    bubble = fill_drain_time(T)  # fill/drain beyond m x the bottleneck stage
    it = float(flowshop_time(T, c.m) + sync)
    return PipePlan(config=cfg, layers_per_stage=tuple(int(x) for x in n), iter_time_s=it,
                    stage_time_s=tuple(float(x) for x in T), stage_bytes=tuple(float(x) for x in mem),
                    fits=bool(mem.max() <= cl.memory_limit), bubble_s=bubble, dp_sync_s=sync, micro_batches=c.m,
                    info={"tokens": wl.global_batch * wl.seq_len})


def even_split(n_layers: int, pp: int) -> list:
    q, r = divmod(n_layers, pp)
    return [q + (1 if k < r else 0) for k in range(pp)]


def megatron_config(model: ModelShape, wl: PipeWorkload, cl: PipeCluster) -> PipePlan:
    """TP = devices per node, PP across nodes only if needed (even split), DP for the rest, mb 1."""
    t = min(cl.node, cl.n_devices)
    while t > 1 and (model.n_heads % t or model.d_ff % t):
        t //= 2
    nodes = cl.n_devices // t
    best = None
    pp = 1
    while pp <= nodes and pp <= model.n_layers:
        if nodes % pp == 0:
            cfg = PipeConfig(dp=nodes // pp, tp=t, pp=pp, micro_batch=1)
            plan = evaluate(model, wl, cl, cfg, even_split(model.n_layers, pp))
            if plan.fits:
                return plan
            best = best or plan
        pp *= 2
    best.info["note"] = "no Megatron configuration fits; smallest pipeline shown"
    return best


def candidate_configs(model: ModelShape, wl: PipeWorkload, cl: PipeCluster, micro_batches=(1, 2, 4),
                      zero1=(False,), sp=(False,)) -> list:
    out = []
    n = cl.n_devices
    for t in (1, 2, 4, 8, 16):
        if t > min(cl.node, n) or n % t or model.n_heads % t or model.d_ff % t:
            continue
        for pp in range(1, min(model.n_layers, n // t) + 1):
            if (n // t) % pp:
                continue
            d = n // (t * pp)
            for mb in micro_batches:
                if wl.global_batch % (d * mb):
                    continue
                for z in zero1:
                    if z and d == 1:
                        continue
                    for q in sp:
                        if q and t == 1:
                            continue
                        out.append(PipeConfig(dp=d, tp=t, pp=pp, micro_batch=mb, zero1=z, sp=q))
    return out


def ptip_plan(model: ModelShape, wl: PipeWorkload, cl: PipeCluster, *, micro_batches=(1, 2, 4),
              zero1: Sequence[bool] = (False,), sp: Sequence[bool] = (False,), time_limit: float = 120.0) -> PipePlan:
    """The fastest (dp, tp, pp, mb[, zero1, sp]) and stage sizes by one MIP (see module doc)."""
    from scipy.optimize import Bounds, milp

    t0 = _time.perf_counter()
    L = model.n_layers
    cfgs = candidate_configs(model, wl, cl, micro_batches, zero1, sp)
    co = [_coeffs(model, wl, cl, c) for c in cfgs]
    # variable layout per config c: u_c, n_{c,0..pp-1}, T_c, G_c
    off, nv = [], 0
    for c in cfgs:
        off.append(nv)
        nv += 1 + c.pp + 2
    obj = np.zeros(nv)
    lo_b, hi_b = np.zeros(nv), np.full(nv, np.inf)
    integ = np.zeros(nv)
    rows = ConstraintRows()
    add = rows.add

    mlim = cl.memory_limit / 2**30
    for c, k0, cf in zip(cfgs, off, co):
        u, ns, T, G = k0, list(range(k0 + 1, k0 + 1 + c.pp)), k0 + 1 + c.pp, k0 + 2 + c.pp
        integ[u] = 1
        hi_b[u] = 1
        for v in ns:
            integ[v] = 1
            hi_b[v] = L
        # objective: sum_k T_k + (m-1) T + G  (time in seconds)
        obj[ns] = cf.a
        obj[u] = float(cf.b.sum())
        obj[T] = cf.m - 1
        obj[G] = 1.0
        add(ns + [u], [1.0] * c.pp + [-float(L)], 0.0, 0.0)  # sum n = L u
        for k, v in enumerate(ns):
            add([v, u], [1.0, -1.0], 0.0, np.inf)  # n_k >= u
            add([T, v, u], [1.0, -cf.a, -float(cf.b[k])], 0.0, np.inf)  # T >= a n_k + b_k
            add([G, v, u], [1.0, -cf.g, -float(cf.de[k])], 0.0, np.inf)  # G >= g n_k + de_k
            add([v, u], [float(cf.al[k]) / 2**30, float(cf.be[k]) / 2**30 - mlim], -np.inf, 0.0)  # memory
    add([k0 for k0 in off], [1.0] * len(off), 1.0, 1.0)
    res = milp(obj, constraints=rows.constraint(nv), integrality=integ, bounds=Bounds(lo_b, hi_b),
               options={"time_limit": time_limit, "mip_rel_gap": 1e-7})
    if res.x is None:
        plan = megatron_config(model, wl, cl)
        plan.info.update(status=str(res.message), note="PTIP found no feasible configuration")
        return plan
    ci = int(np.argmax([res.x[k0] for k0 in off]))
    c, k0 = cfgs[ci], off[ci]
    n = [int(round(res.x[k0 + 1 + k])) for k in range(c.pp)]
    plan = evaluate(model, wl, cl, c, n)
    plan.search_s = _time.perf_counter() - t0
    plan.info.update(status=str(res.message), objective_s=float(res.fun), configs=len(cfgs), variables=int(nv))
    return plan
