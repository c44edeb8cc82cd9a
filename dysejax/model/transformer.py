"""Decoder-only Transformer (Llama-style) whose layers run a strategy plan.

Parameters are declared once, stacked over layers, with logical axis names; they do not depend
on the plan. A plan slices the stack into runs and each run executes under one `lax.scan`
(the primitive `nn.scan` lowers to) with its remat policy, using its strategy's attention and
MLP. So the same parameters serve every plan, and switching plans moves no parameters.
"""
from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from dysejax.config import ModelConfig
from sharding import layout as L
from sharding.ops.blocks import BlockSpec
from sharding.ops.rope import RopeScaling
from sharding.plan import Plan
from sharding.stack import final_hidden, head_loss, layer_weight_shapes
from sharding.strategies import get_strategy


def rope_scaling(cfg: ModelConfig) -> Optional[RopeScaling]:
    """`model.rope_scaling` as the kernels' RopeScaling (None without one)."""
    r = cfg.rope_scaling
    if r is None:
        return None
    return RopeScaling(r.type, r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max_position_embeddings)


def block_spec(cfg: ModelConfig) -> BlockSpec:
    """The static per-layer description strategies compute with."""
    return BlockSpec(
        n_heads=cfg.n_heads, head_dim=cfg.resolved_head_dim, d_model=cfg.d_model,
        d_ff=cfg.resolved_d_ff, gated=cfg.mlp == "gated", activation=cfg.activation,
        attention=cfg.attention, attention_block=cfg.attention_block, rope_theta=cfg.rope_theta,
        norm_eps=cfg.norm_eps, compute_dtype=cfg.compute_dtype, n_kv_heads=cfg.n_kv_heads,
        rope_scaling=rope_scaling(cfg))


def _init(std: float):
    return nn.initializers.normal(stddev=std)


class Transformer(nn.Module):
    """Token ids -> logits. `plan` and `mesh` are static; parameters are the same for any plan."""

    cfg: ModelConfig

    def _param(self, name, shape, axes, init, stacked=False):
        if stacked:
            shape, axes = (self.cfg.n_layers, *shape), (L.LAYERS, *axes)
            init = _stack_init(init, self.cfg.n_layers)
        return self.param(name, nn.with_logical_partitioning(init, axes), shape,
                          jnp.dtype(self.cfg.param_dtype))

    def setup(self):
        cfg = self.cfg
        std, out_std = cfg.init_std, cfg.init_std / (2 * cfg.n_layers) ** 0.5
        inits = {"attn_norm": nn.initializers.ones, "mlp_norm": nn.initializers.ones,
                 "wq": _init(std), "wkv": _init(std), "w_in": _init(std), "wo": _init(out_std), "w_out": _init(out_std)}
        self.embed = self._param("embed", (cfg.vocab_size, cfg.d_model), (L.VOCAB, L.EMBED), _init(std))
        self.layers = {name: self._param(f"layers_{name}", shape, axes, inits[name], stacked=True)
                       for name, (shape, axes) in layer_weight_shapes(block_spec(cfg)).items()}
        self.final_norm = self._param("final_norm", (cfg.d_model,), (L.EMBED,), nn.initializers.ones)
        if not cfg.tie_embeddings:
            self.lm_head = self._param("lm_head", (cfg.d_model, cfg.vocab_size), (L.EMBED, L.VOCAB), _init(std))

    def declare(self):
        """Touch every parameter (for `init(..., method=Transformer.declare)`)."""
        return self.embed, self.layers, self.final_norm

    def hidden(self, inputs, segment_ids, positions, *, plan: Plan, mesh: Mesh):
        """Final-normed hidden states [B, S, D], in the last strategy's boundary layout."""
        cfg, spec = self.cfg, block_spec(self.cfg)
        x = get_strategy(plan.runs[0].strategy).embed(self.embed, inputs, mesh).astype(spec.dtype)
        return final_hidden(plan, self.layers, self.final_norm, x, segment_ids, positions, spec, mesh,
                            default_remat=cfg.remat, scan=cfg.scan_layers)

    def head(self):
        """The [D, V] output projection (the embedding's transpose when tied)."""
        return self.embed.T if self.cfg.tie_embeddings else self.lm_head

    def __call__(self, inputs, segment_ids, positions, targets, loss_mask, *, plan: Plan, mesh: Mesh):
        """(sum of token NLLs, number of loss tokens), the loss computed by the last strategy."""
        x = self.hidden(inputs, segment_ids, positions, plan=plan, mesh=mesh)
        return head_loss(plan, x, self.head(), targets, loss_mask, mesh, self.cfg.loss_chunk)

    def logits(self, inputs, segment_ids, positions, *, plan: Plan, mesh: Mesh):
        """float32 logits [B, S, V] (for inspection and tests; training uses `__call__`)."""
        x = self.hidden(inputs, segment_ids, positions, plan=plan, mesh=mesh)
        return jnp.einsum("bsd,dv->bsv", x, self.head().astype(x.dtype), preferred_element_type=jnp.float32)


def _stack_init(init, n: int):
    """An initializer for [n, *shape] that draws each layer independently."""
    def stacked(key, shape, dtype=jnp.float32):
        keys = jax.random.split(key, n)
        return jax.vmap(lambda k: init(k, shape[1:], dtype))(keys)
    return stacked


def count_params(params) -> int:
    """Number of scalar parameters in a tree."""
    return sum(int(x.size) for x in jax.tree.leaves(params))


def abstract_params(cfg: ModelConfig):
    """Parameter tree of ShapeDtypeStructs, boxed with logical axis names; allocates nothing."""
    return jax.eval_shape(lambda: Transformer(cfg).init(jax.random.key(0), method=Transformer.declare))["params"]


def init_params(cfg: ModelConfig, key):
    """Freshly initialised (boxed) parameters."""
    return Transformer(cfg).init(key, method=Transformer.declare)["params"]
