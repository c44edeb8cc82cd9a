"""Every strategy and mixed plans: one step's loss and grads equal the single-device reference."""
import pytest

from sharding.strategies import StrategyShapeError, get_strategy
from sharding.ops.blocks import BlockSpec
from sharding.mesh import build_mesh
from tests.reference import check_against_reference


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
