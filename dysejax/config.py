"""Typed run configuration: YAML + dotted overrides -> validated dataclasses.

Every field has a type and a default; unknown keys, wrong types and impossible values raise
`ConfigError` naming the field (and, for unknown keys, the closest valid names).
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

import yaml

from dysejax.errors import ConfigError

SPECIAL_TOKENS = 3  # pad, bos, eos follow the 256 byte values
BYTE_VOCAB = 256 + SPECIAL_TOKENS


@dataclass
class RopeScalingConfig:
    """Rotary frequency scaling for longer contexts (Hugging Face's `rope_scaling`)."""

    type: Literal["linear", "llama3"] = "llama3"
    factor: float = 8.0
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_position_embeddings: int = 8192  # llama3 only: the pre-training context


@dataclass
class ModelConfig:
    n_layers: int = 2
    d_model: int = 128
    n_heads: int = 8
    n_kv_heads: Optional[int] = None  # K/V heads (grouped-query attention; 1 = multi-query); default n_heads
    head_dim: Optional[int] = None  # default d_model // n_heads
    d_ff: Optional[int] = None  # default 4 * d_model (plain) or 8/3 * d_model rounded (gated)
    vocab_size: int = 264
    mlp: Literal["gated", "plain"] = "gated"
    activation: Literal["silu", "gelu", "gelu_exact", "relu"] = "silu"  # gelu: tanh form; gelu_exact: erf
    tie_embeddings: bool = True
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: Optional[RopeScalingConfig] = None
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    # auto: on a GPU a fused kernel (cudnn for unpacked bf16 rows, else pallas), on CPU dense up to
    # attention_block and blockwise above; a fused kernel falls back to blockwise where it cannot serve
    attention: Literal["auto", "dense", "blockwise", "cudnn", "pallas"] = "auto"
    attention_block: int = 512  # key block of the blockwise path; auto uses it above this length
    scan_layers: bool = True
    remat: Literal["none", "selective", "dots", "full"] = "none"  # default policy for plan runs without one
    loss_chunk: int = 1024  # tokens per chunk of the head + cross-entropy (0: all of a device's tokens at once)
    init_std: float = 0.02

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def resolved_d_ff(self) -> int:
        if self.d_ff:
            return self.d_ff
        if self.mlp == "plain":
            return 4 * self.d_model
        return 64 * math.ceil(8 * self.d_model / 3 / 64)


@dataclass
class SyntheticConfig:
    distribution: Literal["githubcode", "grch38", "lognormal", "pareto"] = "githubcode"
    num_docs: int = 2000
    min_len: int = 16
    max_len: int = 262144
    mu: float = 7.0  # lognormal: mean of log length
    sigma: float = 1.5  # lognormal: std of log length
    alpha: float = 1.2  # pareto shape; lengths = min_len * (1 + pareto(alpha))


@dataclass
class GeometricBuckets:
    min: int = 64
    max: int = 1024
    factor: float = 2.0


@dataclass
class DataConfig:
    source: Literal["stdlib", "text", "jsonl", "parquet", "arrow", "synthetic"] = "stdlib"
    path: Optional[str] = None  # folder (text) or a file / folder of *.jsonl, *.parquet, *.arrow
    text_field: str = "text"  # the text field (jsonl) or column (parquet, arrow)
    # bytes | bpe (trained on the training documents at model.vocab_size) | a tokenizer.json,
    # a sentencepiece *.model or a Hugging Face model folder
    tokenizer: str = "bytes"
    tokenizer_sample_bytes: int = 8_000_000  # bpe: train on at most this much text
    glob: str = "**/*"  # files under `path` for the text source
    documents: Literal["files", "blocks"] = "files"  # stdlib/text: whole files, or top-level blocks
    buckets: Union[list[int], GeometricBuckets] = field(default_factory=lambda: [64, 128, 256])
    tokens_per_batch: int = 2048
    long_policy: Literal["split", "truncate", "skip", "error"] = "split"
    pack: bool = True
    pack_across_buckets: bool = False  # let short documents fill spare room in longer buckets' rows
    eval_fraction: float = 0.05
    eval_batches: int = 2
    max_docs: Optional[int] = None  # cap on documents read (after the deterministic order)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)

    def bucket_lengths(self) -> list[int]:
        """The sorted bucket lengths this config describes."""
        if isinstance(self.buckets, GeometricBuckets):
            g, out, b = self.buckets, [], float(self.buckets.min)
            while round(b) <= g.max:
                if not out or round(b) > out[-1]:
                    out.append(int(round(b)))
                b *= g.factor
            return out
        return sorted(set(self.buckets))


@dataclass
class OptimizerConfig:
    name: Literal["adamw", "adam", "sgdm", "adabelief", "adam3"] = "adamw"
    lr: float = 3e-3
    warmup_steps: int = 10
    total_steps: Optional[int] = None  # schedule horizon; default train.steps
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    momentum: float = 0.9  # sgdm
    clip_norm: Optional[float] = 1.0
    weight_prediction_steps: int = 0  # XGrad s; 0 disables weight prediction


@dataclass
class TrainConfig:
    seed: int = 0
    steps: int = 40
    grad_accum: int = 1
    eval_every: int = 20
    checkpoint_every: int = 10
    keep_checkpoints: int = 3
    async_checkpoint: bool = True
    log_every: int = 1  # a log line every N steps when no progress bar shows (output not a terminal)
    tensorboard: bool = False
    progress: bool = True  # a progress bar on a terminal (log lines otherwise)
    plot: bool = True  # write WORKDIR/run.png (loss, tokens/s per bucket, plans) at the end of a run
    wandb: bool = False  # log to Weights & Biases (pip install 'dysejax[wandb]')
    wandb_project: str = "dysejax"
    wandb_mode: Literal["offline", "online"] = "offline"  # offline: WORKDIR/wandb, `wandb sync` later
    peak_tflops: Optional[float] = None  # per-device peak for MFU; default: the device's profile
    nonfinite: Literal["stop", "skip"] = "stop"  # a non-finite loss/gradient: stop, or skip the update
    compile_cache: bool = True  # JAX's persistent compilation cache
    compile_cache_dir: Optional[str] = None  # default WORKDIR/compile_cache
    peer_timeout_s: float = 120.0  # multi-process: wait this long for a process to join or answer
    init_from: Optional[str] = None  # parameters to start from (what `python -m dysejax.hf import` writes)


@dataclass
class PipelineConfig:
    stages: int = 1  # pipeline stages along the mesh's `stage` axis; 1 = no pipeline
    microbatches: int = 1  # micro-batches each batch is split into for the pipeline
    schedule: Literal["gpipe", "1f1b"] = "gpipe"
    partition: Optional[list[int]] = None  # layers per stage, summing to model.n_layers; default even


@dataclass
class ParallelConfig:
    mesh: dict[str, int] = field(default_factory=lambda: {"data": -1})
    plan: Any = "dp"  # strategy name, written plan, "auto", or a {bucket: any of those, default: ...} mapping
    memory_budget_gb: Optional[float] = None  # per device; None: what JAX's allocator can use (unlimited on CPU)
    memory_headroom: float = 0.05  # fraction of the allocator's memory left out of the default budget
    cpu_devices: int = 8  # simulated CPU devices when JAX would otherwise see only one
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    # what `plan: auto` and `--plan` predict for: auto (these devices: a GPU profile by name, on
    # CPU the calibration in costmodel_dir or the shipped one) or a profile name (a100-80gb,
    # h100, h200) to plan a GPU cluster from a laptop
    hardware: str = "auto"
    # fitted cost-model calibrations, reused by every run of the same model, devices and code
    # (default ~/.cache/dysejax/costmodel, see dysejax.runtime.user_cache_dir)
    costmodel_dir: Optional[str] = None
    # on the devices here, also time every feasible strategy's layer at the smallest and largest
    # bucket and scale the time model per strategy by measured / predicted (cached in costmodel_dir)
    profile_time: bool = False


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    workdir: Optional[str] = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------
# Building dataclasses from plain data, with errors that name the field.


def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp) if a is not type(None))
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in typing.get_args(tp))}]"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _convert(value, tp, where: str):
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, where)
            except ConfigError as e:
                errors.append(e)
        unknown = [e for e in errors if "unknown key" in str(e)]
        if unknown:  # a mapping was meant; its own error is the useful one
            raise unknown[0]
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{where}: expected one of {_type_name(tp)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return _build(tp, value, where)
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (item,) = typing.get_args(tp)
        return [_convert(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        kt, vt = typing.get_args(tp)
        return {_convert(k, kt, f"{where} key"): _convert(v, vt, f"{where}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {tp} at {where}")


def _build(cls, data: dict, where: str = ""):
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in names:
            raise ConfigError(f"unknown key {path!r}{_suggestion(path, names)} (valid keys: {', '.join(names)})")
        kwargs[key] = _convert(value, hints[key], path)
    return cls(**kwargs)


# Names other trainers use for our fields, and where ours live.
ALIASES = {
    "learning_rate": "optimizer.lr", "lr": "optimizer.lr", "max_lr": "optimizer.lr",
    "warmup": "optimizer.warmup_steps", "lr_warmup_steps": "optimizer.warmup_steps",
    "decay_steps": "optimizer.total_steps", "max_steps": "train.steps", "num_steps": "train.steps",
    "total_steps": "optimizer.total_steps", "steps": "train.steps", "seed": "train.seed",
    "num_layers": "model.n_layers", "n_layer": "model.n_layers", "hidden_size": "model.d_model",
    "num_heads": "model.n_heads", "num_attention_heads": "model.n_heads", "n_head": "model.n_heads",
    "intermediate_size": "model.d_ff", "vocab": "model.vocab_size", "batch_size": "data.tokens_per_batch",
    "seq_len": "data.buckets", "max_seq_len": "data.buckets", "weight_decay": "optimizer.weight_decay",
    "grad_clip": "optimizer.clip_norm", "max_grad_norm": "optimizer.clip_norm",
    "gradient_accumulation_steps": "train.grad_accum", "plan": "parallel.plan", "mesh": "parallel.mesh",
}


def _suggestion(path: str, names: list[str]) -> str:
    """'; did you mean ...?' for an unknown key: a close name here, or where an alias lives."""
    key = path.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(key, names, n=3, cutoff=0.5)
    target = ALIASES.get(key.lower())
    if target is not None:
        section, _, field_name = target.rpartition(".")
        here = path.rpartition(".")[0]
        close = [field_name if here == section else target]
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and v and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def parse_override(text: str) -> dict:
    """`a.b.c=value` -> {'a': {'b': {'c': value}}}, the value read as YAML (as a string when it is
    not valid YAML)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip() or any(not part for part in key.strip().split(".")):
        raise ConfigError(f"bad --set {text!r}: expected dotted.key=value, e.g. train.steps=100")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:  # e.g. data.glob=*.txt (YAML reads `*` as an alias): the text as written
        value = raw
    out: dict = value
    for part in reversed(key.strip().split(".")):
        out = {part: out}
    return out


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())


def config_from_dict(data: dict) -> Config:
    """Build and validate a Config from plain data."""
    if not isinstance(data, dict):
        raise ConfigError(f"config must be a mapping of sections, got {type(data).__name__}")
    config = _build(Config, data)
    validate(config)
    return config


def load_config(path: Optional[str] = None, overrides: Optional[list[str]] = None) -> Config:
    """Load a YAML config file (or the defaults), apply `dotted.key=value` overrides, validate."""
    data: dict = {}
    if path is not None:
        if not os.path.isfile(path):
            raise ConfigError(f"config file {path!r} not found: pass an existing YAML file to --config")
        try:
            with open(path) as f:
                data = yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path!r} is not valid YAML: {_one_line(e)}")
        except UnicodeDecodeError:
            raise ConfigError(f"config file {path!r} is not UTF-8 text")
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path!r} must hold a mapping of sections (model:, data:, ...)")
    for item in overrides or []:
        data = _merge(data, parse_override(item))
    return config_from_dict(data)


def _require(ok: bool, message: str):
    if not ok:
        raise ConfigError(message)


def validate(c: Config) -> None:
    """Checks between fields and of values that types alone do not catch."""
    m, d, o, t, p = c.model, c.data, c.optimizer, c.train, c.parallel
    for name in ("n_layers", "d_model", "n_heads", "vocab_size", "attention_block"):
        _require(getattr(m, name) > 0, f"model.{name} must be positive, got {getattr(m, name)}")
    _require(m.head_dim is None or m.head_dim > 0, f"model.head_dim must be positive, got {m.head_dim}")
    _require(m.d_ff is None or m.d_ff > 0, f"model.d_ff must be positive, got {m.d_ff}")
    _require(m.head_dim is not None or m.d_model % m.n_heads == 0,
             f"model.d_model ({m.d_model}) must be divisible by model.n_heads ({m.n_heads}), or set model.head_dim")
    _require(m.n_kv_heads is None or (m.n_kv_heads > 0 and m.n_heads % m.n_kv_heads == 0),
             f"model.n_kv_heads ({m.n_kv_heads}) must be positive and divide model.n_heads ({m.n_heads})")
    if m.rope_scaling is not None:
        r = m.rope_scaling
        _require(r.factor > 0, f"model.rope_scaling.factor must be positive, got {r.factor}")
        _require(r.type != "llama3" or (0 < r.low_freq_factor < r.high_freq_factor and r.original_max_position_embeddings > 0),
                 "model.rope_scaling: llama3 needs 0 < low_freq_factor < high_freq_factor and a positive "
                 f"original_max_position_embeddings, got {r.low_freq_factor}, {r.high_freq_factor}, "
                 f"{r.original_max_position_embeddings}")
    _require(m.resolved_head_dim % 2 == 0, f"model.head_dim must be even for rotary positions, got {m.resolved_head_dim}")
    _require(d.tokenizer != "bytes" or m.vocab_size >= BYTE_VOCAB,
             f"model.vocab_size must be at least {BYTE_VOCAB} (256 bytes + {SPECIAL_TOKENS} special ids), got {m.vocab_size}")
    if isinstance(d.buckets, list):
        _require(len(d.buckets) > 0, "data.buckets is empty: give at least one bucket length, e.g. [128, 256]")
        for i, b in enumerate(d.buckets):
            _require(b > 0, f"data.buckets[{i}] must be positive, got {b}")
    else:
        g = d.buckets
        _require(0 < g.min <= g.max, f"data.buckets: need 0 < min <= max, got min={g.min} max={g.max}")
        _require(g.factor > 1, f"data.buckets.factor must be > 1, got {g.factor}")
    _require(d.tokens_per_batch > 0, f"data.tokens_per_batch must be positive, got {d.tokens_per_batch}")
    _require(0 <= d.eval_fraction < 1, f"data.eval_fraction must be in [0, 1), got {d.eval_fraction}")
    _require(d.eval_batches >= 0, f"data.eval_batches must be >= 0, got {d.eval_batches}")
    _require(d.max_docs is None or d.max_docs > 0, f"data.max_docs must be positive, got {d.max_docs}")
    _require(d.tokenizer_sample_bytes > 0, f"data.tokenizer_sample_bytes must be positive, got {d.tokenizer_sample_bytes}")
    if d.source in ("text", "jsonl", "parquet", "arrow"):
        _require(d.path is not None, f"data.path is required for data.source={d.source!r}: set it to a folder or file")
    s = d.synthetic
    _require(0 < s.min_len <= s.max_len, f"data.synthetic: need 0 < min_len <= max_len, got {s.min_len}, {s.max_len}")
    _require(s.num_docs > 0, f"data.synthetic.num_docs must be positive, got {s.num_docs}")
    _require(s.sigma > 0 and s.alpha > 0, "data.synthetic.sigma and data.synthetic.alpha must be positive")
    _require(o.lr > 0, f"optimizer.lr must be positive, got {o.lr}")
    _require(o.warmup_steps >= 0, f"optimizer.warmup_steps must be >= 0, got {o.warmup_steps}")
    _require(o.total_steps is None or o.total_steps > 0, f"optimizer.total_steps must be positive, got {o.total_steps}")
    _require(0 <= o.min_lr_ratio <= 1, f"optimizer.min_lr_ratio must be in [0, 1], got {o.min_lr_ratio}")
    _require(o.clip_norm is None or o.clip_norm > 0, f"optimizer.clip_norm must be positive or null, got {o.clip_norm}")
    _require(o.weight_prediction_steps >= 0,
             f"optimizer.weight_prediction_steps must be >= 0, got {o.weight_prediction_steps}")
    for name in ("steps", "grad_accum", "eval_every", "checkpoint_every", "keep_checkpoints", "log_every"):
        _require(getattr(t, name) > 0, f"train.{name} must be positive, got {getattr(t, name)}")
    _require(t.peer_timeout_s > 0, f"train.peer_timeout_s must be positive, got {t.peer_timeout_s}")
    _require(len(p.mesh) > 0, "parallel.mesh is empty: name at least one axis, e.g. {data: -1}")
    for axis, size in p.mesh.items():
        _require(size == -1 or size > 0, f"parallel.mesh.{axis} must be positive or -1, got {size}")
    _require(sum(1 for v in p.mesh.values() if v == -1) <= 1, "parallel.mesh: at most one axis may be -1")
    _require(p.memory_budget_gb is None or p.memory_budget_gb > 0,
             f"parallel.memory_budget_gb must be positive, got {p.memory_budget_gb}")
    _require(0 <= p.memory_headroom < 1, f"parallel.memory_headroom must be in [0, 1), got {p.memory_headroom}")
    _require(t.peak_tflops is None or t.peak_tflops > 0, f"train.peak_tflops must be positive, got {t.peak_tflops}")
    _require(p.cpu_devices > 0, f"parallel.cpu_devices must be positive, got {p.cpu_devices}")
    _validate_pipeline(p.pipeline, p.mesh, m.n_layers)


def _validate_pipeline(pp: PipelineConfig, mesh: dict, n_layers: int) -> None:
    _require(pp.stages > 0, f"parallel.pipeline.stages must be positive (1 = no pipeline), got {pp.stages}")
    _require(pp.microbatches > 0, f"parallel.pipeline.microbatches must be positive, got {pp.microbatches}")
    if "stage" in mesh:
        _require(mesh["stage"] == pp.stages, f"parallel.mesh.stage ({mesh['stage']}) must equal "
                 f"parallel.pipeline.stages ({pp.stages}): set both to the number of stages, or drop the stage axis")
    if pp.stages == 1:
        _require(pp.microbatches == 1 and pp.partition is None,
                 "parallel.pipeline.microbatches and .partition need parallel.pipeline.stages > 1 "
                 "(to split a batch without a pipeline use train.grad_accum)")
        return
    _require(n_layers >= pp.stages, f"parallel.pipeline.stages ({pp.stages}) exceeds model.n_layers ({n_layers}): "
             "every stage needs at least one layer")
    if pp.partition is not None:
        part = pp.partition
        _require(len(part) == pp.stages, f"parallel.pipeline.partition has {len(part)} entries but "
                 f"parallel.pipeline.stages is {pp.stages}: give one layer count per stage")
        _require(all(n > 0 for n in part), f"parallel.pipeline.partition {part}: every stage needs at least one layer")
        _require(sum(part) == n_layers, f"parallel.pipeline.partition {part} sums to {sum(part)} but model.n_layers "
                 f"is {n_layers}: make the layer counts add up to {n_layers}")
