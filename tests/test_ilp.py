"""Minimal-memory-redundancy planner (costmodel.cluster.ilp): priced by the shared cost table,
against Megatron-LM's configuration and, for its search, against HiGHS (tests/oracles/milp.py)."""
import os

import numpy as np
import pytest

from costmodel.cluster import Cluster, Workload, ilp, load_model
from costmodel.search import exact_plan
from tests.oracles.milp import table_milp
from tests.oracles.tables import random_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("n", [8, 32])
def test_redundancy_plan_respects_time_budget_and_beats_megatron_on_7b(n):
    model = load_model(os.path.join(ROOT, "configs", "7b.yaml"))
    cl, wl = Cluster.of(n, "a100-80gb"), Workload(seq_len=2048, micro_batch=8, global_batch=512)
    r = ilp.min_redundancy_plan(model, wl, cl, time_slack=0.05)
    assert r.status == "optimal" and r.cost.fits
    assert r.cost.iter_time_s <= r.time_budget_s * (1 + 1e-6)
    assert r.time_budget_s == pytest.approx(1.05 * r.reference_time_s)
    assert r.cost.bytes < r.megatron.bytes and r.memory_saving > 0.3
    assert r.plan.n_layers == model.n_layers
    # like for like: states replicated across nodes as in Megatron's data parallelism, no slower
    rr = ilp.min_redundancy_plan(model, wl, cl, inter=("rep",), reference="megatron", time_slack=0.0)
    assert rr.inter == "rep"
    assert rr.cost.iter_time_s <= rr.megatron.iter_time_s * (1 + 1e-6)
    assert rr.cost.bytes < rr.megatron.bytes


def test_megatron_plan_is_tp_on_every_layer():
    model = load_model(os.path.join(ROOT, "configs", "7b.yaml"))
    cl, wl = Cluster.of(16, "a100-80gb"), Workload(seq_len=2048, micro_batch=8, global_batch=512)
    lay = ilp.layouts(model, wl, cl)
    assert set(lay) == {"rep", "shard"}
    per_layer = ilp.megatron_plan(model, lay["rep"])
    assert {lay["rep"].costs.choices[k].strategy for k in per_layer} == {"tp"}
    r = ilp.min_redundancy_plan(model, wl, cl, reference="megatron", time_slack=0.0)
    assert r.reference_time_s == pytest.approx(r.megatron.iter_time_s)


@pytest.mark.parametrize("seed", range(4))
def test_leanest_within_equals_highs(seed):
    """The least-bytes plan within a time bound (bisection over exact_plan) = HiGHS minimising bytes."""
    tb = random_table(700 + seed, n_layers=8, n_choices=5, layout_classes=3 if seed % 2 else None)
    fast = exact_plan(tb, np.inf).time_s
    lean = exact_plan(tb, ilp.leanest_within(tb, np.inf).bytes).time_s
    for frac in (0.0, 0.3, 0.7, 1.0):
        T = (fast + frac * (lean - fast)) * (1 + 1e-12)  # the ends: a plan's time, summed in any order
        r = ilp.leanest_within(tb, T)
        m = table_milp(tb, minimise="bytes", max_time=T)
        assert r is not None and m.per_layer is not None and m.optimal
        assert r.time_s <= T
        assert r.bytes == pytest.approx(tb.plan_bytes(m.per_layer), rel=1e-9, abs=2.0)
    assert ilp.leanest_within(tb, fast * (1 - 1e-6)) is None  # faster than the fastest plan


def test_megatron_baseline_is_found_by_its_layouts():
    """The cluster planners name Megatron's tensor parallelism by layout, not by a strategy name."""
    from costmodel.cluster.megatron import tensor_parallel
    assert (tensor_parallel(), tensor_parallel(sequence_parallel=True)) == ("tp", "tp_sp")
