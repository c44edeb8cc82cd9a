"""Model FLOPs of a train step and the device peak they are compared with (MFU).

MFU = model FLOPs of the step / (step time x peak FLOP/s per device x devices). Model FLOPs
count what the model needs, not what the program happens to run: no remat recompute, causal
attention counted as half the score matrix (MaxText's convention), padding slots included (the
program computes them). XLA's `cost_analysis()` counts a scanned layer once, so it is not used.
"""
from __future__ import annotations

from typing import Optional

from dysejax.config import ModelConfig


def layer_matmul_params(cfg: ModelConfig) -> int:
    """Weights one layer multiplies each token by: QKV, output projection, MLP."""
    d, h, k, f = cfg.d_model, cfg.n_heads, cfg.resolved_head_dim, cfg.resolved_d_ff
    g = cfg.n_kv_heads or h  # K/V heads (grouped-query attention)
    return d * (h + 2 * g) * k + h * k * d + d * (2 if cfg.mlp == "gated" else 1) * f + f * d


def train_flops_split(cfg: ModelConfig, batch: int, seq_len: int, causal: bool = True) -> tuple[float, float]:
    """(weight matmul, attention score/PV) FLOPs of one step on a [batch, seq_len] batch,
    forward + backward (3x the forward)."""
    tokens = batch * seq_len
    matmul = 2.0 * tokens * (cfg.n_layers * layer_matmul_params(cfg) + cfg.d_model * cfg.vocab_size)
    attention = 4.0 * batch * seq_len ** 2 * cfg.n_heads * cfg.resolved_head_dim * cfg.n_layers
    return 3.0 * matmul, 3.0 * (attention / 2 if causal else attention)


def train_flops(cfg: ModelConfig, batch: int, seq_len: int, causal: bool = True) -> float:
    """Forward + backward FLOPs of one step on a [batch, seq_len] batch."""
    return sum(train_flops_split(cfg, batch, seq_len, causal))


def peak_flops(hardware, override_tflops: Optional[float] = None) -> tuple[float, str]:
    """(peak FLOP/s per device, where it comes from) for `autoplan.resolve_hardware`'s answer:
    a GPU profile's dense bf16 peak, or on CPU the matmul rate of the time model's calibration
    (CPUs have no vendor figure here); `train.peak_tflops` overrides both."""
    from costmodel.hardware import PROFILES

    if override_tflops is not None:
        return override_tflops * 1e12, "train.peak_tflops"
    name = hardware if isinstance(hardware, str) else hardware.meta.get("profile")
    if name:
        profile = PROFILES[name]
        return profile.flops, f"{profile.name} dense bf16 peak"
    rate = hardware.time_coefficients().matmul_flops
    return rate, f"{hardware.device_kind} matmul rate of the time model"
