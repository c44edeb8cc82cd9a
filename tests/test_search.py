"""The per-bucket plan search: the ranked entry point, the exact search against its oracles (HiGHS,
the grid DP), the search-time bound and ParaDySe's selection.

Everything runs on synthetic and real cost tables (no devices).
"""
import dataclasses
import time

import numpy as np
import pytest

from costmodel.search import ParaDySeSelector, exact_plan, leanest_plan, non_dominated, paradyse_plan, ranked_plans, table_arrays
from costmodel.table import Choice, CostTable
from tests.oracles.grid_dp import grid_dp_plan
from tests.oracles.milp import milp_plan
from tests.oracles.tables import budget_between, config_table, random_table

MiB = 2**20


def _table(t, w, pk=None, swt=None, swb=None, L=8, base=0, names=None):
    K = len(t)
    names = names or [f"s{i}" for i in range(K)]
    return CostTable(choices=tuple(Choice(n) for n in names), n_layers=L, layer_time_s=np.array(t, float),
                     layer_stored_bytes=np.array(w, float) * MiB,
                     layer_peak_bytes=np.zeros(K) if pk is None else np.array(pk, float) * MiB,
                     base_bytes=base * MiB, base_time_s=0.0,
                     switch_time_s=np.zeros((K, K)) if swt is None else np.array(swt, float),
                     switch_bytes=np.zeros((K, K)) if swb is None else np.array(swb, float) * MiB)


def _table96(s, b, remats=None):
    """The 7b model with 96 layers: every feasible strategy x remat policy (up to 28 choices)."""
    return config_table("7b", s, b, n_layers=96, remats=remats)


# ------------------------------------------------------------------------------------------
# the entry point: ranked plans
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(4))
def test_ranked_plans_optimum_then_a_ladder_then_leanest(seed):
    tb = random_table(300 + seed, n_layers=16, n_choices=6)
    B = budget_between(tb, 0.7)
    r = ranked_plans(tb, B, step=0.05, rungs=6)
    opt = exact_plan(tb, B)
    assert r.fits and r.best.per_layer == opt.per_layer and r.candidates[0] is r.best
    ids = [c.plan_id for c in r.candidates]
    assert len(set(ids)) == len(ids) and len(ids) >= 2
    lean = r.candidates[-1]  # the leanest plan (or the last rung, when that is the leanest plan)
    assert lean.bytes == min(c.bytes for c in r.candidates) == leanest_plan(tb, B).bytes
    ladder = [c for c in r.candidates if c.method == "exact"]
    assert 2 <= len(ladder) <= 7 and r.candidates[:len(ladder)] == tuple(ladder)
    for before, c in zip(ladder, ladder[1:]):  # each rung: the optimum 5% below the one before it
        assert c.fits and c.budget_bytes == pytest.approx(0.95 * before.bytes)
        assert c.bytes <= 0.95 * before.bytes
        assert c.time_s == pytest.approx(exact_plan(tb, c.budget_bytes).time_s)
        assert c.time_s >= before.time_s  # fewer bytes never give a faster optimum
    if len(ladder) < 7:  # the ladder stopped early: nothing fits 5% below its last rung
        assert not exact_plan(tb, 0.95 * ladder[-1].bytes).fits


def test_ranked_plans_ladder_keeps_the_plan_just_below_the_optimum():
    """The fallback after an optimum near the budget is the fastest plan 5% below it, not the
    optimum under a fixed fraction of the budget (which skipped plans between the two)."""
    tb = random_table(11, n_layers=8, n_choices=5)
    B = budget_between(tb, 0.9)
    r = ranked_plans(tb, B)
    second = r.candidates[1]
    assert r.best.bytes > 0.95 * B and second.per_layer == exact_plan(tb, r.best.bytes * 0.95).per_layer
    assert second.bytes > 0.9 * B  # the old rung (optimum under 0.9 x budget) could not offer it ...
    assert second.time_s < exact_plan(tb, 0.9 * B).time_s  # ... and it is faster than that rung's plan
    with pytest.raises(ValueError, match=r"step 1.0: the share of bytes each fallback saves must be in \(0, 1\)"):
        ranked_plans(tb, B, step=1.0)


def test_ranked_plans_nothing_fits_and_no_budget():
    tb = random_table(3, n_layers=6, n_choices=4)
    r = ranked_plans(tb, 1.0)
    assert not r.fits and len(r.candidates) == 1 and r.best.method == "leanest"
    assert r.best.bytes <= min(tb.plan_bytes(tb.uniform(k)) for k in range(tb.K)) and r.best.bytes > 1.0
    free = ranked_plans(tb, None)  # no budget: the fastest plan of all
    assert free.fits and free.best.time_s == pytest.approx(min(tb.plan_time(tb.uniform(k)) for k in range(tb.K)))


def test_ranked_plans_paradyse_method():
    tb = random_table(7, n_layers=12, n_choices=5)
    B = budget_between(tb, 0.4)
    r = ranked_plans(tb, B, method="paradyse")
    h = paradyse_plan(tb, B)
    assert r.best.per_layer == h.per_layer and r.best.method.startswith("paradyse")
    assert r.best.time_s >= ranked_plans(tb, B).best.time_s * (1 - 1e-12)
    with pytest.raises(ValueError, match="unknown plan search method 'grid'"):
        ranked_plans(tb, B, method="grid")


# ------------------------------------------------------------------------------------------
# exact search == oracles (HiGHS, grid DP)
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("classes", [3, None])
def test_dp_equals_milp_on_integer_tables(seed, classes):
    """Whole-MiB bytes: the DP's grid is exact and both solvers prove the same optimum."""
    tb = random_table(seed, n_layers=10, n_choices=5, layout_classes=classes, integer_mib=True)
    B = budget_between(tb, np.random.default_rng(seed).uniform(0.1, 0.9))
    d, m = grid_dp_plan(tb, B, exact_bins=1 << 14), milp_plan(tb, B)
    f = exact_plan(tb, B)  # the label search
    assert d.fits and m.fits and d.optimal and d.info["grid_exact"]
    assert f.fits and f.optimal and f.method == "exact"
    assert d.time_s == pytest.approx(m.time_s, rel=1e-9)
    assert f.time_s == pytest.approx(m.time_s, rel=1e-9)
    assert tb.plan_bytes(d.per_layer) <= B and tb.plan_bytes(f.per_layer) <= B
    assert d.time_s == pytest.approx(tb.plan_time(d.per_layer), rel=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_dp_matches_milp_on_continuous_tables(seed):
    """Arbitrary bytes: the DP's plan fits, equals HiGHS's optimum and respects its own lower bound."""
    tb = random_table(100 + seed, n_layers=12, n_choices=5, layout_classes=3 if seed % 2 else None)
    B = budget_between(tb, np.random.default_rng(seed).uniform(0.1, 0.9))
    m = milp_plan(tb, B)
    for d in (exact_plan(tb, B), grid_dp_plan(tb, B, rel_tol=0.0)):
        assert d.fits and tb.plan_bytes(d.per_layer) <= B
        assert d.time_s == pytest.approx(m.time_s, rel=1e-9)
        assert d.info["lower_bound_s"] <= m.time_s * (1 + 1e-12)


def test_switching_cost_and_transient_are_respected():
    """A switch too expensive in time, then one whose transient bytes break the budget."""
    # choice 0 fast/large, 1 lean/slow; switching 0 -> 1 costs more than it saves
    t, w = [1.0, 1.3], [100, 50]
    tb = _table(t, w, swt=[[0, 5.0], [5.0, 0]], L=4)
    B = 4 * 75 * MiB  # two fast + two lean layers would fit
    d = exact_plan(tb, B)
    assert d.per_layer in ((1, 1, 1, 1),) and d.optimal  # one switch (5 s) > gain of 2 x 0.3 s
    tb2 = _table(t, w, swt=[[0, 0.01], [0.01, 0]], swb=[[0, 80], [80, 0]], L=4)
    d2 = exact_plan(tb2, B)  # the switch needs 80 MiB of transient: mixing does not fit
    assert d2.per_layer == (1, 1, 1, 1)
    d3 = exact_plan(tb2, B + 80 * MiB)
    assert sorted(d3.per_layer) == [0, 0, 1, 1] and d3.fits


def test_nothing_fits_returns_fewest_bytes_plan():
    tb = random_table(3, n_layers=6, n_choices=4)
    a = table_arrays(tb)
    d = exact_plan(tb, 1.0)
    p = paradyse_plan(tb, 1.0)
    assert not d.fits and not p.fits and p.method == "paradyse:leanest"
    assert d.bytes <= min(tb.plan_bytes([k] * 6) for k in range(a.K))


def test_search_time_96_layers_21_choices():
    """96 layers x 7 strategies x 3 remat policies (up to 21 choices): one bucket's exact search,
    30-60 ms median on a loaded 2-core machine; bounded like the real-table test below (200 ms)."""
    timings = {}
    for s, b in ((8192, 8), (65536, 2)):
        tb = _table96(s, b)
        B = budget_between(tb, 0.5)
        exact_plan(tb, B)
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            r = exact_plan(tb, B)
            runs.append(time.perf_counter() - t0)
        timings[(s, b, tb.K)] = (float(np.median(runs)), r.info["kept"])
        assert r.fits and r.optimal and r.time_s <= paradyse_plan(tb, B).time_s * (1 + 1e-12)
    for (s, b, K), (med, kept) in timings.items():
        print(f"\nexact search, 96 layers x {K} choices (s={s}, b={b}): median {med * 1e3:.1f} ms "
              f"({kept} choices kept by exact pruning)")
    assert max(v[0] for v in timings.values()) < 0.2


def _real_table(s, b, n_layers=96, remats=("none",)):
    """The project's cost table (13b config, one 8-device data mesh) for one bucket."""
    return config_table("13b", s, b, n_layers=n_layers, remats=remats)


def _budgets(tb, fracs=(0.15, 0.5, 0.85)):
    uni = [tb.plan_bytes(tb.uniform(i)) for i in range(tb.K)]
    return [min(uni) + f * (max(uni) - min(uni)) for f in fracs]


BUCKETS = ((2048, 32), (8192, 8), (32768, 2), (131072, 1))


def test_exact_search_time_on_real_tables():
    """13b, 96 layers, the feasible strategies (up to 7) without remat, 4 lengths x 3 budgets:
    the exact search returns a proven optimum in milliseconds. On a quiet machine the median is
    well under 10 ms and the max under 50 ms; the bounds here are generous (shared CI cores)."""
    times = []
    for s, b in BUCKETS:
        tb = _real_table(s, b)
        for B in _budgets(tb):
            exact_plan(tb, B)  # warm
            t0 = time.perf_counter()
            r = exact_plan(tb, B)
            times.append(time.perf_counter() - t0)
            assert r.fits and r.optimal and r.method == "exact"
            assert r.time_s <= paradyse_plan(tb, B).time_s * (1 + 1e-12)
    print(f"\nexact search on 13b cost tables (96 layers): median {np.median(times) * 1e3:.2f} ms, "
          f"max {max(times) * 1e3:.2f} ms over {len(times)} buckets x budgets")
    assert np.median(times) < 0.010
    assert max(times) < 0.200


@pytest.mark.parametrize("n_layers", [8, 16, 24])
def test_exact_equals_dp_and_milp_on_real_tables(n_layers):
    """The exact search (label search) = the grid DP = HiGHS on real 13b tables, with
    remat variants (up to 21 choices, layout switches with time and transient bytes). HiGHS
    runs on the exactly pruned choices and may stop at its time limit on the tightest budgets
    (symmetric dp/fsdp mixes): then the proven optimum must be at least as fast as its plan."""
    for (s, b), remats in zip(BUCKETS, (("none",), ("none", "full", "dots"), ("none", "dots"), ("none", "full"))):
        tb = _real_table(s, b, n_layers, remats)
        for B in _budgets(tb, (0.1, 0.4, 0.8)):
            f = exact_plan(tb, B)
            d = grid_dp_plan(tb, B, rel_tol=0.0)
            m = milp_plan(tb, B, prune=True, time_limit=10)
            assert f.fits and d.fits and m.fits and f.optimal
            assert f.time_s == pytest.approx(d.time_s, rel=1e-9)
            assert f.time_s <= m.time_s * (1 + 1e-9)
            if m.optimal:
                assert f.time_s == pytest.approx(m.time_s, rel=1e-9)
            assert tb.plan_bytes(f.per_layer) <= B
            assert len(f.plan().runs) <= len(d.plan().runs)  # ties go to fewer runs


@pytest.mark.parametrize("seed", range(8))
def test_exact_equals_milp_with_asymmetric_switches(seed):
    """Random switch matrices (no layout classes: asymmetric time and bytes), small and
    degenerate shapes, budgets from nothing-fits to everything-fits."""
    rng = np.random.default_rng(seed)
    L, K = int(rng.integers(1, 12)), int(rng.integers(1, 6))
    tb = random_table(700 + seed, n_layers=L, n_choices=K, layout_classes=None, integer_mib=seed % 2 == 0)
    for frac in (-0.3, rng.uniform(0.0, 0.5), rng.uniform(0.5, 1.1)):
        B = budget_between(tb, frac)
        f, m = exact_plan(tb, B), milp_plan(tb, B)
        assert f.fits == m.fits
        if m.fits:
            assert f.optimal and f.time_s == pytest.approx(m.time_s, rel=1e-9)
            assert tb.plan_bytes(f.per_layer) <= B
    # too many labels for the limit: the incumbent (at most two runs), not claimed optimal; the
    # grid DP proves the optimum HiGHS finds
    B = budget_between(tb, 0.5)
    g, h, d = exact_plan(tb, B, max_labels=0), exact_plan(tb, B), grid_dp_plan(tb, B, rel_tol=0.0)
    if h.fits and L > 1:
        assert g.fits == h.fits and g.time_s >= h.time_s * (1 - 1e-12) and len(g.plan().runs) <= 2
        assert not g.optimal or g.time_s == pytest.approx(h.time_s, rel=1e-9)
        assert d.time_s == pytest.approx(h.time_s, rel=1e-9)


def test_fewer_runs_among_equal_time_optima():
    """dp and fsdp equally fast here: the plan is one run, not a dp/fsdp mix."""
    tb = _real_table(2048, 32)
    B = _budgets(tb, (0.5,))[0]
    r = exact_plan(tb, B)
    assert r.optimal and len(r.plan().runs) == 1


# ------------------------------------------------------------------------------------------
# ParaDySe
# ------------------------------------------------------------------------------------------
def test_paradyse_prunes_dominated_choices():
    # s1 slower than s0 and not leaner (same stored, more peak): dominated; s2 leaner: kept
    tb = _table([1.0, 1.2, 1.5], [100, 100, 40], pk=[10, 20, 10])
    assert list(non_dominated(table_arrays(tb))) == [0, 2]


def test_paradyse_early_exit_when_fastest_fits():
    tb = _table([1.0, 1.5], [100, 40], L=8)
    r = paradyse_plan(tb, 10_000 * MiB)
    assert r.method == "paradyse:fastest" and r.per_layer == (0,) * 8 and r.fits


def test_paradyse_two_segment_plan():
    tb = _table([1.0, 1.3, 2.0], [100, 60, 20], swt=np.full((3, 3), 0.01) - 0.01 * np.eye(3), L=8)
    B = 600 * MiB  # 8 x 100 = 800 does not fit; fast + lean mixes do
    r = paradyse_plan(tb, B)
    assert r.method == "paradyse:two-segment" and r.fits
    # it is the fastest two-segment plan: check every (lean choice, l) by brute force
    best = min((tb.plan_time([0] * (8 - l) + [c] * l), c, l) for c in (1, 2) for l in range(1, 9)
               if tb.plan_bytes([0] * (8 - l) + [c] * l) <= B)
    assert r.time_s == pytest.approx(best[0])
    assert r.per_layer == tuple([0] * (8 - best[2]) + [best[1]] * best[2])
    assert r.per_layer[0] == 0 and r.per_layer[-1] != 0  # fast first, lean last


def test_paradyse_fallback_to_leanest():
    tb = _table([1.0, 1.5], [100, 40], L=8)
    r = paradyse_plan(tb, 100 * MiB)  # 8 x 40 = 320 MiB needed even by the leanest
    assert not r.fits and r.method == "paradyse:leanest" and r.per_layer == (1,) * 8


def test_selector_cache_and_smoothing():
    t1 = _table([1.0, 1.3], [100, 50], L=8)
    t2 = _table([1.0, 1.02], [100, 50], L=8)  # lean is only 2% slower per layer here
    B = 600 * MiB
    sel = ParaDySeSelector(B)
    r1 = sel.select((8, 1024), t1)
    assert sel.misses == 1 and sel.hits == 0 and r1.fits
    again = sel.select((8, 1024))  # cache hit: no table needed
    assert sel.hits == 1 and again.per_layer == r1.per_layer
    # bucket 2's own choice is the same two-segment mix; make the previous plan all-lean instead
    sel.previous = dataclasses.replace(r1, choices=(Choice("s1"),) * 8, per_layer=(1,) * 8)
    own = paradyse_plan(t2, B)
    r2 = sel.select((8, 2048), t2)
    assert tb_time(t2, (1,) * 8) <= 1.05 * own.time_s
    assert r2.method == "paradyse:smoothed" and r2.per_layer == (1,) * 8 and r2.fits
    # on bucket 1 the all-lean plan is > 5% slower than its own selection: not kept
    r3 = sel.select((8, 1024))
    assert r3.method != "paradyse:smoothed" and r3.per_layer == r1.per_layer
    assert sel.smoothed == 1


def tb_time(tb, plan):
    return tb.plan_time(list(plan))


def test_tight_budget_short_bucket_gets_faster_plan():
    # none / full / dots: a choice set where memory costs time (selective keeps the long bucket
    # within 0.3% of its fastest plan under this budget)
    short, long_ = (_table96(s, 8, remats=("none", "full", "dots")) for s in (4096, 16384))
    L = short.n_layers
    fast_short = table_arrays(short).t.argmin()
    B = short.plan_bytes([int(fast_short)] * L)  # exactly what the short bucket's fastest needs
    for search in (paradyse_plan, exact_plan):
        rs, rl = search(short, B), search(long_, B)
        assert rs.fits and rl.fits
        slow_s = rs.time_s / short.plan_time([int(fast_short)] * L)
        fast_long = int(table_arrays(long_).t.argmin())
        slow_l = rl.time_s / long_.plan_time([fast_long] * L)
        assert slow_s == pytest.approx(1.0) and slow_l > 1.01
        assert long_.plan_bytes([fast_long] * L) > B


def test_result_plan_is_compressed_runs():
    tb = _table([1.0, 1.3], [100, 50], L=8, names=["tp_sp", "metp"])
    r = paradyse_plan(tb, 600 * MiB)
    plan = r.plan()
    assert plan.n_layers == 8 and len(plan.runs) == 2 and plan.runs[0].strategy == "tp_sp"
