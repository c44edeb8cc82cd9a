"""What the cluster planners are asked about: the model, the workload and a homogeneous cluster.

`Model` is a Transformer as the cost model prices it (one layer's `BlockSpec`, the layer count,
the vocabulary, stored bytes per parameter, the loss's chunk); `load_model` reads it from a dysejax config's
`model:` section. `Workload` is one training iteration: `global_batch` sequences of `seq_len`
tokens, `micro_batch` sequences per micro-step of one model replica (a node for the ILP, a
pipeline for PTIP and HPH). `Cluster` is `n_nodes` nodes of `devices_per_node` devices of one
`costmodel.hardware` profile (ILP, PTIP); HPH's heterogeneous clusters are groups of such
devices (`costmodel.cluster.hetero.cluster`).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional, Union

import yaml

from costmodel.hardware import DeviceProfile, get_profile
from sharding.ops.blocks import BlockSpec

__all__ = ["ClusterError", "Model", "load_model", "Workload", "Cluster"]

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


class ClusterError(ValueError):
    """A bad cluster description, model config or workload (one line: the field and the fix)."""


@dataclass(frozen=True)
class Model:
    """A Transformer as the cost model prices it (hashable: planners cache per model)."""

    name: str
    spec: BlockSpec
    n_layers: int
    vocab: int
    param_bytes: int = 4  # bytes of a stored parameter (and of its gradient and optimizer moments)
    optimizer_slots: int = 2  # optimizer moments per parameter (Adam)
    loss_chunk: int = 1024  # tokens per chunk of the loss (`model.loss_chunk`; 0: all at once)

    @property
    def act_bytes(self) -> int:
        """Bytes of one activation element (the compute dtype)."""
        return _DTYPE_BYTES.get(self.spec.compute_dtype, 4)


def read_yaml(path: str, what: str):
    """The parsed YAML file at `path`; a one-line ClusterError naming `what` it should hold otherwise."""
    try:
        with open(path) as f:
            return yaml.safe_load(f)
    except OSError as e:
        raise ClusterError(f"cannot read {what} {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ClusterError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None


def load_model(path: str) -> Model:
    """The `model:` section of a dysejax config as a `Model` (dysejax's defaults for missing keys)."""
    data = read_yaml(path, "model config")
    m = data.get("model") if isinstance(data, dict) else None
    if not isinstance(m, dict):
        raise ClusterError(f"{path}: no 'model:' section; give a dysejax config such as configs/7b.yaml")
    for key in ("n_layers", "d_model", "n_heads", "vocab_size"):
        if not isinstance(m.get(key), int) or m[key] < 1:
            raise ClusterError(f"{path}: model.{key} must be a positive integer, got {m.get(key)!r}")
    gated = m.get("mlp", "gated") == "gated"
    d = m["d_model"]
    d_ff = m.get("d_ff") or (64 * math.ceil(8 * d / 3 / 64) if gated else 4 * d)
    spec = BlockSpec(n_heads=m["n_heads"], head_dim=m.get("head_dim") or d // m["n_heads"], d_model=d,
                     d_ff=int(d_ff), gated=gated, activation=m.get("activation", "silu"),
                     attention=m.get("attention", "auto"), attention_block=int(m.get("attention_block", 512)),
                     compute_dtype=m.get("compute_dtype", "float32"), n_kv_heads=m.get("n_kv_heads"))
    chunk = m.get("loss_chunk", 1024)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0:
        raise ClusterError(f"{path}: model.loss_chunk must be a non-negative integer, got {chunk!r}")
    return Model(name=os.path.splitext(os.path.basename(path))[0], spec=spec, n_layers=m["n_layers"],
                 vocab=m["vocab_size"], param_bytes=_DTYPE_BYTES.get(m.get("param_dtype", "float32"), 4),
                 loss_chunk=chunk)


@dataclass(frozen=True)
class Workload:
    """Per iteration `global_batch` sequences of `seq_len` tokens, `micro_batch` of them per
    micro-step of one model replica (gradients accumulated over the micro-steps)."""

    seq_len: int = 2048
    micro_batch: int = 4
    global_batch: int = 256

    def __post_init__(self):
        for key in ("seq_len", "micro_batch", "global_batch"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ClusterError(f"workload: {key} must be a positive integer, got {value!r}")
        if self.global_batch % self.micro_batch:
            raise ClusterError(f"workload: global batch {self.global_batch} is not a multiple of the micro-batch "
                               f"{self.micro_batch}; pick a divisor")

    @classmethod
    def split(cls, seq_len: int, global_batch: int, microbatches: int) -> "Workload":
        """`global_batch` sequences in `microbatches` micro-batches (a pipeline's view)."""
        if microbatches < 1 or global_batch % microbatches:
            raise ClusterError(f"workload: global batch {global_batch} is not divisible into {microbatches} "
                               "micro-batches; pick a divisor")
        return cls(seq_len=seq_len, micro_batch=global_batch // microbatches, global_batch=global_batch)

    @property
    def microbatches(self) -> int:
        """Micro-steps per iteration of one model replica."""
        return self.global_batch // self.micro_batch

    @property
    def tokens(self) -> int:
        return self.global_batch * self.seq_len


@dataclass(frozen=True)
class Cluster:
    """`n_nodes` nodes of `devices_per_node` devices of one profile (default: the profile's node)."""

    profile: Union[DeviceProfile, str]
    n_nodes: int = 1
    devices_per_node: Optional[int] = None
    memory_fraction: float = 0.9  # usable share of device memory (allocator, buffers, fragmentation)

    def __post_init__(self):
        if isinstance(self.profile, str):
            object.__setattr__(self, "profile", get_profile(self.profile))
        if self.devices_per_node is None:
            object.__setattr__(self, "devices_per_node", self.profile.devices_per_node)

    @classmethod
    def of(cls, n_devices: int, profile: Union[DeviceProfile, str], **kw) -> "Cluster":
        """`n_devices` in full nodes of the profile (or one node of fewer)."""
        prof = get_profile(profile) if isinstance(profile, str) else profile
        per = min(n_devices, prof.devices_per_node)
        if n_devices % per:
            raise ClusterError(f"{n_devices} devices do not fill nodes of {per}")
        return cls(prof, n_devices // per, per, **kw)

    @property
    def n_devices(self) -> int:
        return self.n_nodes * self.devices_per_node

    @property
    def memory_limit(self) -> float:
        """Usable bytes of one device."""
        return self.memory_fraction * self.profile.memory_bytes
