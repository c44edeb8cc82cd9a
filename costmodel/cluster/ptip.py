"""PTIP: DP x TP x PP degrees and the layer -> stage assignment as one mixed-integer program.

A configuration (dp, tp, pp, micro-batch, ZeRO-1 on/off, sequence parallel on/off) with n_k
layers on stage k (stages hold consecutive layers) on a `Cluster`, for a `Workload`
(`global_batch` sequences of `seq_len`; the micro-batch is searched). Each layer is priced by
the shared cost model (`costmodel.cluster.layers`: the cost table `parallel.plan: auto`
searches) on a tensor-parallel group of tp devices running `micro_batch` sequences: the
strategy `tp` (Megatron TP; `tp_sp` with sequence parallelism). Per device:

  time, per micro-batch:
    stage   T_k = n_k tau + the model's ends (embedding, head, loss) on the last stage
            + p2p: on each of its boundaries activations and gradients, mb s h e / tp bytes
            each (InfiniBand when a stage group fills nodes, NVLink otherwise)
            tau = the layer's forward + backward (the table's, its TP collectives included)
    iteration  sum_k T_k + (m - 1) max_k T_k (1F1B / GPipe fill-drain bubble; m micro-
            batches = global_batch / (dp mb)) + max_k (DP gradient all-reduce of the stage's
            gradients over the dp replicas (ring, 2 (dp-1)/dp; NVLink when the DP group lies
            within a node, InfiniBand otherwise; ZeRO-1 = reduce-scatter + all-gather, the same
            bytes) + the stage's optimizer update (the table's, / dp with ZeRO-1))
  memory, per device of stage k (must be <= the cluster's usable memory):
    n_k (states, x (2 + slots / dp) / (2 + slots) with ZeRO-1, + the update buffer)
    + n_k x in-flight micro-batches x the layer's activations (stage k of 1F1B keeps
    min(pp - k, m)) + the largest transient (the loss's on the last stage) + the model's ends
    on the first and the last stage (a tied table is copied there, as Megatron does).

The MIP (HiGHS): per candidate configuration c a binary u_c (exactly one chosen), integer
stage sizes n_{c,k} (sum_k n_{c,k} = L u_c, n_{c,k} >= u_c), stage times linear in n, an
auxiliary T_c >= T_{c,k} for the max (the bubble term (m_c - 1) T_c is then linear), an auxiliary
G_c >= DP sync of every stage, memory rows per stage; minimise the iteration time. Layers are
identical, so a contiguous assignment is given by the stage sizes (layers
[sum_{j<k} n_j, sum_{j<=k} n_j) go to stage k).

Megatron-LM's standard configuration: TP = devices per node, PP across nodes only if the model
does not fit (smallest power of two that fits with an even split), DP for the rest,
micro-batch 1, no ZeRO-1 / SP, layers split evenly; priced by the same model (like for like:
the model config's attention, blockwise = flash-style, on both sides).
All figures are model predictions (simulated), not measurements.
"""
from __future__ import annotations

import time as _time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from costmodel.cluster.layers import group_costs
from costmodel.cluster.megatron import tensor_parallel
from costmodel.cluster.pipeline import boundary_bytes, fill_drain_time, flowshop_time, in_flight, transfer_time
from costmodel.cluster.rows import ConstraintRows
from costmodel.cluster.workload import Cluster, Model, Workload

__all__ = ["PipeConfig", "PipePlan", "evaluate", "even_split", "megatron_config", "ptip_plan", "candidate_configs"]


@dataclass(frozen=True)
class PipeConfig:
    """One way to split the cluster: data, tensor and pipeline degrees and the micro-batch."""

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
    """A configuration, its layers per stage and what the model predicts for it."""

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


def _strategy(cfg: PipeConfig) -> str:
    return tensor_parallel(cfg.sp)


def _layer_costs(model: Model, wl: Workload, cl: Cluster, cfg: PipeConfig):
    """The shared cost model's costs of one layer of this configuration (None: it cannot run)."""
    gc = group_costs(model, cl.profile, cfg.tp, cfg.micro_batch, wl.seq_len, strategies=(_strategy(cfg),))
    return None if gc is None else (gc, gc.index(_strategy(cfg)))


def _coeffs(model: Model, wl: Workload, cl: Cluster, cfg: PipeConfig) -> _Coeffs:
    prof = cl.profile
    gc, k = _layer_costs(model, wl, cl, cfg)
    t, pp, d = cfg.tp, cfg.pp, cfg.dp
    m = max(1, wl.global_batch // (d * cfg.micro_batch))
    lat = prof.link_latency_s
    # p2p between stages: one micro-batch's activations (or their gradients), split over the TP group
    cross = t * d >= cl.devices_per_node
    c1 = transfer_time(boundary_bytes(cfg.micro_batch, wl.seq_len, model.spec.d_model, model.act_bytes) / t,
                       prof.inter_node_bw if cross else prof.intra_node_bw, lat)
    b = np.zeros(pp)
    if pp > 1:
        b += 2 * 2 * c1  # fwd out/in + bwd in/out on each of the (up to) two boundaries
        b[0] -= 2 * c1
        b[-1] -= 2 * c1
    b[-1] += gc.ends_time_s
    # memory
    slots = model.optimizer_slots
    zero1 = (2 + slots / d) / (2 + slots) if cfg.zero1 else 1.0
    inflight = np.array([in_flight(j, pp, m, "1f1b") for j in range(pp)], dtype=float)
    al = gc.states[k] * zero1 + gc.update_bytes + inflight * gc.activations[k]
    be = np.full(pp, float(gc.peak[k]))
    be[-1] = gc.table.layer_peak_bytes[k]  # the loss's transient, where it runs
    be[0] += gc.ends_bytes
    if pp > 1:
        be[-1] += gc.ends_bytes
    # DP gradient sync per iteration (+ the optimizer update of the stage's states)
    bw_dp = prof.intra_node_bw if t * d <= cl.devices_per_node else prof.inter_node_bw
    ring = 0.0 if d == 1 else 2 * (d - 1) / d / bw_dp
    upd = 1.0 / d if cfg.zero1 else 1.0
    g = ring * gc.grad_bytes[k] + upd * gc.update_time_s
    de = np.zeros(pp)
    de[0] += ring * gc.ends_grad_bytes
    if pp > 1:
        de[-1] += ring * gc.ends_grad_bytes
    if d > 1:
        de += 2 * (d - 1) * lat
    return _Coeffs(a=float(gc.time_s[k]), b=b, al=al, be=be, g=float(g), de=de, m=m)


def evaluate(model: Model, wl: Workload, cl: Cluster, cfg: PipeConfig,
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


def megatron_config(model: Model, wl: Workload, cl: Cluster) -> PipePlan:
    """TP = devices per node, PP across nodes only if needed (even split), DP for the rest, mb 1."""
    t = min(cl.devices_per_node, cl.n_devices)
    while t > 1 and _layer_costs(model, wl, cl, PipeConfig(1, t, 1)) is None:
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


def candidate_configs(model: Model, wl: Workload, cl: Cluster, micro_batches=(1, 2, 4),
                      zero1=(False,), sp=(False,)) -> list:
    """Every configuration the cluster divides into and the layer's strategy can run."""
    out = []
    n = cl.n_devices
    for t in (1, 2, 4, 8, 16):
        if t > min(cl.devices_per_node, n) or n % t:
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
                        cfg = PipeConfig(dp=d, tp=t, pp=pp, micro_batch=mb, zero1=z, sp=q)
                        if (q and t == 1) or _layer_costs(model, wl, cl, cfg) is None:
                            continue
                        out.append(cfg)
    return out


def ptip_plan(model: Model, wl: Workload, cl: Cluster, *, micro_batches=(1, 2, 4),
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
