"""The chunked loss: every strategy's loss and gradients with the head and cross-entropy run over
small chunks of tokens equal the unchunked single-device reference, and the chunk bounds the
loss's memory."""
import pytest

from tests.reference import check_against_reference

# 40 divides none of the per-device token counts below: the last chunk is padded
CHUNKED, WHOLE = ["model.loss_chunk=40"], ["model.loss_chunk=0"]


@pytest.mark.parametrize("strategy", ["dp", "fsdp", "tp", "tp_sp", "ring", "ulysses", "metp"])
def test_chunked_loss_matches_unchunked_reference(strategy):
    batch = 8 if strategy in ("dp", "fsdp") else 2
    check_against_reference(strategy, batch=batch, seq=96, extra=CHUNKED, ref_extra=WHOLE)


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
