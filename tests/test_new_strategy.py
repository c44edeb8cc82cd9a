"""Adding a strategy is one file: a strategy defined here alone trains like the single-device
reference, and `plan: auto` prices it and chooses it where it is the cheapest.

`kv_allgather` is context parallelism by all-gather (as in Llama 3's training): activations
split along the sequence like `ring`, weights gathered per layer, and each device gathers the
whole K/V of its rows over the model group (one all-gather forward, one reduce-scatter of dK/dV
backward) to attend its query chunk to every key. Nothing outside this file knows its name.
"""
import numpy as np
import pytest
from jax import lax

import dysejax
from costmodel.table import cost_table
from dysejax.autoplan import AutoPlanner
from dysejax.model.transformer import block_spec
from sharding.ops import blocks
from sharding.ops.ring_attention import chunk_index
from sharding.plan import parse_plan
from sharding.strategies import STRATEGIES
from sharding.strategies.base import model_entry
from sharding.strategies.description import (
    F32, MODEL_ROLE, AttentionWork, Collective, Description, gather_per_layer, gathered_weights, projection_flops,
    recomputes_attention, residuals, saved_under, selective, standard_dots)
from sharding.strategies.ring import SequenceSharded
from tests.reference import MODEL, check_against_reference, model_config

NAME = "kv_allgather"


class KVAllGather(SequenceSharded):
    """Sequence-split activations (the `ring` boundary layout); attention over gathered K/V."""

    name = NAME

    def attend(self, q, k, v, segment_ids, spec, mesh):
        axis = model_entry(mesh)

        def local(q, k, v, seg):
            index = chunk_index(seg.shape[0], seg.shape[1], axis)
            k_all, v_all, seg_all, index_all = (lax.all_gather(a, axis, axis=1, tiled=True)
                                                for a in (k, v, seg, index))
            return blocks.local_attention(q, k_all, v_all, spec, q_segment_ids=seg, kv_segment_ids=seg_all,
                                          q_index=index, kv_index=index_all)

        return self.local_attention(local, mesh)(q, k, v, segment_ids)

    def describe(self, shape, remat="none"):
        spec, p, s = shape.spec, shape.p, shape.seq_len
        n, G, k = spec.n_heads, spec.kv_heads, spec.head_dim
        rows, c = self.rows(shape), self.boundary_seq(shape)
        blk = spec.attention_block
        if shape.blockwise:  # tiles of the chunk's queries against all keys
            dense, score, tiles = False, 0.0, rows * n * min(blk, c) * min(blk, s)
        else:
            dense, score, tiles = True, rows * n * c * s, 0.0
        ext = self.chunk_extents(shape, G, dense, score, tiles)
        kept, transient = gathered_weights(shape, remat)
        kv_all = 2 * rows * s * G * k  # the gathered K and V (elements)
        # the backward keeps the gathered K/V (p chunk-sized k and v each) instead of its own chunk's
        saved = saved_under(remat, residuals(ext, kv=2 * p), standard_dots(shape), selective(ext, shape.g, kv=2 * p))
        gather = (Collective("all-gather", MODEL_ROLE, kv_all * shape.e, 1 + recomputes_attention(remat)),
                  Collective("reduce-scatter", MODEL_ROLE, kv_all * shape.e))
        return Description(
            ext, saved, kept, transient, kv_all * (shape.e_mem + F32),  # gathered K/V and their f32 grads
            projection_flops(shape, rows * c, remat),
            # the last chunk's queries see p - 1 whole chunks of keys and its own diagonal one
            AttentionWork(rows, n, c, c, blocks=p, tiled=shape.blockwise, flash=shape.blockwise),
            shape.tiles(c, s) if shape.blockwise else 0,
            gather_per_layer(shape, remat) + gather)


@pytest.fixture
def registered(monkeypatch):
    """The new strategy in the registry for one test (the only place it is registered)."""
    monkeypatch.setitem(STRATEGIES, NAME, KVAllGather())
    return NAME


@pytest.mark.parametrize("plan, mesh, remat", [(NAME, {"data": 8}, "none"),
                                               ([[NAME, 1, "full"], ["ring", 1]], {"data": 2, "model": 4}, "dots")])
def test_new_strategy_matches_reference(registered, plan, mesh, remat):
    """Alone on 8 devices, and beside `ring` (the same boundary layout) on a 2-D mesh under remat."""
    check_against_reference(plan, mesh, batch=2, seq=96, extra=[f"model.remat={remat}"])


def test_auto_prices_and_chooses_new_strategy(registered, monkeypatch):
    """The cost table prices the new strategy from its description alone (the others' prices
    unchanged), the per-bucket search picks it where it is the cheapest option and leaves it
    where no plan with it fits the budget."""
    spec = block_spec(model_config())
    mesh, batch, seq, n_layers, vocab = {"data": 8}, 2, 128, 2, 264
    table = cost_table(spec, mesh, batch, seq, n_layers, vocab)
    new = [i for i, c in enumerate(table.choices) if c.strategy == NAME]
    assert [table.choices[i].remat for i in new] == ["none", "selective", "dots", "full"]
    for arr in (table.layer_time_s, table.layer_stored_bytes, table.layer_peak_bytes):
        assert np.all(np.isfinite(arr[new])) and np.all(arr[new] > 0)
    assert table.switch_time_s[table.index(NAME), table.index("ring")] == 0  # ring's boundary layout
    others = [i for i in range(table.K) if i not in new]
    monkeypatch.delitem(STRATEGIES, NAME)
    without = cost_table(spec, mesh, batch, seq, n_layers, vocab)
    monkeypatch.setitem(STRATEGIES, NAME, KVAllGather())
    assert without.choices == tuple(table.choices[i] for i in others)
    for got, want in ((without.layer_time_s, table.layer_time_s), (without.layer_stored_bytes, table.layer_stored_bytes),
                      (without.layer_peak_bytes, table.layer_peak_bytes), (without.switch_time_s, table.switch_time_s)):
        np.testing.assert_array_equal(got, want[np.ix_(others, others)] if got.ndim == 2 else want[others])

    # the fastest option here (one K/V gather against ring's hops and tile loop, tp's all-reduces): chosen
    assert int(np.argmin(table.layer_time_s)) == table.index(NAME)
    need = table.plan_bytes_backward(table.uniform(NAME))
    chosen = AutoPlanner(spec, mesh, n_layers, vocab, "a100-80gb", budget=int(need * 1.01)).plan(seq, batch)
    assert chosen.fits and chosen.plan == parse_plan(NAME, n_layers, list(STRATEGIES))
    # below what any plan with one of its layers needs, the search prices it out
    least = min(table.plan_bytes_backward(pair) for k in new for j in range(table.K) for pair in ([k, j], [j, k]))
    chosen = AutoPlanner(spec, mesh, n_layers, vocab, "a100-80gb", budget=least - 1).plan(seq, batch)
    assert chosen.fits and NAME not in chosen.plan.strategies()


def test_trainer_auto_plan_runs_new_strategy(registered, tiny_config, tmp_path):
    """`parallel.plan: auto` on the devices here plans the new strategy and trains with it."""
    cfg = tiny_config("parallel.plan=auto", "data.buckets=[128]", "data.tokens_per_batch=256", "data.eval_batches=0",
                      *MODEL)
    rows = dysejax.Trainer(cfg, workdir=str(tmp_path), verbose=False).fit(steps=2)
    assert {r["plan"] for r in rows} == {NAME}
    assert all(np.isfinite(r["loss"]) for r in rows)
