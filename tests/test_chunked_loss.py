"""The chunked loss: loss and gradients with the head and cross-entropy run over small chunks of
tokens equal the unchunked single-device reference, and the chunk bounds the loss's memory.
Each strategy's chunked loss is checked in tests/test_strategies.py's remat matrix (one compile
for both)."""
import pytest

from tests.reference import CHUNKED, WHOLE, check_against_reference


def test_chunked_loss_on_2d_mesh_and_mixed_plan():
    check_against_reference([["tp_sp", 1], ["ring", 1]], {"data": 2, "model": 4}, batch=4, seq=96, extra=CHUNKED,
                            ref_extra=WHOLE)


def _loss_temp_bytes(tokens: int, vocab: int, chunk: int, d: int = 64) -> int:
    """XLA's temp bytes of the chunked loss's forward + backward on one device."""
    import jax
    import jax.numpy as jnp

    from sharding.ops.chunked_loss import chunked_nll_sums

    def mean_nll(x, w, t, m):
        s, n = chunked_nll_sums(x, w, t, m, chunk)
        return s / n

    args = (jax.ShapeDtypeStruct((tokens, d), jnp.float32), jax.ShapeDtypeStruct((d, vocab), jnp.float32),
            jax.ShapeDtypeStruct((tokens,), jnp.int32), jax.ShapeDtypeStruct((tokens,), jnp.float32))
    return jax.jit(jax.grad(mean_nll, argnums=(0, 1))).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_loss_transient_is_bounded_by_the_chunk_not_the_length():
    """The logits never exist whole: the loss's working memory is the same at 2x the tokens and
    about LOSS_CHUNK_COPIES float32 [chunk, vocab] buffers (what the memory model charges)."""
    from costmodel.memory import LOSS_CHUNK_COPIES
    chunk, vocab = 256, 4096
    short, long = _loss_temp_bytes(2048, vocab, chunk), _loss_temp_bytes(4096, vocab, chunk)
    assert long == short
    assert long / (chunk * vocab * 4) == pytest.approx(LOSS_CHUNK_COPIES, rel=0.05)


@pytest.mark.parametrize("shape,vocab,chunk", [((16, 256), 8192, 128), ((8, 256), 16384, 128)])
def test_loss_memory_model_matches_xla_on_held_out_shapes(shape, vocab, chunk):
    """The shipped loss multipliers (fitted by benchmarks/loss_fit.py at 2K-4K tokens per row,
    chunks 256/1,024) price every strategy's loss transient within 5% of XLA's loss program at
    shapes, vocabularies and chunks the fit did not see."""
    import dataclasses
    from costmodel.memory import loss_memory
    from costmodel.memory_fit import measure_loss_samples
    from dysejax import load_config
    from dysejax.model.transformer import block_spec
    from sharding.mesh import build_mesh
    from sharding.strategies import STRATEGIES
    spec = dataclasses.replace(block_spec(load_config("configs/dynamic.yaml", []).model), compute_dtype="float32")
    samples = measure_loss_samples(list(STRATEGIES), spec, build_mesh({"data": 8}), [shape], [vocab], [chunk])
    assert {smp.strategy for smp in samples} == set(STRATEGIES)
    for smp in samples:
        predicted = loss_memory(smp.shape, smp.strategy, vocab, chunk)
        assert abs(predicted / smp.bytes - 1) < 0.05, (smp.strategy, predicted, smp.bytes)
