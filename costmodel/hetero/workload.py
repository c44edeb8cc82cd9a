"""The model shape (from a dysejax YAML config's `model:` section) and the per-iteration workload."""
from __future__ import annotations

import os
from dataclasses import dataclass

import yaml

from costmodel.hetero.cluster import ClusterError
from costmodel.search.ilp import ModelShape

__all__ = ["Workload", "load_model"]


@dataclass(frozen=True)
class Workload:
    """Per iteration `global_batch` sequences of `seq_len` tokens in `microbatches` micro-batches."""

    seq_len: int = 2048
    global_batch: int = 256
    microbatches: int = 64
    act_bytes: int = 2  # bf16 activations
    flash: bool = True  # blockwise attention: no s x s scores stored (the shipped configs)

    def __post_init__(self):
        for key in ("seq_len", "global_batch", "microbatches"):
            if getattr(self, key) < 1:
                raise ClusterError(f"workload: {key} must be >= 1, got {getattr(self, key)}")
        if self.global_batch % self.microbatches:
            raise ClusterError(f"workload: global batch {self.global_batch} is not divisible into "
                               f"{self.microbatches} micro-batches; pick a divisor")

    @property
    def micro_batch(self) -> int:
        """Sequences per micro-batch."""
        return self.global_batch // self.microbatches

    @property
    def tokens(self) -> int:
        return self.global_batch * self.seq_len


def load_model(path: str) -> ModelShape:
    """The `model:` section of a dysejax config (n_layers, d_model, n_heads, d_ff, vocab_size, ...)."""
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ClusterError(f"cannot read model config {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ClusterError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    m = data.get("model") if isinstance(data, dict) else None
    if not isinstance(m, dict):
        raise ClusterError(f"{path}: no 'model:' section; give a dysejax config such as configs/7b.yaml")
    for key in ("n_layers", "d_model", "n_heads", "vocab_size"):
        if not isinstance(m.get(key), int) or m[key] < 1:
            raise ClusterError(f"{path}: model.{key} must be a positive integer, got {m.get(key)!r}")
    gated = m.get("mlp", "gated") == "gated"
    d_ff = m.get("d_ff") or (4 * m["d_model"] if not gated else 64 * -(-8 * m["d_model"] // (3 * 64)))
    return ModelShape(name=os.path.splitext(os.path.basename(path))[0], n_layers=m["n_layers"],
                      d_model=m["d_model"], n_heads=m["n_heads"], d_ff=int(d_ff), vocab=m["vocab_size"],
                      gated=gated, tied=bool(m.get("tie_embeddings", True)))
