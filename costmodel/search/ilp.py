"""Minimal-memory-redundancy strategy generation: a per-operator redundant-memory model and an ILP.

Operators: the embedding, per layer {attention, MLP}, and the head (2L + 2). Each operator
picks one strategy = (intra-node strategy, inter-node state handling) on a cluster of
n = m x d devices (m = devices per node run the intra-node strategy, d nodes):

  intra: dp       batch split over the node, weights/grads/optimizer replicated (m replicas)
         fsdp     batch split, all states sharded over the node (ZeRO-3), weights gathered per op
         tp       Megatron column/row tensor parallel; LayerNorm/dropout/op inputs replicated
         tp_sp    tp + sequence parallel: those activations sequence-sharded too
         ring     sequence-sharded, ring attention (K/V travel, online softmax), ZeRO-3 weights
         ulysses  sequence-sharded, all-to-all sequence<->heads around attention, ZeRO-3 weights
         metp     sequence-sharded, weight blocks / K/V travel a ring, nothing gathered
  inter: rep      states replicated over the d nodes (plain data parallel, gradient all-reduce)
         zero1    optimizer states (12 of the 16 bytes/param) sharded over the d nodes
         zero3    all states sharded over the d nodes (gathered per op, every micro-step)

Memory model, per device (bytes; `Workload.micro_batch` sequences of `seq_len` per node per
micro-step, activations in 2-byte precision, Korthikanti et al. 2022 per-layer terms):
  * model states: 16 bytes/param (fp16 param + grad 2 + 2, fp32 master + Adam m, v 12; ZeRO),
    each held by r devices -> per device 16 P r / n; redundant = (r - 1) x shard, summed over
    the group.
  * activations kept for the backward: attention 5 sbh replicated-under-TP (LN input, QKV
    input, dropout mask) + 8 sbh shardable (Q, K, V, projection input) + 5 a s^2 b scores
    (not stored by the online-softmax strategies ring / metp, nor by any strategy with
    `flash=True`); MLP 5 sbh replicated-under-TP + 4 s b d_ff (6 gated) shardable; embedding
    3 sbh; head 4 sbh + 4 s b V fp32 logits. Per strategy: dp/fsdp/tp_sp/ring/ulysses/metp
    hold 1/m of every term, tp holds the replicated terms whole (redundancy (m - 1)/m of them).
    (Per layer with no parallelism this is s b h (34 + 5 a s / h) for d_ff = 4h.)
  * transients (weight gathers, in-flight blocks, MLP intermediates, score blocks): the ILP
    adds the largest one.
Time model (per device, per micro-step, fwd + bwd = 3x forward FLOPs at `mfu` of peak):
  blocking collectives (tp / tp_sp activation all-reduce or all-gather + reduce-scatter,
  ulysses all-to-alls) add to compute; overlappable traffic (ZeRO-3 weight gathers and
  gradient reduce-scatters, ring K/V, METP blocks, inter-node ZeRO-3) only shows where it
  exceeds compute; the inter-node gradient all-reduce (rep / zero1) runs once per iteration,
  not overlapped. Bandwidths from `costmodel.hardware` (NVLink within a node, IB across).
  Resharding between neighbouring operators with different boundary layouts (batch-sharded
  dp/fsdp, replicated tp, sequence-sharded others) costs an all-gather (or two all-to-alls)
  of the [b, s, h] activations per micro-step.

ILP (HiGHS via scipy.optimize.milp): binary x[o, s] one-hot per operator, continuous flow
variables y[o, u, v] over boundary-layout pairs between neighbours (sum_v y = sum_{s in u}
x[o, s], sum_u y = sum_{s in v} x[o+1, s]), z >= every chosen transient; minimise
sum stored bytes + z subject to iteration time <= (1 + slack) x reference time (the fastest
plan's, found by the same ILP with the time objective, or Megatron's) and bytes <= device
memory. Megatron-LM's standard configuration: every operator `tp` (TP = devices per node,
vocabulary-parallel embedding/head), `rep` across nodes (DP), no sequence parallelism.
All figures are model predictions (simulated), not measurements.
"""
from __future__ import annotations

import time as _time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from costmodel.hardware import DeviceProfile, get_profile
from costmodel.search._common import ConstraintRows

__all__ = ["ModelShape", "Workload", "Cluster", "Strategy", "OpCost", "INTRA", "INTER", "op_cost", "valid",
           "edge_units", "plan_cost", "megatron_plan", "min_redundancy_plan", "RedundancyResult", "strategies_for"]

INTRA = ("dp", "fsdp", "tp", "tp_sp", "ring", "ulysses", "metp")
INTER = ("rep", "zero1", "zero3")
LAYOUT = {"dp": 0, "fsdp": 0, "tp": 1, "tp_sp": 2, "ring": 2, "ulysses": 2, "metp": 2}  # batch / replicated / seq
OPS = ("embed", "attn", "mlp", "head")


@dataclass(frozen=True)
class ModelShape:
    """A GPT-like model's shape (what the planners need)."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    d_ff: int
    vocab: int
    gated: bool = True
    tied: bool = False

    @classmethod
    def from_config(cls, path: str) -> "ModelShape":
        """Read `model:` of a dysejax YAML config (n_layers, d_model, n_heads, d_ff, vocab_size)."""
        import os

        import yaml
        with open(path) as f:
            m = yaml.safe_load(f)["model"]
        return cls(name=os.path.splitext(os.path.basename(path))[0], n_layers=int(m["n_layers"]),
                   d_model=int(m["d_model"]), n_heads=int(m["n_heads"]), d_ff=int(m["d_ff"]),
                   vocab=int(m["vocab_size"]), gated=m.get("mlp", "gated") == "gated",
                   tied=bool(m.get("tie_embeddings", False)))

    def params(self, kind: str) -> float:
        h = self.d_model
        if kind == "attn":
            return 4.0 * h * h + 2 * h  # qkv + proj (+ norm)
        if kind == "mlp":
            return (3.0 if self.gated else 2.0) * h * self.d_ff + 2 * h
        if kind == "embed":
            return float(self.vocab * h)
        if kind == "head":
            return 0.0 if self.tied else float(self.vocab * h)
        raise KeyError(kind)

    @property
    def n_params(self) -> float:
        return self.n_layers * (self.params("attn") + self.params("mlp")) + self.params("embed") + self.params("head")


@dataclass(frozen=True)
class Workload:
    """Per iteration `global_batch` sequences of `seq_len`; each node processes `micro_batch`
    sequences per micro-step (gradient accumulation over the rest)."""

    seq_len: int = 2048
    micro_batch: int = 8
    global_batch: int = 512
    flash: bool = True  # no strategy stores the a s^2 b attention scores (False: every strategy does)
    act_bytes: int = 2


@dataclass(frozen=True)
class Cluster:
    n_devices: int
    profile: DeviceProfile
    mfu: float = 0.5  # achieved fraction of peak FLOP/s in matmuls

    def __post_init__(self):
        if isinstance(self.profile, str):
            object.__setattr__(self, "profile", get_profile(self.profile))

    @property
    def m(self) -> int:
        return min(self.n_devices, self.profile.devices_per_node)

    @property
    def d(self) -> int:
        return max(1, self.n_devices // self.m)


@dataclass(frozen=True)
class Strategy:
    intra: str
    inter: str = "rep"

    @property
    def label(self) -> str:
        return self.intra if self.inter == "rep" else f"{self.intra}+{self.inter}"


@dataclass(frozen=True)
class OpCost:
    """One operator under one strategy, per device (model predictions)."""

    kind: str
    strategy: Strategy
    param_count: float
    state_bytes: float
    act_bytes: float
    transient_bytes: float
    redundant_bytes: float  # per device: bytes that are copies of bytes another device holds
    compute_s: float  # per micro-step
    step_time_s: float  # per micro-step: compute + blocking comm + exposed overlappable comm
    iter_time_s: float  # per iteration: gradient synchronisation not overlapped
    layout: int

    @property
    def stored_bytes(self) -> float:
        return self.state_bytes + self.act_bytes


def strategies_for(cl: Cluster, inter: Sequence[str] = INTER, intra: Sequence[str] = INTRA) -> list:
    inter = ["rep"] if cl.d == 1 else list(inter)
    return [Strategy(a, b) for a in intra for b in inter]


def valid(model: ModelShape, wl: Workload, cl: Cluster, st: Strategy) -> bool:
    """Can this strategy serve the shape (divisibility as the dysejax strategies check it)?"""
    m = cl.m
    if st.intra in ("dp", "fsdp"):
        return wl.micro_batch % m == 0
    if st.intra in ("tp", "ulysses", "metp") and model.n_heads % m:
        return False
    if st.intra in ("tp_sp", "ring", "ulysses", "metp") and wl.seq_len % m:
        return False
    if st.intra in ("tp", "tp_sp", "metp") and model.d_ff % m:
        return False
    return True


def _act_terms(model: ModelShape, wl: Workload, kind: str):
    """(replicated-under-TP bytes, shardable bytes, attention-score bytes) of one operator."""
    s, b, h, a = wl.seq_len, wl.micro_batch, model.d_model, model.n_heads
    sbh = float(s * b * h)
    if kind == "embed":
        return 3 * sbh, 0.0, 0.0
    if kind == "attn":
        return 5 * sbh, 8 * sbh, (0.0 if wl.flash else 5.0 * a * s * s * b)
    if kind == "mlp":
        return 5 * sbh, (6.0 if model.gated else 4.0) * s * b * model.d_ff, 0.0
    if kind == "head":
        return 4 * sbh, 4.0 * s * b * model.vocab, 0.0
    raise KeyError(kind)


def _flops_fwd(model: ModelShape, wl: Workload, kind: str) -> float:
    s, b, h = wl.seq_len, wl.micro_batch, model.d_model
    if kind == "attn":
        return 2.0 * b * s * 4 * h * h + 4.0 * b * s * s * h
    if kind == "mlp":
        return 2.0 * b * s * model.params("mlp")
    if kind == "head":
        return 2.0 * b * s * h * model.vocab
    return 0.0


def op_cost(model: ModelShape, wl: Workload, cl: Cluster, kind: str, st: Strategy) -> OpCost:
    """Memory and time of operator `kind` ('embed', 'attn', 'mlp', 'head') under `st`."""
    prof, m, d = cl.profile, cl.m, cl.d
    n = m * d
    Bi, Be, lat = prof.intra_node_bw, prof.inter_node_bw, prof.link_latency_s
    P = model.params(kind)
    if kind == "head" and model.tied:
        P_comm = model.params("embed")  # the tied table is gathered / its grads reduced here too
    else:
        P_comm = P
    s, b, h = wl.seq_len, wl.micro_batch, model.d_model
    X = float(b * s * h * wl.act_bytes)  # the node's [b, s, h] activations
    it = st.intra
    # ---- model states
    fi = 1.0 if it == "dp" else 1.0 / m  # fraction of the op's parameters a device stores within the node
    f_pg = fi / d if st.inter == "zero3" else fi
    f_opt = fi / d if st.inter in ("zero1", "zero3") else fi
    state = P * (4.0 * f_pg + 12.0 * f_opt)
    red_state = state - 16.0 * P / n
    # ---- activations
    rep, shd, sc = _act_terms(model, wl, kind)
    if it in ("ring", "metp"):
        sc = 0.0
    if it == "tp":
        act = rep + (shd + sc) / m
        red_act = rep * (m - 1) / m
    else:
        act = (rep + shd + sc) / m
        red_act = 0.0
    # ---- transients
    f_compute = {"dp": 1.0, "fsdp": 1.0, "ring": 1.0, "ulysses": 1.0, "tp": 1.0 / m, "tp_sp": 1.0 / m,
                 "metp": 1.0 / m}[it]
    trans_w = 4.0 * P_comm * max(0.0, f_compute - f_pg)  # gathered fp16 weights + their grads
    if it == "metp":
        trans_w += 4.0 * P_comm * 2.0 / m  # two travelling blocks (double buffer)
    if kind == "mlp":
        inter_b = float(b * s * model.d_ff * wl.act_bytes * 2)  # MLP intermediate (in + out)
        trans_a = {"dp": inter_b / m, "fsdp": inter_b / m, "tp": inter_b / m, "tp_sp": X + inter_b / m,
                   "ring": inter_b / m, "ulysses": inter_b / m, "metp": inter_b / m / m}[it]
    elif kind == "attn":
        a = model.n_heads
        blk = min(s, 1024)
        flash_blk = 4.0 * b * a * s * blk / m
        trans_a = {"dp": flash_blk, "fsdp": flash_blk, "tp": flash_blk, "tp_sp": X + flash_blk,
                   "ulysses": 3 * X / m + flash_blk, "ring": 4.0 * b * a * (s / m) ** 2 + 2 * X / m,
                   "metp": 4.0 * b * a * s * s / m ** 3 + 2 * X / m ** 2}[it]
    elif kind == "head":
        trans_a = 4.0 * s * b * model.vocab / m
    else:
        trans_a = X / m
    transient = trans_w + trans_a
    # ---- time per micro-step
    flops = 3.0 * _flops_fwd(model, wl, kind)
    compute = flops / (m * prof.flops * cl.mfu)
    unit = X * (m - 1) / m / Bi + lat  # one all-gather or reduce-scatter of the activations
    blocking, ovl = 0.0, 0.0
    if it == "tp":
        blocking += {"attn": 4, "mlp": 4, "embed": 2, "head": 2}[kind] * unit
    elif it == "tp_sp":
        blocking += {"attn": 5, "mlp": 5, "embed": 1, "head": 2}[kind] * unit
    elif it == "ulysses" and kind == "attn":
        blocking += 8 * (X * (m - 1) / m / m / Bi + lat)
    w_bytes = 2.0 * P_comm * (m - 1) / m  # fp16 weights of the op, the part a device lacks
    if it in ("fsdp", "ring", "ulysses", "metp"):
        ovl += 3 * w_bytes / Bi + 3 * (m - 1) * lat  # gather fwd, gather bwd, reduce-scatter grads
    if kind == "attn" and it in ("ring", "metp"):
        ovl += 6 * X * (m - 1) / m / Bi + 3 * (m - 1) * lat  # K/V ring fwd, K/V + dK/dV bwd
    if d > 1 and st.inter == "zero3":
        ovl += 3 * 2.0 * P_comm * fi * (d - 1) / d / Be + 3 * lat
    step = compute + blocking + max(0.0, ovl - compute)
    # ---- per iteration (gradients accumulated over micro-steps, then synchronised)
    itr = 0.0
    if it == "dp":
        itr += 2 * 2.0 * P_comm * (m - 1) / m / Bi + lat  # all-reduce within the node
    if d > 1 and st.inter in ("rep", "zero1"):
        itr += 2 * 2.0 * P_comm / m * (d - 1) / d / Be + lat  # each device's 1/m over the d nodes
    return OpCost(kind=kind, strategy=st, param_count=P, state_bytes=state, act_bytes=act,
                  transient_bytes=transient, redundant_bytes=red_state + red_act, compute_s=compute,
                  step_time_s=step, iter_time_s=itr, layout=LAYOUT[it])


def edge_units(u, v, m: int):
    """Collective units (one all-gather of [b, s, h] = 1) to go from layout u to v, fwd + bwd."""
    u, v = np.asarray(u), np.asarray(v)
    bs = ((u == 0) & (v == 2)) | ((u == 2) & (v == 0))  # batch <-> sequence: all-to-all fwd + bwd
    return np.where(u == v, 0.0, np.where(bs, 2.0 / m, 1.0))


def _edge_time(model, wl, cl, u, v):
    X = float(wl.micro_batch * wl.seq_len * model.d_model * wl.act_bytes)
    un = edge_units(u, v, cl.m)
    return un * X * (cl.m - 1) / cl.m / cl.profile.intra_node_bw + (un > 0) * 2 * cl.profile.link_latency_s


def op_sequence(model: ModelShape) -> list:
    return ["embed"] + ["attn", "mlp"] * model.n_layers + ["head"]


def plan_cost(model: ModelShape, wl: Workload, cl: Cluster, per_op: Sequence[Strategy]) -> dict:
    """Per-device bytes (stored + largest transient), redundant bytes and iteration seconds."""
    ops = op_sequence(model)
    if len(per_op) != len(ops):
        raise ValueError(f"one strategy per operator: expected {len(ops)}, got {len(per_op)}")
    costs = [op_cost(model, wl, cl, k, s) for k, s in zip(ops, per_op)]
    n_micro = wl.global_batch / (wl.micro_batch * cl.d)
    edges = sum(float(_edge_time(model, wl, cl, a.layout, b.layout)) for a, b in zip(costs[:-1], costs[1:]))
    step = sum(c.step_time_s for c in costs) + edges
    stored = sum(c.stored_bytes for c in costs)
    trans = max(c.transient_bytes for c in costs)
    return {"bytes": stored + trans, "stored_bytes": stored, "transient_bytes": trans,
            "state_bytes": sum(c.state_bytes for c in costs), "act_bytes": sum(c.act_bytes for c in costs),
            "redundant_bytes": sum(c.redundant_bytes for c in costs),
            "iter_time_s": n_micro * step + sum(c.iter_time_s for c in costs),
            "tokens_per_s": wl.global_batch * wl.seq_len / (n_micro * step + sum(c.iter_time_s for c in costs))}


def megatron_plan(model: ModelShape, cl: Cluster) -> list:
    """Megatron-LM's standard configuration: TP over the node for every operator, DP across."""
    return [Strategy("tp", "rep")] * len(op_sequence(model))


@dataclass
class RedundancyResult:
    per_op: list  # Strategy per operator
    cost: dict  # plan_cost of the plan
    megatron: dict  # plan_cost of Megatron's configuration
    reference_time_s: float
    time_budget_s: float
    status: str
    search_s: float
    info: dict = field(default_factory=dict)

    @property
    def memory_saving(self) -> float:
        """1 - bytes / Megatron's bytes (per device, model prediction)."""
        return 1.0 - self.cost["bytes"] / self.megatron["bytes"]

    def layer_summary(self) -> str:
        """Strategies of embed | layer 0 attn/mlp ... (runs merged)."""
        labels = [s.label for s in self.per_op]
        out, i = [], 0
        while i < len(labels):
            j = i
            while j < len(labels) and labels[j] == labels[i]:
                j += 1
            out.append(f"{labels[i]}x{j - i}")
            i = j
        return " ".join(out)


def _solve_ilp(model, wl, cl, strategies, objective: str, time_budget: Optional[float],
               memory_limit: Optional[float], time_limit: float = 60.0):
    from scipy.optimize import Bounds, milp

    ops = op_sequence(model)
    kinds = sorted(set(ops))
    table = {k: [op_cost(model, wl, cl, k, s) for s in strategies] for k in kinds}
    ok = {k: np.array([valid(model, wl, cl, s) for s in strategies]) for k in kinds}
    S = len(strategies)
    O = len(ops)
    n_micro = wl.global_batch / (wl.micro_batch * cl.d)
    lay = np.array([LAYOUT[s.intra] for s in strategies])
    U = 3
    E = np.array([[float(_edge_time(model, wl, cl, u, v)) for v in range(U)] for u in range(U)])
    nx = O * S
    ny = (O - 1) * U * U
    nz = nx + ny
    nv = nz + 1
    t_coef = np.zeros(nv)
    m_coef = np.zeros(nv)
    tr_coef = np.zeros((O, S))
    ub = np.ones(nv)
    ub[nz] = np.inf
    for o, k in enumerate(ops):
        for si, c in enumerate(table[k]):
            t_coef[o * S + si] = n_micro * c.step_time_s + c.iter_time_s
            m_coef[o * S + si] = c.stored_bytes
            tr_coef[o, si] = c.transient_bytes
            if not ok[k][si]:
                ub[o * S + si] = 0
    for o in range(O - 1):
        t_coef[nx + o * U * U: nx + (o + 1) * U * U] = n_micro * E.ravel()
    m_coef[nz] = 2.0**30  # z is in GiB
    rows = ConstraintRows()
    add = rows.add

    for o in range(O):
        add([o * S + si for si in range(S)], [1.0] * S, 1.0, 1.0)
        add([o * S + si for si in range(S)] + [nz], list(tr_coef[o] / 2**30) + [-1.0], -np.inf, 0.0)
    for o in range(O - 1):
        base = nx + o * U * U
        for u in range(U):
            mem = [o * S + si for si in range(S) if lay[si] == u]
            add([base + u * U + v for v in range(U)] + mem, [1.0] * U + [-1.0] * len(mem), 0.0, 0.0)
        for v in range(U):
            mem = [(o + 1) * S + si for si in range(S) if lay[si] == v]
            add([base + u * U + v for u in range(U)] + mem, [1.0] * U + [-1.0] * len(mem), 0.0, 0.0)
    tscale = max(float(t_coef.max()), 1e-30)
    if time_budget is not None:
        nzc = np.flatnonzero(t_coef)
        add(list(nzc), list(t_coef[nzc] / tscale), -np.inf, time_budget / tscale)
    if memory_limit is not None:
        nzc = np.flatnonzero(m_coef)
        add(list(nzc), list(m_coef[nzc] / 2**30), -np.inf, memory_limit / 2**30)
    c = (t_coef / tscale) if objective == "time" else (m_coef / 2**30)
    integ = np.zeros(nv)
    integ[:nx] = 1
    res = milp(c, constraints=rows.constraint(nv), integrality=integ, bounds=Bounds(np.zeros(nv), ub),
               options={"time_limit": time_limit, "mip_rel_gap": 1e-6})
    if res.x is None:
        return None, str(res.message)
    xs = res.x[:nx].reshape(O, S)
    return [strategies[int(i)] for i in xs.argmax(1)], str(res.message)


def min_redundancy_plan(model: ModelShape, wl: Workload, cl: Cluster, *, time_slack: float = 0.05,
                        reference: str = "fastest", inter: Sequence[str] = INTER,
                        memory_limit: Optional[float] = None, time_limit: float = 60.0) -> RedundancyResult:
    """Per-operator strategies minimising per-device bytes within (1 + time_slack) x the reference
    iteration time (reference: 'fastest' = the fastest plan that fits the device, 'megatron' =
    Megatron's configuration). inter: the inter-node state options allowed (('rep',) compares
    like for like with Megatron's replicated data parallelism)."""
    t0 = _time.perf_counter()
    strategies = strategies_for(cl, inter)
    mem_limit = cl.profile.memory_bytes if memory_limit is None else memory_limit
    mega = plan_cost(model, wl, cl, megatron_plan(model, cl))
    if reference == "megatron":
        ref = mega["iter_time_s"]
        info = {}
    else:
        fast, msg = _solve_ilp(model, wl, cl, strategies, "time", None, mem_limit, time_limit)
        if fast is None:
            fast, msg = _solve_ilp(model, wl, cl, strategies, "time", None, None, time_limit)
        ref = plan_cost(model, wl, cl, fast)["iter_time_s"]
        info = {"fastest": plan_cost(model, wl, cl, fast), "fastest_plan": [s.label for s in fast]}
    budget = (1.0 + time_slack) * ref
    plan, msg = _solve_ilp(model, wl, cl, strategies, "memory", budget * (1 + 1e-9), None, time_limit)
    if plan is None:
        plan = megatron_plan(model, cl)
    return RedundancyResult(per_op=plan, cost=plan_cost(model, wl, cl, plan), megatron=mega, reference_time_s=ref,
                            time_budget_s=budget, status=msg, search_s=_time.perf_counter() - t0, info=info)
