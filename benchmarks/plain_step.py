"""The plainest correct JAX train step of dysejax's model, written for `step_vs_plain.py` (no dysejax
code): pre-norm Llama-style layers under `lax.scan`, rotary positions, causal attention within
segment ids as a block loop (query block i attends to keys [0, (i+1)·block)), a gated (or
plain) MLP, the tied head's cross-entropy, optax clip + adamw; float32 parameters, matmuls in
the compute dtype, norms and softmax in float32. `remat="selective"` checkpoints each layer and
keeps what dysejax's `selective` keeps (q, k, v, the attention output, the residual sum, the
MLP pre-activations); the softmax's probabilities are then computed again in the backward."""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax
from jax.ad_checkpoint import checkpoint_name

LAYER_KEYS = ("attn_norm", "wq", "wkv", "wo", "mlp_norm", "w_in", "w_out")
KEPT = ("q", "k", "v", "o", "resid", "h")


@dataclass(frozen=True)
class PlainConfig:
    n_heads: int
    eps: float
    theta: float
    block: int
    remat: str
    gated: bool = True
    activation: str = "silu"
    dtype: str = "float32"  # compute dtype; parameters stay float32, norms and softmax in float32

    @classmethod
    def of(cls, m, remat: str) -> "PlainConfig":
        """From a dysejax ModelConfig (plain numbers only)."""
        return cls(m.n_heads, m.norm_eps, m.rope_theta, m.attention_block, remat, m.mlp == "gated", m.activation,
                   m.compute_dtype)


def from_dysejax(p: dict) -> dict:
    return {"embed": p["embed"], "final_norm": p["final_norm"], "layers": {k: p[f"layers_{k}"] for k in LAYER_KEYS}}


def to_dysejax(p: dict) -> dict:
    return {"embed": p["embed"], "final_norm": p["final_norm"], **{f"layers_{k}": p["layers"][k] for k in LAYER_KEYS}}


def rms_norm(x, w, eps):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + eps) * w).astype(x.dtype)


def rope(x, pos, theta):
    d = x.shape[-1]
    ang = pos[..., None].astype(jnp.float32) / theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d)
    cos, sin = jnp.cos(ang)[:, :, None], jnp.sin(ang)[:, :, None]
    x1, x2 = x[..., :d // 2].astype(jnp.float32), x[..., d // 2:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


def attention(q, k, v, seg, block: int):
    """Causal attention within equal segment ids; q, k, v [B, S, H, D] (K/V heads repeated)."""
    S, outs = q.shape[1], []
    k, v = (jnp.repeat(t, q.shape[2] // t.shape[2], axis=2) for t in (k, v))
    for start in range(0, S, block):
        end = min(start + block, S)
        s = jnp.einsum("bqhd,bkhd->bhqk", q[:, start:end], k[:, :end], preferred_element_type=jnp.float32)
        s = s / jnp.sqrt(jnp.float32(q.shape[-1]))
        causal = jnp.arange(end)[None, :] <= jnp.arange(start, end)[:, None]
        mask = causal[None, None] & (seg[:, None, start:end, None] == seg[:, None, None, :end])
        p = jax.nn.softmax(jnp.where(mask, s, -jnp.inf), axis=-1)
        outs.append(jnp.einsum("bhqk,bkhd->bqhd", p.astype(v.dtype), v[:, :end]))
    return jnp.concatenate(outs, axis=1)


def layer(cfg: PlainConfig, x, w, seg, pos):
    w = {k: a.astype(cfg.dtype) if a.ndim > 1 else a for k, a in w.items()}
    h = rms_norm(x, w["attn_norm"], cfg.eps)
    q = checkpoint_name(rope(jnp.einsum("bsd,dhk->bshk", h, w["wq"]), pos, cfg.theta), "q")
    kv = jnp.einsum("bsd,dtgk->tbsgk", h, w["wkv"])
    k, v = checkpoint_name(rope(kv[0], pos, cfg.theta), "k"), checkpoint_name(kv[1], "v")
    o = checkpoint_name(attention(q, k, v, seg, cfg.block), "o")
    x = checkpoint_name(x + jnp.einsum("bshk,hkd->bsd", o, w["wo"]), "resid")
    hid = checkpoint_name(jnp.einsum("bsd,dgf->gbsf", rms_norm(x, w["mlp_norm"], cfg.eps), w["w_in"]), "h")
    act = getattr(jax.nn, cfg.activation)(hid[0])
    return x + jnp.einsum("bsf,fd->bsd", act * hid[1] if cfg.gated else act, w["w_out"])


def loss(cfg: PlainConfig, params, batch):
    """Mean next-token cross-entropy over the loss mask."""
    body = lambda x, w: layer(cfg, x, w, batch["segment_ids"], batch["positions"])  # noqa: E731
    if cfg.remat == "selective":
        body = jax.checkpoint(body, policy=jax.checkpoint_policies.save_only_these_names(*KEPT))
    elif cfg.remat != "none":
        raise ValueError(f"plain step: remat none or selective, got {cfg.remat!r}")
    x = params["embed"][batch["inputs"]].astype(cfg.dtype)
    x, _ = jax.lax.scan(lambda x, w: (body(x, w), None), x, params["layers"])
    x = rms_norm(x, params["final_norm"], cfg.eps)
    logits = jnp.einsum("bsd,vd->bsv", x, params["embed"].astype(x.dtype), preferred_element_type=jnp.float32)
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["targets"][..., None], -1)[..., 0]
    return jnp.sum(nll * batch["loss_mask"]) / jnp.sum(batch["loss_mask"])


def optimizer(o) -> optax.GradientTransformation:
    """Clip by global norm, then adamw with a constant lr and decay on matrices (dysejax's settings)."""
    decay = lambda p: jax.tree.map(lambda a: a.ndim >= 2, p)  # noqa: E731
    return optax.chain(optax.clip_by_global_norm(o.clip_norm),
                       optax.adamw(o.lr, o.b1, o.b2, o.eps, weight_decay=o.weight_decay, mask=decay))


def train_step(cfg: PlainConfig, tx, state, batch):
    value, grads = jax.value_and_grad(lambda p: loss(cfg, p, batch))(state["params"])
    updates, opt = tx.update(grads, state["opt"], state["params"])
    return {"params": optax.apply_updates(state["params"], updates), "opt": opt}, value
