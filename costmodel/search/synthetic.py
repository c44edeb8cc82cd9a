"""Synthetic cost tables for testing and benchmarking the plan search (not the real cost model).

`random_table` draws time/memory trade-offs at random (optionally with boundary-layout classes
for the switch matrices, as real tables have them); `layer_table` builds a structured table
for one (batch, seq_len) bucket on one node from the analytical per-operator model of
`costmodel.search.ilp` (strategies x remat policies). Both return `costmodel.table.CostTable`.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


def _classes():
    from costmodel.table import Choice, CostTable
    return Choice, CostTable


STRATEGIES = ("dp", "fsdp", "tp", "tp_sp", "ring", "ulysses", "metp")
LAYOUT = {"dp": 0, "fsdp": 0, "tp": 1, "tp_sp": 2, "ring": 2, "ulysses": 2, "metp": 2}


def random_table(seed: int, n_layers: int = 24, n_choices: int = 6, *, switching: bool = True,
                 layout_classes: Optional[int] = 3, peaks: bool = True, integer_mib: bool = False,
                 names: Optional[Sequence[str]] = None):
    """A random table: faster choices store more; transients and switch costs random.

    layout_classes: switch costs depend only on the pair of classes the choices fall in (0 within
    a class), None: every pair random. integer_mib: all bytes whole MiB (the DP grid is exact).
    """
    Choice, CostTable = _classes()
    rng = np.random.default_rng(seed)
    K = n_choices
    t = np.sort(rng.uniform(1e-3, 4e-3, K))
    w = np.sort(rng.uniform(50, 800, K))[::-1] * 2**20 * rng.uniform(0.8, 1.2, K)  # fast = large, noisy
    pk = rng.uniform(20, 400, K) * 2**20 if peaks else np.zeros(K)
    if layout_classes:
        cls = rng.integers(0, layout_classes, K)
        ct = rng.uniform(0.02e-3, 0.4e-3, (layout_classes, layout_classes))
        cb = rng.uniform(10, 300, (layout_classes, layout_classes)) * 2**20
        np.fill_diagonal(ct, 0)
        np.fill_diagonal(cb, 0)
        swt, swb = ct[np.ix_(cls, cls)], cb[np.ix_(cls, cls)]
    else:
        swt = rng.uniform(0.02e-3, 0.4e-3, (K, K))
        swb = rng.uniform(10, 300, (K, K)) * 2**20
        np.fill_diagonal(swt, 0)
        np.fill_diagonal(swb, 0)
    if not switching:
        swt, swb = np.zeros((K, K)), np.zeros((K, K))
    if integer_mib:
        w, pk, swb = (np.round(x / 2**20) * 2**20 for x in (w, pk, swb))
    names = list(names) if names else [f"s{i}" for i in range(K)]
    choices = tuple(Choice(names[i], "none") for i in range(K))
    base = int(rng.uniform(1, 4) * 2**30)
    if integer_mib:
        base = int(round(base / 2**20)) * 2**20
    return CostTable(choices=choices, n_layers=n_layers, layer_time_s=t, layer_stored_bytes=w,
                     layer_peak_bytes=pk, base_bytes=base, base_time_s=float(rng.uniform(1e-3, 5e-3)),
                     switch_time_s=swt, switch_bytes=swb)


def budget_between(table, frac: float) -> float:
    """A budget at `frac` of the way from the leanest all-layers plan's bytes to the fastest's."""
    from costmodel.search._common import arrays, evaluate, leanest_uniform
    a = arrays(table)
    lo = evaluate(a, [leanest_uniform(a)] * a.L)[1]
    hi = evaluate(a, [int(np.argmin(a.t))] * a.L)[1]
    return float(lo + frac * (hi - lo))


def layer_table(model, seq_len: int, batch: int, *, n_devices: int = 8, profile="a100-80gb",
                remats: Sequence[str] = ("none", "dots", "full"), strategies: Sequence[str] = STRATEGIES,
                mfu: float = 0.5, flash: bool = True):
    """A structured per-layer table for one bucket on one node of `n_devices` (ParaDySe's setting).

    Built from `costmodel.search.ilp`'s per-operator model with dysejax's unified storage (every
    weight stored once, split over the node: states are the same for every strategy; dp and the
    ZeRO-3-style strategies gather weights transiently). remat: `full` keeps only the layer input
    and recomputes the forward (+1 forward of compute, the layer's activations become transient),
    `dots` keeps the matmul outputs (about half the activations) and recomputes the rest (+10%).
    """
    from costmodel.hardware import get_profile
    from costmodel.search import ilp as I
    Choice, CostTable = _classes()
    prof = get_profile(profile) if isinstance(profile, str) else profile
    cl = I.Cluster(n_devices=n_devices, profile=prof, mfu=mfu)
    wl = I.Workload(seq_len=seq_len, micro_batch=batch, global_batch=batch * cl.d, flash=flash)
    choices, t, w, pk = [], [], [], []
    for s in strategies:
        st = I.Strategy(s, "rep")
        if not I.valid(model, wl, cl, st):
            continue
        ops = [I.op_cost(model, wl, cl, kind, st) for kind in ("attn", "mlp")]
        act = sum(o.act_bytes for o in ops)
        states = sum(o.param_count for o in ops) * 16 / cl.m  # unified storage: stored once per node
        trans = max(o.transient_bytes for o in ops)
        step = sum(o.step_time_s for o in ops)
        comp = sum(o.compute_s for o in ops)
        inp = 2 * batch * seq_len * model.d_model / (1 if LAYOUT[s] == 1 else cl.m)
        for r in remats:
            if r == "none":
                stored, peak, time = act, trans, step
            elif r == "full":
                stored, peak, time = inp, trans + act, step + comp / 3
            else:
                stored, peak, time = 0.5 * act, trans + 0.5 * act, step + 0.1 * comp
            choices.append(Choice(s, r))
            t.append(time)
            w.append(stored + states)
            pk.append(peak)
    cls = np.array([LAYOUT[c.strategy] for c in choices])
    X = 2 * batch * seq_len * model.d_model
    units = I.edge_units(cls[:, None], cls[None, :], cl.m)  # [K, K]
    swt = units * X / cl.m * (cl.m - 1) / cl.m / prof.intra_node_bw + (units > 0) * prof.link_latency_s
    swb = (units > 0) * X / cl.m * 2
    P_embed = model.vocab * model.d_model
    base = P_embed * (16 / cl.m) * (1 if model.tied else 2) + 4 * batch * seq_len * model.vocab / cl.m
    base_t = 3 * 2 * 2 * batch * seq_len * P_embed / (cl.m * prof.flops * mfu)
    return CostTable(choices=tuple(choices), n_layers=model.n_layers, layer_time_s=np.array(t),
                     layer_stored_bytes=np.array(w), layer_peak_bytes=np.array(pk), base_bytes=int(base),
                     base_time_s=float(base_t), switch_time_s=swt, switch_bytes=swb, batch=batch,
                     seq_len=seq_len, mesh_shape={"data": n_devices}, hardware=prof.name)
