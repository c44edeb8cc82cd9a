"""PTIP (costmodel.cluster.ptip): DP x TP x PP degrees and the layer split as one MIP, priced by the
shared cost table, against Megatron-LM's standard configuration (all model predictions)."""
import os

import pytest

from costmodel.cluster import Cluster, Workload, load_model, ptip

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WL = Workload(seq_len=2048, micro_batch=1, global_batch=512)


def _model(name):
    return load_model(os.path.join(ROOT, "configs", f"{name}.yaml"))


def test_ptip_fits_and_is_no_slower_than_megatron():
    model = _model("7b")
    for n, prof in ((32, "a100-80gb"), (64, "h100")):
        cl = Cluster.of(n, prof)
        mega = ptip.megatron_config(model, WL, cl)
        plan = ptip.ptip_plan(model, WL, cl)
        assert mega.fits and plan.fits
        assert max(plan.stage_bytes) <= cl.memory_limit
        assert sum(plan.layers_per_stage) == model.n_layers
        assert plan.iter_time_s <= mega.iter_time_s * (1 + 1e-9)
        assert plan.info["objective_s"] == pytest.approx(plan.iter_time_s, rel=1e-6)  # MIP = model


def test_ptip_uneven_split_when_memory_binds():
    """1F1B stage 0 keeps pp micro-batches in flight: with tight memory PTIP gives it fewer
    layers, and fits where Megatron's configuration (PP only across the 2 nodes) does not."""
    model = _model("13b")
    cl = Cluster.of(16, "a100-80gb", memory_fraction=0.35)
    plan, mega = ptip.ptip_plan(model, WL, cl), ptip.megatron_config(model, WL, cl)
    assert plan.fits and not mega.fits
    assert plan.config.pp > 1 and plan.layers_per_stage[0] < plan.layers_per_stage[-1]
    even = ptip.evaluate(model, WL, cl, plan.config, ptip.even_split(model.n_layers, plan.config.pp))
    assert not even.fits


def test_evaluate_checks_the_split():
    model = _model("7b")
    cl = Cluster.of(8, "a100-80gb")
    with pytest.raises(ValueError, match="2 stages must hold 32 layers"):
        ptip.evaluate(model, WL, cl, ptip.PipeConfig(dp=1, tp=4, pp=2), [10, 10])
