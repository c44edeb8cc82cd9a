"""Cost tables for testing and benchmarking the plan search.

`random_table` draws time/memory trade-offs at random (optionally with boundary-layout classes
for the switch matrices, as real tables have them); `config_table` is the project's cost table
(`costmodel.table.cost_table`) of a shipped config's model for one (batch, seq_len) bucket on
one node (every feasible strategy x remat policy by default). Both return
`costmodel.table.CostTable`; `budget_between` places a budget between a table's leanest and
fastest uniform plans.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional, Sequence

import numpy as np

from costmodel.table import Choice, CostTable


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def random_table(seed: int, n_layers: int = 24, n_choices: int = 6, *, switching: bool = True,
                 layout_classes: Optional[int] = 3, peaks: bool = True, integer_mib: bool = False,
                 names: Optional[Sequence[str]] = None):
    """A random table: faster choices store more; transients and switch costs random.

    layout_classes: switch costs depend only on the pair of classes the choices fall in (0 within
    a class), None: every pair random. integer_mib: all bytes whole MiB (the DP grid is exact).
    """
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
    from costmodel.search.arrays import evaluate, leanest_uniform, table_arrays
    a = table_arrays(table)
    lo = evaluate(a, [leanest_uniform(a)] * a.L)[1]
    hi = evaluate(a, [int(np.argmin(a.t))] * a.L)[1]
    return float(lo + frac * (hi - lo))


def config_model(name: str, n_layers: Optional[int] = None):
    """A shipped config's model (`configs/<name>.yaml`), optionally with another layer count."""
    from costmodel.cluster import load_model
    m = load_model(os.path.join(ROOT, "configs", f"{name}.yaml"))
    return dataclasses.replace(m, n_layers=n_layers) if n_layers else m


def config_table(name: str, seq_len: int, batch: int, *, n_layers: Optional[int] = None, n_devices: int = 8,
                 profile="a100-80gb", remats: Optional[Sequence[str]] = None, strategies=None):
    """The cost table of a shipped config's model for one bucket on one node of `n_devices`
    (ParaDySe's setting): every feasible strategy (or those of `strategies`) x `remats` (default
    every policy, `costmodel.table.REMATS`)."""
    from costmodel.table import REMATS, cost_table, default_choices
    m = config_model(name, n_layers)
    mesh = {"data": n_devices}
    choices = [c for c in default_choices(m.spec, mesh, batch, seq_len, tuple(remats or REMATS))
               if strategies is None or c.strategy in strategies]
    return cost_table(m.spec, mesh, batch, seq_len, m.n_layers, m.vocab, param_bytes=m.param_bytes,
                      hardware=profile, choices=choices, loss_chunk=m.loss_chunk)
