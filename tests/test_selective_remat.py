"""`selective` remat: what a layer keeps for its backward, by XLA's own figures.

Per layer (difference between two compiled depths, float32 as XLA:CPU computes) every strategy
keeps at most the Megatron-LM figure adapted to this model
(`costmodel.memory.megatron_activation_bytes`), no matmul runs twice, and the cost model's
stored bytes follow XLA's.
"""
import pytest

from costmodel.memory import ANALYTICAL, Shape, layer_memory, megatron_activation_bytes
from costmodel.probe import figures, layer_step
from costmodel.time import hlo_dot_flops
from sharding.mesh import build_mesh
from sharding.ops.blocks import BlockSpec
from sharding.strategies import STRATEGIES

ROWS, SEQ = 8, 1024
GATED = BlockSpec(n_heads=8, head_dim=8, d_model=64, d_ff=192, attention_block=128)
PLAIN = BlockSpec(n_heads=8, head_dim=8, d_model=64, d_ff=256, gated=False, activation="gelu",
                  attention_block=128)


def compiled(strategy, spec, remat, n_layers):
    return layer_step(strategy, spec, build_mesh({"data": 8}), ROWS, SEQ, n_layers=n_layers, remat=remat)


# The gated MLP under every strategy; the plain MLP under two (heavier: marked slow).
CASES = [(name, GATED) for name in STRATEGIES] + [pytest.param("dp", PLAIN, marks=pytest.mark.slow),
                                                  pytest.param("tp_sp", PLAIN, marks=pytest.mark.slow)]


@pytest.mark.parametrize("strategy, spec", CASES, ids=[f"{n}-gated" for n in STRATEGIES] + ["dp-plain", "tp_sp-plain"])
def test_selective_keeps_at_most_megatron_and_recomputes_no_matmul(strategy, spec):
    two, four = (compiled(strategy, spec, "selective", n) for n in (2, 4))
    kept = (figures(four)["temp"] - figures(two)["temp"]) / 2
    shape = Shape(spec, {"data": 8}, ROWS, SEQ, backend="cpu")
    megatron = megatron_activation_bytes(shape, strategy)
    assert kept <= megatron, (strategy, kept / megatron)
    predicted = layer_memory(shape, strategy, "selective", ANALYTICAL).activations  # the description's `selective`
    assert predicted == pytest.approx(kept, rel=0.02)
    dots_none = hlo_dot_flops(compiled(strategy, spec, "none", 2).as_text())
    assert hlo_dot_flops(two.as_text()) == pytest.approx(dots_none, rel=1e-6)
