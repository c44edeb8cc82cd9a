"""Every strategy and mixed plans: one step's loss and grads equal the single-device reference."""
import pytest

from sharding.strategies import StrategyShapeError, get_strategy
from sharding.ops.blocks import BlockSpec
from sharding.mesh import build_mesh
from tests.reference import CHUNKED, WHOLE, check_against_reference


@pytest.mark.parametrize("plan", ["dp", "fsdp"])
def test_batch_parallel_strategies_match_reference(plan):
    check_against_reference(plan, batch=8, seq=200)


def test_batch_parallel_needs_divisible_batch():
    spec = BlockSpec(n_heads=8, head_dim=8, d_model=64, d_ff=128)
    with pytest.raises(StrategyShapeError, match=r"strategy 'dp' needs batch size \(4\) divisible by the device count \(8\)"):
        get_strategy("dp").check(spec, build_mesh({"data": 8}), batch=4, seq_len=64)


@pytest.mark.parametrize("plan", ["tp", "tp_sp"])
@pytest.mark.parametrize("seq", [200, 96])
def test_tensor_parallel_matches_reference(plan, seq):
    check_against_reference(plan, seq=seq)


@pytest.mark.parametrize("plan", ["tp", "tp_sp"])
def test_tensor_parallel_on_2d_mesh(plan):
    check_against_reference(plan, {"data": 2, "model": 4}, batch=4, seq=96)


@pytest.mark.parametrize("plan, layers, batch", [([["tp_sp", 1], ["metp", 1]], 2, 2),
                                                 ([["ring", 1], ["ulysses", 1], ["metp", 1]], 3, 2),
                                                 ([["dp", 1], ["tp", 1], ["fsdp", 1]], 3, 8)])
def test_mixed_plans_match_reference(plan, layers, batch):
    check_against_reference(plan, batch=batch, seq=96, extra=[f"model.n_layers={layers}"])


STRATEGY_NAMES = ["dp", "fsdp", "tp", "tp_sp", "ring", "ulysses", "metp"]
REMATS = ["selective", "dots", "full"]


def _remat_matrix():
    """Every (strategy, remat) pair; the default suite runs a diagonal (each strategy once, each
    remat policy at least twice), the rest are marked slow (.ci/run runs them)."""
    return [pytest.param(s, r, marks=() if REMATS.index(r) == i % len(REMATS) else pytest.mark.slow)
            for i, s in enumerate(STRATEGY_NAMES) for r in REMATS]


@pytest.mark.parametrize("strategy, remat", _remat_matrix())
def test_every_strategy_under_remat_and_chunked_loss_matches_reference(strategy, remat):
    """Each strategy with a remat policy and the loss over small padded chunks against the
    unchunked single-device reference (one compile checks both)."""
    check_against_reference([[strategy, 2, remat]], batch=8 if strategy in ("dp", "fsdp") else 2, seq=96,
                            extra=CHUNKED, ref_extra=WHOLE)


def test_selective_remat_with_dense_attention_matches_reference():
    """Dense attention keeps no probabilities under `selective`: it runs again in the backward."""
    check_against_reference([["dp", 2, "selective"]], batch=8, seq=96, extra=["model.attention=dense"])


@pytest.mark.slow  # the reference checks above hold each strategy's step to 1e-5; this is the Trainer path
def test_every_strategy_trains_like_dp(tiny_config, tmp_path):
    import numpy as np
    import dysejax
    from sharding.strategies import STRATEGIES

    losses = {}
    for name in STRATEGIES:
        rows = dysejax.Trainer(tiny_config(f"parallel.plan={name}", "data.eval_batches=0", "data.buckets=[64]"),
                               workdir=str(tmp_path / name)).fit(steps=2)
        assert {r["plan"] for r in rows} == {name}
        losses[name] = [r["loss"] for r in rows]
    for name, values in losses.items():
        np.testing.assert_allclose(values, losses["dp"], rtol=1e-4, err_msg=name)
