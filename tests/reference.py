"""Shared check for strategies: one training step's loss and gradients vs one device.

`step_on(plan, mesh, ...)` runs loss + grads of a plan on a mesh, with parameters in the
unified storage layout; `check_against_reference` compares with the `dp` plan on one device.
A reference is computed once per process for each (reference config, parameters, batch):
many checks compare different plans with the same few references.
"""
from __future__ import annotations

import hashlib
from typing import Optional, Sequence

import flax.linen as nn
import jax
import numpy as np

from dysejax.config import load_config
from dysejax.model.transformer import Transformer, init_params
from dysejax.batches import batch_sharding
from dysejax.state import logical_axes
from sharding.layout import StorageLayout
from sharding.mesh import build_mesh
from sharding.plan import Plan, parse_plan
from sharding.strategies import STRATEGIES
from tests.conftest import TINY

# Small model: 2 layers, d=64, 8 heads of 8, blockwise attention with a block that no tested
# length is a multiple of.
MODEL = ["model.d_model=64", "model.d_ff=128", "model.vocab_size=264", "model.n_layers=2", "model.attention=blockwise",
         "model.attention_block=48"]

# Model overrides: the loss over chunks of 40 tokens (a count that divides none of the tested
# per-device token counts, so the last chunk is padded) and over all of a device's tokens at once.
CHUNKED, WHOLE = ["model.loss_chunk=40"], ["model.loss_chunk=0"]


def model_config(*extra: str):
    return load_config(TINY, MODEL + list(extra)).model


def packed_batch(batch: int, seq: int, seed: int = 0, vocab: int = 256) -> dict:
    """Random packed rows: several documents per row (segment ids), padding at the end."""
    rng = np.random.default_rng(seed)
    inputs = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    targets = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    segs = np.zeros((batch, seq), np.int32)
    pos = np.zeros((batch, seq), np.int32)
    for b in range(batch):
        t, seg = 0, 1
        end = seq - int(rng.integers(0, seq // 4))  # padding tail
        while t < end:
            n = min(int(rng.integers(1, seq // 2)), end - t)
            segs[b, t:t + n] = seg
            pos[b, t:t + n] = np.arange(n)
            t, seg = t + n, seg + 1
    mask = (segs > 0).astype(np.float32)
    mask[:, -1] = 0
    return {"inputs": inputs, "targets": targets, "segment_ids": segs, "positions": pos, "loss_mask": mask}


def step_on(plan: Plan, mesh, cfg, params, batch: dict):
    """(mean loss, grads as numpy) of one step of `plan` on `mesh`, params in the storage layout."""
    model = Transformer(cfg)
    layout = StorageLayout(mesh)
    boxed = init_params(cfg, jax.random.key(0))  # only for the logical axes
    shardings = jax.tree.map(lambda names, p: layout.sharding(names, p.shape), logical_axes(boxed),
                             nn.unbox(boxed), is_leaf=lambda x: isinstance(x, tuple))
    params = jax.device_put(params, shardings)
    bsh = batch_sharding(plan, mesh)
    batch = {k: jax.device_put(v, bsh) for k, v in batch.items()}

    def loss(p, b):
        total, count = model.apply({"params": p}, b["inputs"], b["segment_ids"], b["positions"],
                                   b["targets"], b["loss_mask"], plan=plan, mesh=mesh)
        return total / count

    value, grads = jax.jit(jax.value_and_grad(loss), out_shardings=(None, shardings))(params, batch)
    for g, want in zip(jax.tree.leaves(grads), jax.tree.leaves(shardings)):
        assert g.sharding.is_equivalent_to(want, g.ndim), (g.sharding, want)  # grads in storage layout
    return float(value), jax.tree.map(np.asarray, grads)


def relative_error(a, b) -> float:
    """max |a - b| / max |b| (0 when both are 0)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = np.max(np.abs(b))
    return float(np.max(np.abs(a - b)) / scale) if scale > 0 else float(np.max(np.abs(a)))


_REFERENCES: dict = {}  # (config, parameter and batch digests) -> (loss, grads as numpy)


def _digest(tree) -> str:
    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        leaf = np.ascontiguousarray(leaf)
        h.update(f"{jax.tree_util.keystr(path)}{leaf.dtype}{leaf.shape}".encode())
        h.update(leaf.tobytes())
    return h.hexdigest()


def reference_step(cfg, params, batch: dict):
    """(loss, grads) of the `dp` plan on one device: computed on first request, then reused
    (the key covers the whole config and every parameter and batch value)."""
    key = (repr(cfg), _digest(params), _digest(batch))
    if key not in _REFERENCES:
        plan = parse_plan("dp", cfg.n_layers, list(STRATEGIES))
        _REFERENCES[key] = step_on(plan, build_mesh({"data": 1}, jax.devices()[:1]), cfg, params, batch)
    return _REFERENCES[key]


def check_against_reference(plan_value, mesh_axes: Optional[dict] = None, *, batch: int = 2, seq: int = 200,
                            extra: Sequence[str] = (), rtol: float = 1e-5, seed: int = 0,
                            ref_extra: Sequence[str] = (), data: Optional[dict] = None):
    """Assert a plan's loss and gradients equal the single-device `dp` reference (whose config
    adds `ref_extra`) on `data` (default: `packed_batch(batch, seq, seed)`)."""
    cfg = model_config(*extra)
    params = jax.tree.map(np.asarray, nn.unbox(init_params(cfg, jax.random.key(seed))))
    data = packed_batch(batch, seq, seed) if data is None else data
    mesh = build_mesh(mesh_axes or {"data": 8})
    plan = parse_plan(plan_value, cfg.n_layers, list(STRATEGIES))
    ref_loss, ref_grads = reference_step(model_config(*extra, *ref_extra), params, data)
    loss, grads = step_on(plan, mesh, cfg, params, data)
    assert abs(loss - ref_loss) <= rtol * abs(ref_loss), (plan.id, seq, loss, ref_loss)
    for (path, g), r in zip(jax.tree_util.tree_flatten_with_path(grads)[0], jax.tree.leaves(ref_grads)):
        err = relative_error(g, r)
        assert err <= rtol, f"plan {plan.id}, seq {seq}: grad {jax.tree_util.keystr(path)} rel err {err:.2e}"
    return loss


__all__ = ["CHUNKED", "WHOLE", "check_against_reference", "packed_batch", "reference_step", "step_on", "model_config", "relative_error"]
