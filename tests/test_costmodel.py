"""The cost model: CostTable arithmetic, memory vs XLA, time-model orderings, profile cache."""
import math
import os
from dataclasses import replace

import numpy as np
import pytest

from costmodel import memory as M
from costmodel import memory_fit
from costmodel import time as T
from costmodel.hardware import PROFILES
from costmodel.probe import figures, layer_step
from costmodel.calibration import Calibration, cache_path, default_calibration, load_calibration
from costmodel.profile import TimeSample, calibrate_time_for, fit_time, profile
from costmodel.time_correction import OptionTimes, fit_scales
from costmodel.table import REMATS, Choice, CostTable, cost_table
from sharding.layout import LAYERS, StorageLayout
from sharding.mesh import build_mesh
from sharding.ops.blocks import BlockSpec
from sharding.stack import layer_weight_shapes

# 1.3B-like layer (configs/1.3b.yaml): the planner's shapes, never compiled here.
SPEC_13B = BlockSpec(n_heads=16, head_dim=128, d_model=2048, d_ff=8192, gated=False, activation="gelu",
                     attention="blockwise", attention_block=1024, compute_dtype="bfloat16")
# Small shapes XLA compiles in seconds.
SPEC_MEM = BlockSpec(n_heads=8, head_dim=32, d_model=256, d_ff=768, gated=True, activation="silu",
                     attention_block=256)
SPEC_TINY = BlockSpec(n_heads=8, head_dim=16, d_model=128, d_ff=384, attention_block=64)
STRATEGIES = ("dp", "fsdp", "tp", "tp_sp", "ring", "ulysses", "metp")


# ------------------------------------------------------------------------------------------------
# CostTable arithmetic
# ------------------------------------------------------------------------------------------------
def hand_table():
    return CostTable(
        choices=(Choice("dp"), Choice("metp", "full")), n_layers=3,
        layer_time_s=np.array([1.0, 3.0]), layer_stored_bytes=np.array([100, 10]),
        layer_peak_bytes=np.array([50, 20]), base_bytes=1000, base_time_s=0.5,
        switch_time_s=np.array([[0.0, 0.25], [0.125, 0.0]]), switch_bytes=np.array([[0, 40], [7, 0]]))


def test_plan_bytes_and_time_by_hand():
    t = hand_table()
    # all dp: 1000 + 3*100 + max(50, 50, 50)
    assert t.plan_bytes([0, 0, 0]) == 1350
    assert t.plan_time([0, 0, 0]) == pytest.approx(0.5 + 3.0)
    # dp, metp, metp: 1000 + 100 + 10 + 10 + max(50, 20 + 40, 20) ; switch dp->metp once
    assert t.plan_bytes([0, 1, 1]) == 1000 + 120 + 60
    assert t.plan_time([0, 1, 1]) == pytest.approx(0.5 + 1 + 3 + 3 + 0.25)
    # metp, dp, metp: two switches, peaks 20, 50 + 7, 20 + 40
    assert t.plan_bytes([1, 0, 1]) == 1000 + 120 + 60
    assert t.plan_time([1, 0, 1]) == pytest.approx(0.5 + 7 + 0.125 + 0.25)
    # the backward-order bound: at layer l only layers <= l still hold their stored bytes
    assert t.plan_bytes_backward([0, 0, 0]) == t.plan_bytes([0, 0, 0])
    assert t.plan_bytes_backward([0, 1, 1]) == 1000 + max(100 + 50, 110 + 60, 120 + 20)
    assert t.plan_bytes_backward([1, 0, 1]) == 1000 + max(10 + 20, 110 + 57, 120 + 60)
    assert t.index("metp", "full") == 1 and t.uniform("dp") == [0, 0, 0]
    with pytest.raises(ValueError):
        t.plan_bytes([0, 1])
    with pytest.raises(KeyError):
        t.index("tp")


def test_cost_table_shapes_and_switches():
    t = cost_table(SPEC_13B, {"data": 8}, batch=16, seq_len=8192, n_layers=24, vocab=50304, hardware="a100-80gb")
    k = len(t.choices)
    assert k == len(REMATS) * len(STRATEGIES)  # every strategy can serve this shape, x every remat policy
    assert t.layer_time_s.shape == t.layer_stored_bytes.shape == t.layer_peak_bytes.shape == (k,)
    assert t.switch_time_s.shape == t.switch_bytes.shape == (k, k)
    assert np.all(t.layer_time_s > 0) and np.all(t.layer_stored_bytes > 0) and t.base_bytes > 0
    i, j = t.index("tp_sp"), t.index("metp")  # same boundary layout [b, s/p, h]: free switch
    assert t.switch_time_s[i, j] == 0 and t.switch_bytes[i, j] == 0
    i, j = t.index("fsdp"), t.index("metp")  # [b/N, s, h] -> [b, s/p, h]: an all-to-all
    assert t.switch_time_s[i, j] > 0 and t.switch_bytes[i, j] > 0
    # remat trades time for memory; selective keeps less than none and recomputes no matmul
    for s in ("dp", "tp_sp", "metp"):
        assert t.layer_stored_bytes[t.index(s, "full")] < t.layer_stored_bytes[t.index(s)]
        assert t.layer_time_s[t.index(s, "full")] > t.layer_time_s[t.index(s)]
        assert t.layer_stored_bytes[t.index(s, "selective")] < t.layer_stored_bytes[t.index(s)]
        assert t.layer_time_s[t.index(s, "selective")] < t.layer_time_s[t.index(s, "full")]


def test_infeasible_strategies_are_left_out():
    spec = BlockSpec(n_heads=6, head_dim=64, d_model=384, d_ff=1536)
    names = {c.strategy for c in cost_table(spec, {"data": 8}, 8, 1024, 4, 1000).choices}
    assert "ulysses" not in names and "tp" not in names and "metp" not in names  # 6 heads over 8
    assert {"dp", "fsdp", "ring"} <= names
    names = {c.strategy for c in cost_table(SPEC_13B, {"data": 8}, 1, 8192, 4, 1000).choices}
    assert "dp" not in names and "fsdp" not in names  # batch 1 over 8 devices


# ------------------------------------------------------------------------------------------------
# Memory model
# ------------------------------------------------------------------------------------------------
def test_layer_states_follow_the_storage_layout():
    """Params per device = what StorageLayout actually puts on one device (divisible or replicated)."""
    mesh = build_mesh({"data": 8})
    layout = StorageLayout(mesh)
    for spec in (SPEC_MEM, BlockSpec(n_heads=6, head_dim=64, d_model=384, d_ff=1000)):
        local = 0
        for _, (shape, axes) in layer_weight_shapes(spec).items():
            full = (1, *shape)
            sharding = layout.sharding((LAYERS, *axes), full)
            local += math.prod(sharding.shard_shape(full))
        assert M.layer_param_elems(spec, 8)[0] == local
        shape = M.Shape(spec, {"data": 8}, 8, 256, param_bytes=4, optimizer_slots=2)
        assert M.layer_states(shape) == local * 4 * 4


def _xla_total(strategy, spec, mesh, batch, seq_len, n_layers, remat="none"):
    c = layer_step(strategy, spec, mesh, batch, seq_len, n_layers=n_layers, remat=None if remat == "none" else remat)
    return figures(c)["total"]


MEMORY_BOUND = 0.10  # per-device total of a 3-layer step, shipped coefficients, held-out shapes


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_memory_matches_xla_on_held_out_shapes(strategy):
    """Shipped (calibrated) model vs XLA's per-device bytes on shapes not used for fitting:
    another d_model / head count / gated MLP than the calibration shape, two lengths (dense and
    blockwise attention)."""
    mesh = build_mesh({"data": 8})
    errs = []
    for s in (256, 1536):
        shape = M.Shape(SPEC_MEM, {"data": 8}, 8, s, backend="cpu")
        xla = _xla_total(strategy, SPEC_MEM, mesh, 8, s, 3)
        pred = M.plan_layer_bytes(shape, strategy, "none", 3)
        errs.append(abs(pred - xla) / xla)
    assert max(errs) < MEMORY_BOUND, (strategy, errs)


@pytest.mark.slow  # times every option on this CPU (~1 min); the fits are checked on hand tables in the default suite
def test_calibration_fits_and_extrapolates():
    """calibrate() on two lengths of a new shape predicts XLA's bytes at a third (held out)."""
    mesh = build_mesh({"data": 8})
    coeffs, samples = memory_fit.calibrate(mesh, SPEC_TINY, 8, (128, 512), strategies=("metp", "tp_sp"))
    assert len(samples) == 4 and set(coeffs.stored) == {"metp", "tp_sp"}
    for smp in samples:  # the fit reproduces its own samples (within 10%: on XLA:CPU each layer
        # also keeps the weight copies that order its collectives, sharding.ops.ordering, which
        # no feature carries)
        m = M.layer_memory(smp.shape, smp.strategy, smp.remat, coeffs)
        assert abs(m.activations - smp.stored) / smp.stored < 0.10
    for strategy in ("metp", "tp_sp"):
        xla = _xla_total(strategy, SPEC_TINY, mesh, 8, 1024, 3)
        total = M.plan_layer_bytes(M.Shape(SPEC_TINY, {"data": 8}, 8, 1024, backend="cpu"), strategy, "none", 3, coeffs)
        assert abs(total - xla) / xla < 0.05, (strategy, total, xla)


def test_metp_needs_least_memory_at_long_length():
    for s, b in ((32768, 4), (131072, 1)):
        t = cost_table(SPEC_13B, {"data": 8}, b, s, 24, 50304, hardware="a100-80gb",
                       choices=[Choice(x) for x in ("tp", "tp_sp", "ring", "ulysses", "metp")])
        need = {c.strategy: t.plan_bytes(t.uniform(i)) for i, c in enumerate(t.choices)}
        assert min(need, key=need.get) == "metp", need
        assert need["metp"] < 0.5 * need["tp"]


# ------------------------------------------------------------------------------------------------
# Time model
# ------------------------------------------------------------------------------------------------
def _uniform_time(spec, mesh_shape, batch, s, strategy, hardware="a100-80gb", remat="none"):
    t = cost_table(spec, mesh_shape, batch, s, 24, 50304, hardware=hardware, choices=[Choice(strategy, remat)])
    return t.plan_time(t.uniform(0))


def test_time_orderings_a100():
    mesh = {"data": 8}
    # short sequences, many rows: data parallelism beats METP's weight ring (its CPC regime)
    assert _uniform_time(SPEC_13B, mesh, 128, 1024, "dp") < _uniform_time(SPEC_13B, mesh, 128, 1024, "metp")
    assert _uniform_time(SPEC_13B, mesh, 128, 1024, "fsdp") < _uniform_time(SPEC_13B, mesh, 128, 1024, "tp")
    # remat costs time
    assert _uniform_time(SPEC_13B, mesh, 16, 8192, "tp_sp") < _uniform_time(SPEC_13B, mesh, 16, 8192, "tp_sp",
                                                                           remat="full")
    # the same tokens cost more at longer length (attention is quadratic)
    assert _uniform_time(SPEC_13B, mesh, 32, 4096, "ulysses") < _uniform_time(SPEC_13B, mesh, 1, 131072, "ulysses")
    # a faster device is faster
    assert _uniform_time(SPEC_13B, mesh, 16, 8192, "metp", "h100") < _uniform_time(SPEC_13B, mesh, 16, 8192, "metp")


def test_metp_full_overlap_condition():
    """METP's ring steps hide the transfer once b*s/p exceeds F/B (REFERENCES: full overlap)."""
    prof = PROFILES["a100-80gb"]
    coeffs = T.TimeCoefficients.from_profile(prof, {"data": 8})
    exposed = {}
    for s in (2048, 65536):
        shape = M.Shape(SPEC_13B, {"data": 8}, 1, s)
        lt = T.layer_time(shape, "metp", "none", coeffs)
        latency = sum(hops for hops, _, _ in T.layer_work(shape, "metp").ring_steps) * coeffs.lat("collective-permute")
        exposed[s] = (lt.ring - latency) / lt.total
    assert exposed[2048] > 0.2  # short: transfer-bound, most of the ring is exposed
    assert exposed[65536] < 0.1  # long: compute-bound, transfer hidden


def test_alpha_beta_collectives():
    assert T._wire("all-gather", 800, 8) == (700, 7)
    assert T._wire("reduce-scatter", 800, 8) == (700, 7)
    assert T._wire("all-reduce", 800, 8) == (1400, 14)
    assert T._wire("collective-permute", 800, 8) == (800, 1)
    assert T._wire("all-reduce", 800, 1) == (0, 0)


def test_matmul_flops_match_compiled_hlo():
    """Analytical matmul FLOPs of a dense-attention layer = dot FLOPs in the compiled HLO."""
    mesh = build_mesh({"data": 8})
    s = 64
    c = layer_step("tp", SPEC_TINY, mesh, 8, s, n_layers=2)
    hlo = T.hlo_dot_flops(c.as_text())
    w = T.layer_work(M.Shape(SPEC_TINY, {"data": 8}, 8, s), "tp")
    analytic = 2 * (w.matmul_flops + w.attn_flops)
    assert abs(hlo - analytic) / analytic < 0.1, (hlo, analytic)


def test_programs_compiled_only_for_figures_have_the_optimised_figures(monkeypatch):
    """Calibration compiles programs it never runs with LLVM at -O0: every byte and FLOP figure
    equals the optimised compile's (the suite itself runs at -O0, so -O2 is asked for here)."""
    from costmodel import probe
    mesh = build_mesh({"data": 8})
    quick = figures(layer_step("ring", SPEC_TINY, mesh, 1, 256, n_layers=2, remat="selective", figures_only=True))
    monkeypatch.setattr(probe, "figures_only_options", lambda mesh: {"xla_backend_optimization_level": 2})
    optimised = figures(layer_step("ring", SPEC_TINY, mesh, 1, 256, n_layers=2, remat="selective", figures_only=True))
    assert quick == optimised


def test_map_compiling_keeps_the_order_of_its_items():
    from costmodel.probe import map_compiling
    assert list(map_compiling(lambda n: n * n, list(range(9)), workers=3)) == [n * n for n in range(9)]
    assert list(map_compiling(str, [1], workers=4)) == ["1"]


# ------------------------------------------------------------------------------------------------
# Profile and its cache
# ------------------------------------------------------------------------------------------------
def test_profile_cache_round_trip(tmp_path):
    coeffs = T.TimeCoefficients.from_profile(PROFILES["h100"], {"data": 8})
    cal = Calibration("gpu-H100", {"data": 2, "model": 4}, coeffs, M.MemoryCoefficients(stored={"metp": {"act": 1.1}}),
                      step_overhead_s=0.01)
    path = cal.save(str(tmp_path))
    assert path == cache_path(str(tmp_path), "gpu-H100", {"data": 2, "model": 4})
    back = load_calibration(str(tmp_path), "gpu-H100", {"data": 2, "model": 4})
    assert back is not None and back.to_json() == cal.to_json()
    assert load_calibration(str(tmp_path), "gpu-H100", {"data": 8}) is None  # other mesh
    assert load_calibration(str(tmp_path), "gpu-A100", {"data": 2, "model": 4}) is None  # other device
    t = cost_table(SPEC_13B, {"data": 2, "model": 4}, 8, 4096, 4, 50304, hardware=back)
    assert t.hardware == "gpu-H100" and np.all(t.layer_time_s > 0)


def test_fit_time_recovers_known_rates():
    """NNLS on synthetic step times generated by the model itself gives back its rates."""
    truth = T.TimeCoefficients(matmul_flops=5e9, attn_flops=2e9, elem_rate=1e9, mem_bw=4e9,
                               bandwidth={k: 2e9 for k in T.KINDS}, latency={k: 1e-4 for k in T.KINDS},
                               overlap=False, shared_compute=True, layer_overhead=1e-3)
    samples = []
    for s in (64, 128, 256, 512):
        for strat in STRATEGIES:
            shape = M.Shape(SPEC_TINY, {"data": 8}, 8, s)
            samples.append(TimeSample(shape, strat, "none", 2, 2 * T.layer_time(shape, strat, "none", truth).total))
    coeffs, step, report = fit_time(samples)
    assert report["median_rel_err"] < 0.02
    assert coeffs.matmul_flops == pytest.approx(5e9, rel=0.2)


def test_profile_times_real_programs_and_caches(tmp_path):
    mesh = build_mesh({"data": 8})
    cal = profile(mesh, SPEC_TINY, (64, 128), strategies=("dp", "tp"), repeats=1, directory=str(tmp_path),
                  more_shapes=[(1, 256)])
    assert cal.device_kind.startswith("cpu") and cal.time.shared_compute and not cal.time.overlap
    # 8 rows at 64 and 128 for both; one row of 256 only for tp (dp cannot split one row over 8 devices)
    assert cal.meta["fit"]["n_samples"] == 5 and cal.meta["more_shapes"] == [[1, 256]]
    assert sorted((s["strategy"], s["batch"], s["seq_len"]) for s in cal.meta["samples"] if s["batch"] == 1) == [("tp", 1, 256)]
    assert load_calibration(str(tmp_path), cal.device_kind, {"data": 8}) is not None
    again = profile(mesh, SPEC_TINY, (64, 128), strategies=("dp", "tp"), directory=str(tmp_path))
    assert again.meta["created"] == cal.meta["created"]  # read from the cache, nothing re-run


def test_fit_scales_two_parts_one_scale_and_why():
    parts = [(1.0, 4.0), (8.0, 4.0), (64.0, 4.0)]  # attention grows with the length, the rest does not
    got = fit_scales(parts, [0.5 * a + 2.0 * r for a, r in parts])
    assert got.how == "two-part" and got.attention == pytest.approx(0.5) and got.rest == pytest.approx(2.0)
    assert got.apply(128.0, 4.0) == pytest.approx(72.0)  # extrapolates with the model's shape
    one = fit_scales([(1.0, 4.0)], [10.0])
    assert (one.attention, one.rest) == pytest.approx((2.0, 2.0)) and one.how == "one-scale: measured at one shape"
    same = fit_scales([(1.0, 4.0), (2.0, 8.0)], [6.0, 9.0])
    assert same.how.startswith("one-scale: the attention share is the same") and same.attention == same.rest
    # the measured time falls with the length although the model's attention part grows: the fit
    # would give attention no time, so the option gets one scale and says why
    shrink = fit_scales([(1.0, 4.0), (20.0, 4.0)], [10.0, 8.0])
    assert shrink.how == "one-scale: the fit gave the attention part no time"


def test_grad_accum_prices_a_micro_batch_per_layer_and_the_update_once():
    choices = (Choice("dp"), Choice("ring", "selective"), Choice("tp_sp"))
    whole = cost_table(SPEC_TINY, {"data": 8}, 16, 1024, 4, 256, choices=choices)
    micro = cost_table(SPEC_TINY, {"data": 8}, 8, 1024, 4, 256, choices=choices)
    accum = cost_table(SPEC_TINY, {"data": 8}, 16, 1024, 4, 256, choices=choices, grad_accum=2)
    # a layer holds one micro-batch of 8 rows at a time, and runs twice
    assert np.array_equal(accum.layer_stored_bytes, micro.layer_stored_bytes)
    assert np.array_equal(accum.layer_peak_bytes, micro.layer_peak_bytes)
    assert (whole.layer_stored_bytes > accum.layer_stored_bytes).all()
    assert np.allclose(accum.layer_time_s, 2 * micro.layer_time_s)
    # the base keeps the whole batch's arrays and a running sum of the gradients; the update runs once
    assert whole.base_bytes < accum.base_bytes and micro.base_bytes < accum.base_bytes
    assert 2 * micro.base_time_s > accum.base_time_s > micro.base_time_s
    assert accum.batch == 16
    with pytest.raises(ValueError, match="batch 16 does not split into 3 micro-batches"):
        cost_table(SPEC_TINY, {"data": 8}, 16, 1024, 4, 256, choices=choices, grad_accum=3)


def test_measured_layer_times_correct_the_table_per_option():
    base = default_calibration()
    shape = M.Shape(SPEC_TINY, {"data": 8}, 8, 1024, backend="cpu")
    choices = (Choice("dp"), Choice("ulysses"), Choice("ulysses", "full"), Choice("tp"))

    def truth(strategy, remat, b, s, a_scale, r_scale):
        lt = T.layer_time(replace(shape, batch=b, seq_len=s), strategy, remat, base.time)
        return a_scale * lt.attention + r_scale * lt.rest

    points = {"ulysses@none": [[b, s, truth("ulysses", "none", b, s, 3.0, 0.5)] for b, s in ((32, 256), (2, 4096))],
              "ulysses@full": [[b, s, truth("ulysses", "full", b, s, 2.0, 1.0)] for b, s in ((32, 256), (2, 4096))]}
    cal = base.with_layer_times(OptionTimes(__import__("dataclasses").asdict(SPEC_TINY), points))
    plain = cost_table(SPEC_TINY, {"data": 8}, 8, 1024, 2, 256, hardware=base, choices=choices)
    fixed = cost_table(SPEC_TINY, {"data": 8}, 8, 1024, 2, 256, hardware=cal, choices=choices)
    # measured options: their own scales at a held-out length (1024 was not measured)
    assert fixed.layer_time_s[1] == pytest.approx(truth("ulysses", "none", 8, 1024, 3.0, 0.5), rel=1e-6)
    assert fixed.layer_time_s[2] == pytest.approx(truth("ulysses", "full", 8, 1024, 2.0, 1.0), rel=1e-6)
    # not measured: the median of all measured options per part (no dp or tp option was timed)
    for i, strategy in ((0, "dp"), (3, "tp")):
        assert fixed.layer_time_s[i] == pytest.approx(truth(strategy, "none", 8, 1024, 2.5, 0.75), rel=1e-6)
    assert plain.layer_time_s[0] != pytest.approx(fixed.layer_time_s[0])
    again = Calibration.from_json(cal.to_json())
    assert again.layer_times == cal.layer_times
    # measurements of another layer shape do not apply
    other = cost_table(SPEC_MEM, {"data": 8}, 8, 1024, 2, 256, hardware=cal, choices=choices)
    assert np.allclose(other.layer_time_s, cost_table(SPEC_MEM, {"data": 8}, 8, 1024, 2, 256, hardware=base,
                                                      choices=choices).layer_time_s)


def test_calibrate_time_for_measures_each_option_once_and_caches(tmp_path, monkeypatch):
    mesh = build_mesh({"data": 8})
    jobs = {(8, 64): [("dp", "none"), ("ulysses", "full")], (2, 128): [("dp", "none"), ("ring", "dots")]}
    cal = calibrate_time_for(default_calibration(), mesh, SPEC_TINY, jobs, str(tmp_path), repeats=1)
    pts = cal.layer_times.points
    # dp cannot serve 2 rows on 8 devices: remembered as not measurable, never timed
    assert set(pts) == {"dp@none", "ulysses@full", "ring@dots"}
    assert [p[:2] for p in pts["dp@none"]] == [[8, 64]] and [p[:2] for p in pts["ring@dots"]] == [[2, 128]]
    assert all(0 < p[2] < 5 for v in pts.values() for p in v)
    import costmodel.profile as P
    monkeypatch.setattr(P, "measure_times", lambda *a, **k: pytest.fail("measured again instead of the cache"))
    again = calibrate_time_for(default_calibration(), mesh, SPEC_TINY, jobs, str(tmp_path))
    assert again.layer_times == cal.layer_times
    fewer = calibrate_time_for(default_calibration(), mesh, SPEC_TINY, {(8, 64): [("dp", "none")]}, str(tmp_path))
    assert set(fewer.layer_times.points) == {"dp@none"}


def test_cached_samples_are_keyed_by_the_measuring_code_only():
    """A calibration stays valid across edits of the search, tables and fits (they only read
    the samples); the programs (`sharding`) and the measuring modules key it."""
    import costmodel.profile as P
    names = {os.path.relpath(f, os.path.dirname(os.path.dirname(P.__file__))) for f in P.measured_sources()}
    assert {"sharding/stack.py", "sharding/ops/blocks.py", "sharding/remat.py", "costmodel/probe.py",
            "costmodel/profile.py", "costmodel/memory_fit.py", "costmodel/hlo.py"} <= names
    assert not any(n.startswith(("costmodel/search/", "costmodel/cluster/")) or n == "costmodel/table.py"
                   for n in names)
    assert all(os.path.isfile(f) for f in P.measured_sources())


def test_plan_bytes_match_the_trainers_compiled_step(tmp_path, tiny_config):
    """CostTable vs XLA's per-device bytes of whole train steps (embedding, layers, loss, AdamW)."""
    import dysejax
    from dysejax.model.transformer import block_spec
    cfg = tiny_config("model.d_model=128", "model.d_ff=384", "model.n_layers=4", "model.attention_block=128",
                      "data.buckets=[512]", "data.tokens_per_batch=4096", "data.max_docs=200")
    trainer = dysejax.Trainer(cfg, workdir=str(tmp_path), verbose=False)
    spec, bs = block_spec(cfg.model), trainer.data.batch_size(512)
    choices = (Choice("dp"), Choice("tp_sp"), Choice("metp"), Choice("metp", "full"))
    table = cost_table(spec, {"data": 8}, bs, 512, 4, cfg.model.vocab_size, hardware="a100-80gb", choices=choices)
    for written, per_layer, bound in (("dp", [0] * 4, 0.06), ("metp", [2] * 4, 0.06),
                                      ([["tp_sp", 2], ["metp", 2, "full"]], [1, 1, 3, 3], 0.12)):
        xla = trainer.programs.get("train", 512, bs, trainer.planner.parse(written)).bytes_per_device
        pred = table.plan_bytes_backward(per_layer)
        assert pred <= table.plan_bytes(per_layer)
        assert abs(pred - xla) / xla < bound, (written, pred, xla)


def test_megatron_figure_by_hand():
    """Korthikanti et al.'s per-layer figure adapted (no dropout, flash attention, the MLP's
    kind): 16·sbh + 6·sbf bytes (gated) / 16·sbh + 4·sbf (plain) at 2 bytes, doubled at float32,
    over the devices sharing the layer; `tp` keeps its 4 boundary-sized arrays whole."""
    h, f, s, b, n = 256, 768, 4096, 8, 8
    for gated, mlp in ((True, 6), (False, 4)):
        spec = BlockSpec(n_heads=8, head_dim=32, d_model=h, d_ff=f, gated=gated)
        shape = M.Shape(spec, {"data": n}, b, s, backend="cpu")
        lse = b * s / n * 8 * 4
        tokens = b * s / n
        assert M.megatron_activation_bytes(shape, "dp") == pytest.approx(2 * tokens * (16 * h + mlp * f) + lse)
        assert M.megatron_activation_bytes(shape, "tp_sp") == pytest.approx(2 * tokens * (16 * h + mlp * f) + lse)
        # tp: the norms' and sub-layers' inputs [b, s, h] whole on every device, the rest split
        whole = 4 * b * s * h * 4
        assert M.megatron_activation_bytes(shape, "tp") == pytest.approx(whole + 2 * tokens * (8 * h + mlp * f) + lse)
