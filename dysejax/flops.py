"""Model FLOPs of a train step and the device peak they are compared with (MFU).

The peak is the hardware's, never the time model's fitted rate: a GPU profile's dense bf16
peak, or on CPU a float32 matmul rate measured once (`matmul_rate`) and cached.

MFU = model FLOPs of the step / (step time x peak FLOP/s per device x devices). Model FLOPs
count what the model needs, not what the program happens to run: no remat recompute, causal
attention counted as half the score matrix (MaxText's convention), padding slots included (the
program computes them). XLA's `cost_analysis()` counts a scanned layer once, so it is not used.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Peak:
    """The peak MFU is measured against: FLOP/s per device, a short name for each step's log
    line, and where the figure comes from."""

    flops: float
    name: str
    source: str


def peak_flops(mesh, cache_dir: Optional[str] = None, override_tflops: Optional[float] = None) -> Peak:
    """The device's peak: `train.peak_tflops` if given; a device with a hardware profile (GPUs):
    its dense bf16 peak; otherwise (CPUs) the float32 matmul rate measured on one device, once
    per `cache_dir` (`cached_matmul_rate`), shared by the simulated devices (they share the
    cores): rate / devices each."""
    from costmodel.hardware import PROFILES
    from dysejax.autoplan import profile_for_kind

    if override_tflops is not None:
        return Peak(override_tflops * 1e12, "train.peak_tflops", f"train.peak_tflops = {override_tflops:g}")
    device, n = mesh.devices.flat[0], mesh.devices.size
    profile = None if device.platform == "cpu" else profile_for_kind(device.device_kind)
    if profile is not None:
        p = PROFILES[profile]
        return Peak(p.flops, f"{p.name} bf16 peak", f"{p.name} dense bf16 peak, {p.flops / 1e12:.4g} TFLOP/s per device")
    rate = cached_matmul_rate(cache_dir)
    return Peak(rate / n, f"{device.platform} matmul", f"the float32 matmul rate measured on this {device.platform} "
                f"({rate / 1e9:.1f} GFLOP/s, {n} device(s) sharing it)")


def cached_matmul_rate(cache_dir: Optional[str]) -> float:
    """`matmul_rate()`'s FLOP/s, read from `cache_dir`/matmul_rate.json when measured before on
    this device kind (else measured and written there; None: measured, not cached)."""
    import jax

    kind = jax.devices()[0].device_kind
    path = os.path.join(cache_dir, "matmul_rate.json") if cache_dir else None
    if path and os.path.exists(path):
        with open(path) as fh:
            cached = json.load(fh)
        if cached.get("device_kind") == kind:
            return float(cached["flops"])
    measured = matmul_rate()
    if path:
        os.makedirs(cache_dir, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"  # processes of one run may measure at once
        with open(tmp, "w") as fh:
            json.dump(measured, fh, indent=1)
        os.replace(tmp, path)
    return measured["flops"]


def matmul_rate(n: int = 1024, rounds: int = 5, products: int = 8) -> dict:
    """Measured float32 FLOP/s of an n x n x n matmul on the default device: the median over
    `rounds` timings of `products` chained products (after one untimed run), with the samples."""
    import time

    import jax
    import jax.numpy as jnp

    @jax.jit
    def chain(a, b):
        for _ in range(products):
            a = (a @ b) * (1.0 / n)
        return a

    a = jnp.ones((n, n), jnp.float32)
    b = jnp.ones((n, n), jnp.float32)
    jax.block_until_ready(chain(a, b))
    samples = []
    for _ in range(rounds):
        t = time.perf_counter()
        jax.block_until_ready(chain(a, b))
        samples.append(2.0 * n ** 3 * products / (time.perf_counter() - t))
    samples.sort()
    return {"flops": samples[len(samples) // 2], "samples": samples, "n": n, "device_kind": jax.devices()[0].device_kind}
