"""Per-device memory of one Transformer layer under each strategy: analytical terms + XLA calibration.

For one layer run by a strategy the model gives, per device:

* states: the layer's parameters, gradients and optimizer moments in the unified storage layout
  (`sharding.layout`: each weight split over all devices along heads / MLP / embed, replicated
  when no such dim is divisible by the device count; norm scales replicated);
* stored: what the layer keeps alive until its backward (activations saved for the backward,
  plus, for `dp`, the run's gathered weight copy);
* peak: transient bytes on top while that layer runs (gathered weights and their full-size
  gradients for fsdp/ring/ulysses, gathered activations for tp_sp, travelling blocks and double
  buffers for metp, attention score tiles, the dense score matrix, MLP hidden gradients).

Each of stored and peak is a sum of named analytical features (bytes), e.g.
`stored = c_act * act + c_quad * quad + c_wsave * wsave`. Analytically every coefficient is 1.
`costmodel.memory_fit.calibrate(...)` fits the coefficients per strategy (all remat policies together) by
non-negative least squares
against XLA's exact per-device figures (`costmodel.probe`): a layer stack compiled with n = 2 and
n = 3 layers under `lax.scan` gives the per-layer stored bytes (the slope in n) and the layer's
transient (the intercept). The analytical structure (how every feature scales with s, b, h, p)
is kept, so the fitted model extrapolates to lengths and shapes outside the profiled ones.

Notation: b batch rows, s sequence length, h d_model, n heads, k head_dim, f d_ff, g = 2 for
gated MLPs, e bytes of the compute dtype, N devices, p the model-parallel group, d the batch
axes (`sharding.mesh.mesh_roles`).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Sequence

import numpy as np

from sharding.layout import STORAGE_PRIORITY
from sharding.mesh import BATCH_AXES
from sharding.ops.blocks import BlockSpec
from sharding.stack import layer_weight_shapes

STRATEGY_NAMES = ("dp", "fsdp", "tp", "tp_sp", "ring", "ulysses", "metp")
SEQ_SHARDED = ("tp_sp", "ring", "ulysses", "metp")  # boundary [b, s/p, h]
BATCH_PARALLEL = ("dp", "fsdp")  # boundary [b/N, s, h]
STORED_FEATURES = ("act", "saved", "quad", "wsave")
PEAK_FEATURES = ("wpeak", "actX", "actF", "recomp", "buf", "tile", "quadp")
F32 = 4


# ------------------------------------------------------------------------------------------------
# Shapes
# ------------------------------------------------------------------------------------------------
def mesh_roles_of(mesh_shape: Mapping[str, int]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(batch axes, model axes) of a mesh given as {axis: size} (as `sharding.mesh.mesh_roles`)."""
    names = tuple(mesh_shape)
    batch = tuple(a for a in names if a in BATCH_AXES)
    model = tuple(a for a in names if a not in BATCH_AXES)
    if not model:
        return (), batch
    return batch, model


def dtype_bytes(name) -> int:
    return int(np.dtype(str(name) if not hasattr(name, "itemsize") else name).itemsize) if str(name) != "bfloat16" else 2


@dataclass(frozen=True)
class Shape:
    """Everything the memory and time models need about one layer on one mesh for one bucket."""

    spec: BlockSpec
    mesh_shape: Mapping[str, int]
    batch: int
    seq_len: int
    param_bytes: int = 4
    optimizer_slots: int = 2
    backend: str = "gpu"  # "cpu": XLA:CPU computes bfloat16 in float32 (see `e_mem`)

    def __hash__(self):
        return hash((self.spec, tuple(self.mesh_shape.items()), self.batch, self.seq_len,
                     self.param_bytes, self.optimizer_slots, self.backend))

    @property
    def n_devices(self) -> int:
        return math.prod(self.mesh_shape.values())

    @property
    def p(self) -> int:
        """Model-parallel group size."""
        return math.prod(self.mesh_shape[a] for a in mesh_roles_of(self.mesh_shape)[1])

    @property
    def d(self) -> int:
        """Batch-axes size seen by the model-parallel strategies."""
        return math.prod(self.mesh_shape[a] for a in mesh_roles_of(self.mesh_shape)[0])

    @property
    def e(self) -> int:
        return 2 if self.spec.compute_dtype == "bfloat16" else int(np.dtype(self.spec.compute_dtype).itemsize)

    @property
    def e_mem(self) -> int:
        """Bytes per element of compute-dtype buffers XLA keeps: XLA:CPU has no bfloat16
        arithmetic and upcasts it, so its residuals and temporaries are float32 (measured: a bf16
        layer's stored bytes on CPU match the f32 formula); accelerators keep bfloat16."""
        return 4 if (self.backend == "cpu" and self.e < 4) else self.e

    @property
    def g(self) -> int:
        return 2 if self.spec.gated else 1

    def local_batch(self, strategy: str) -> float:
        return self.batch / (self.n_devices if strategy in BATCH_PARALLEL else self.d)

    def with_seq(self, seq_len: int) -> "Shape":
        return Shape(self.spec, self.mesh_shape, self.batch, seq_len, self.param_bytes, self.optimizer_slots,
                     self.backend)


class _FakeMesh:
    """Just enough of a jax Mesh for `Strategy.check` and `StorageLayout.spec` (names and sizes)."""

    def __init__(self, mesh_shape: Mapping[str, int]):
        self.shape = dict(mesh_shape)
        self.axis_names = tuple(mesh_shape)
        self.devices = np.empty(tuple(mesh_shape.values()), dtype=object)


def feasible_strategies(spec: BlockSpec, mesh_shape: Mapping[str, int], batch: int, seq_len: int,
                        names: Optional[Iterable[str]] = None) -> list[str]:
    """Registered strategies whose `check` accepts this shape on this mesh (no devices needed)."""
    from sharding.strategies import STRATEGIES, StrategyShapeError
    mesh = _FakeMesh(mesh_shape)
    out = []
    for name in (names or STRATEGIES):
        try:
            STRATEGIES[name].check(spec, mesh, batch, seq_len)
        except StrategyShapeError:
            continue
        out.append(name)
    return out


def _split_count(logical: Sequence[str], shape: Sequence[int], n: int) -> int:
    """How many ways the storage layout splits this weight (sharding.layout's rule)."""
    if sum(1 for a in logical if a != "layers") < 2:
        return 1
    for name in STORAGE_PRIORITY:
        if name in logical and shape[list(logical).index(name)] % n == 0:
            return n
    return 1


def layer_param_elems(spec: BlockSpec, n_devices: int = 1) -> tuple[float, float]:
    """(elements stored per device, elements of the full layer) of one layer's weights."""
    local = full = 0.0
    for _, (shape, axes) in layer_weight_shapes(spec).items():
        size = math.prod(shape)
        full += size
        local += size / _split_count(axes, shape, n_devices)
    return local, full


def embedding_elems(vocab: int, d_model: int, n_devices: int) -> float:
    """Elements of the [V, D] embedding table stored per device (split over vocab, else embed)."""
    return vocab * d_model / _split_count(("vocab", "embed"), (vocab, d_model), n_devices)


# ------------------------------------------------------------------------------------------------
# Analytical features
# ------------------------------------------------------------------------------------------------
@dataclass
class LayerMemory:
    """Per-device bytes of one layer: states (params + grads + optimizer), stored activations and
    the transient peak, with the named features they were computed from."""

    states: float
    activations: float
    peak: float
    stored_terms: dict = field(default_factory=dict)
    peak_terms: dict = field(default_factory=dict)

    @property
    def stored(self) -> float:
        """Bytes the layer keeps until its backward: stored activations + states."""
        return self.activations + self.states


def _uses_blockwise(spec: BlockSpec, s: int) -> bool:
    return spec.use_blockwise(s)


@dataclass(frozen=True)
class Geometry:
    """What one device holds for one layer of a strategy (elements, not bytes)."""

    bl: float  # batch rows
    sb: float  # sequence positions of the boundary activation
    s_in: float  # sequence positions of a sub-layer's input as the sub-layer sees it
    att_tokens: float  # rows x positions of the attention-width activations (q, k, v, o)
    heads: float  # heads those activations carry
    kv_heads: float  # K/V heads of the k and v activations (grouped-query attention)
    mlp_elems: float  # elements of one MLP hidden activation [tokens, d_ff share]
    dense: bool  # attention materialises the score matrix
    score_rows: float  # batch x heads x queries x keys of the dense scores (0 if blockwise)
    tiles: float  # elements of one (bq x bk) score tile x heads x rows (blockwise kernels)


def geometry(shape: Shape, strategy: str) -> Geometry:
    """Local extents of one layer of `strategy` on one device."""
    spec, s, p = shape.spec, shape.seq_len, shape.p
    n, f, blk = spec.n_heads, spec.d_ff, spec.attention_block
    kv = {"tp": max(spec.kv_heads, p) / p, "tp_sp": max(spec.kv_heads, p) / p, "ulysses": max(spec.kv_heads, p),
          "metp": max(spec.kv_heads, p) / p}.get(strategy, spec.kv_heads)  # replicated up to whole heads per device
    bl = shape.local_batch(strategy)
    blockwise = _uses_blockwise(spec, s)
    if strategy in BATCH_PARALLEL:
        sb = s_in = s
        tok, heads, mlp = bl * s, n, bl * s * f
        dense = not blockwise
        score = bl * n * s * s if dense else 0.0
        tiles = bl * n * min(blk, s) ** 2 if blockwise else 0.0
    elif strategy in ("tp", "tp_sp"):
        sb, s_in = (s / p if strategy == "tp_sp" else s), s
        tok, heads, mlp = bl * s, n / p, bl * s * f / p
        dense = not blockwise
        score = bl * n / p * s * s if dense else 0.0
        tiles = bl * n / p * min(blk, s) ** 2 if blockwise else 0.0
    elif strategy == "ring":
        c = s / p
        sb = s_in = c
        tok, heads, mlp = bl * c, n, bl * c * f
        dense, score = False, 0.0
        tile = min(blk, c) if blockwise else c  # untiled ring steps score whole chunk pairs
        tiles = bl * n * tile * tile
    elif strategy == "ulysses":
        c = s / p
        sb = s_in = c
        tok, heads, mlp = bl * c, n, bl * c * f
        dense = not blockwise
        score = bl * n / p * s * s if dense else 0.0
        tiles = bl * n / p * min(blk, s) ** 2 if blockwise else 0.0
    elif strategy == "metp":
        c = s / p
        sb = s_in = c
        tok, heads, mlp = bl * c, n, 0.0
        dense, score = False, 0.0
        tiles = bl * n / p * min(blk, c) ** 2
    else:
        raise KeyError(f"no memory model for strategy {strategy!r} (known: {', '.join(STRATEGY_NAMES)})")
    return Geometry(bl, sb, s_in, tok, heads, kv, mlp, dense, score, tiles)


def analytical_features(shape: Shape, strategy: str, remat: str = "none") -> tuple[dict, dict]:
    """(stored features, peak features), bytes per device, of one layer of `strategy` under `remat`.

    Stored activations are what JAX saves for the backward of the scanned layer
    (`jax._src.ad_checkpoint.saved_residuals` on the layer stack; checked per strategy):
      * norms: 4 boundary-sized f32 arrays (x and the residual sum, upcast, with their norm
        statistics) + 2 sub-layer inputs in the compute dtype as the sub-layer sees them (the
        full sequence for tp / tp_sp: tp_sp's gathered inputs are kept, not re-gathered);
      * attention: q, k, v and o in the compute dtype (4; ulysses keeps o in both layouts: 5;
        metp only o per head group: 1) + the f32 log-sum-exp; dense attention (s <= block)
        keeps the f32 probabilities [b, heads, s, s] and one more o-sized array;
      * MLP: 6 hidden-sized arrays [tokens, d_ff share] (pre-activations, activation
        intermediates and output; metp recomputes them: 0);
      * weights: fsdp / ring / ulysses keep the gathered (compute-dtype) weights of each layer,
        dp the run's gathered copy (+ a compute-dtype cast), tp / metp a cast of their block
        when the compute dtype differs from the stored one (or the block gathered over batch axes).
    Under remat "full" only the layer input (and dp's run-level copy) stays; under "dots" the
    matmul outputs without batch dimensions stay (q/k/v, MLP pre-activations, projection outputs).
    Peak features: the layer's residual-sized working set in its backward, by kind ("actX"
    hidden- and attention-width-sized, "actF" MLP-hidden-sized x g: gradients of its
    residuals), under remat the rebuilt residuals ("recomp", of which XLA keeps only part live at
    once), gathered weights and
    their full-size gradients or METP's travelling weight blocks ("wpeak"), ring / METP blocks
    in flight ("buf"), blockwise score tiles ("tile"), dense score
    transients and hoisted masks ("quadp").
    """
    spec, p, g = shape.spec, shape.p, shape.g
    e = shape.e_mem  # bytes of a compute-dtype element as XLA keeps it
    h, k = spec.d_model, spec.head_dim
    N, pb, d = shape.n_devices, shape.param_bytes, shape.d
    geo = geometry(shape, strategy)
    _, w_full = layer_param_elems(spec, N)
    big = w_full - 2 * h  # the four matrices, without the norm scales
    converted = shape.e != pb  # weights are cast to the compute dtype: a separate buffer
    cast = e if converted else 0  # bytes of that copy
    st = dict.fromkeys(STORED_FEATURES, 0.0)
    pk = dict.fromkeys(PEAK_FEATURES, 0.0)
    Xb32 = geo.bl * geo.sb * h * F32  # boundary-sized f32 array
    Xb = geo.bl * geo.sb * h * e
    Xin = geo.bl * geo.s_in * h * e
    A = geo.att_tokens * geo.heads * k * e
    Akv = geo.att_tokens * geo.kv_heads * k * e  # one of k, v
    F = geo.mlp_elems * e
    lse = geo.att_tokens * geo.heads * F32
    n_att = {"ulysses": 5, "metp": 1}.get(strategy, 4) + (1 if geo.dense else 0)
    kv_saved = 0.0 if strategy == "metp" else 2 * (Akv - A)  # k and v are narrower than q and o
    act_none = 4 * Xb32 + 2 * Xin + n_att * A + kv_saved + 6 * F + (0.0 if geo.dense else lse)
    quad = geo.score_rows * F32

    # weights kept per layer (remat none) and transient weight bytes
    if strategy == "dp":  # the run's gathered copy and the stacked full-size f32 gradients
        # (+ a compute-dtype cast; XLA:CPU computes bf16 in f32 and keeps no separate cast)
        wsave_none = big * (pb + F32 + (cast if shape.backend != "cpu" else 0))
        wsave_remat = big * (pb + F32)
        wpeak = big * F32
    elif strategy in ("fsdp", "ring", "ulysses"):
        wsave_none, wsave_remat = big * (e if converted else pb), 0.0
        wpeak = big * (pb + cast) + big * F32
    elif strategy in ("tp", "tp_sp"):
        blk = big / p
        wsave_none = blk * e if (converted or d > 1) else 0.0
        wsave_remat = 0.0
        wpeak = blk * (pb + F32) if d > 1 else blk * cast
    else:  # metp: travelling MLP blocks + grads (double buffered), head-group broadcasts
        blk = big / p
        wsave_none = blk * e if (converted or d > 1) else 0.0
        wsave_remat = 0.0
        w_mlp = (g * h * spec.d_ff + spec.d_ff * h) / p
        w_att = ((2 * spec.n_heads + 2 * max(spec.kv_heads, p)) * h * k) / p
        wpeak = 2 * w_mlp * e + 2 * w_mlp * F32 + 2 * w_att * e + w_att * F32
        if d > 1:
            wpeak += blk * (pb + F32)

    # buffers in flight
    if strategy == "ring":
        buf = 2 * 2 * Akv + 2 * geo.att_tokens * geo.kv_heads * k * F32  # K/V double buffer + dK/dV f32
    elif strategy == "metp":
        kv = 2 * geo.att_tokens * geo.kv_heads * k
        buf = 2 * kv * e + kv * F32 + 3 * A / p + 2 * geo.att_tokens * h * F32 + (g + 1) * geo.att_tokens * spec.d_ff / p * e
    else:  # tp / tp_sp gathered inputs and partial sums are sub-layer-input-sized: in "actX"
        buf = 0.0

    pk["wpeak"] = wpeak
    # gradients of the sub-layer inputs / outputs and attention-width arrays, as the sub-layer
    # sees them (full sequence for tp / tp_sp), and of the MLP hidden (g of them for gated MLPs)
    # (in the compute dtype even on XLA:CPU, whose bf16 residuals are f32: fits the measured peaks)
    r = shape.e / e
    pk["actX"] = 3 * (Xin + A) * r
    pk["actF"] = 3 * g * F * r
    pk["buf"] = buf
    pk["tile"] = geo.tiles * F32
    pk["quadp"] = quad
    pk["recomp"] = 0.0
    if remat == "none":
        st["act"] = act_none
        st["quad"] = quad
        st["wsave"] = wsave_none
        return st, pk
    if remat == "full":
        saved = Xb
    elif remat == "dots":
        if strategy == "metp":  # the ring steps' projection outputs are matmuls without batch dims
            saved = Xb + p * geo.bl * geo.sb * h * e + 3 * A
        elif strategy in ("tp", "tp_sp"):
            saved = Xb + Xin + 3 * A + g * F
        else:
            saved = 2 * Xb + 3 * A + g * F
    else:
        raise ValueError(f"remat must be none, full or dots, got {remat!r}")
    st["saved"] = saved
    st["wsave"] = wsave_remat
    pk["recomp"] = max(act_none - saved, 0.0)  # residuals the recompute rebuilds (partly live at once)
    pk["quadp"] = 2 * quad  # the probabilities are rebuilt in the backward
    return st, pk


def layer_states(shape: Shape) -> float:
    """Bytes per device of one layer's parameters, gradients and optimizer moments (storage layout)."""
    local, _ = layer_param_elems(shape.spec, shape.n_devices)
    return local * shape.param_bytes * (2 + shape.optimizer_slots)


# ------------------------------------------------------------------------------------------------
# Coefficients and the model
# ------------------------------------------------------------------------------------------------
@dataclass
class MemoryCoefficients:
    """Multipliers of the analytical features, per (strategy, remat); missing = 1 (analytical)."""

    # {strategy: {feature: c}} (one fit over all remats), or {"strategy@remat": ...} (per policy)
    stored: dict = field(default_factory=dict)
    peak: dict = field(default_factory=dict)

    def key(self, strategy: str, remat: str = "none") -> Optional[str]:
        """The entry that holds this strategy's multipliers (per policy first), or None."""
        for key in (f"{strategy}@{remat}", strategy):
            if key in self.stored:
                return key
        return None

    def get(self, strategy: str, remat: str = "none") -> tuple[dict, dict]:
        key = self.key(strategy, remat)
        return (self.stored[key], self.peak.get(key, {})) if key else ({}, {})

    def to_json(self) -> dict:
        return {"stored": self.stored, "peak": self.peak}

    @classmethod
    def from_json(cls, data: Mapping) -> "MemoryCoefficients":
        return cls(stored=dict(data.get("stored", {})), peak=dict(data.get("peak", {})))


ANALYTICAL = MemoryCoefficients()


def layer_memory(shape: Shape, strategy: str, remat: str = "none",
                 coefficients: Optional[MemoryCoefficients] = None) -> LayerMemory:
    """Per-device bytes of one layer of `strategy` under `remat`, with these feature multipliers
    (None: the shipped ones, `default_coefficients()`; `ANALYTICAL`: all 1)."""
    st, pk = analytical_features(shape, strategy, remat)
    if coefficients is None:
        coefficients = default_coefficients()
    cs, cp = coefficients.get(strategy, remat)
    act = sum(cs.get(name, 1.0) * v for name, v in st.items())
    peak = sum(cp.get(name, 1.0) * v for name, v in pk.items())
    return LayerMemory(states=layer_states(shape), activations=act, peak=peak, stored_terms=st, peak_terms=pk)


def boundary_bytes(shape: Shape, strategy: str) -> float:
    """Bytes per device of one [b, s, h] activation in the strategy's boundary layout."""
    bl = shape.local_batch(strategy)
    s = shape.seq_len / (shape.p if strategy in SEQ_SHARDED else 1)
    return bl * s * shape.spec.d_model * shape.e


def boundary_kind(strategy: str) -> str:
    """Which boundary layout a strategy uses: 'batch' [b/N, s, h], 'replicated' [b/d, s, h] or 'seq'."""
    if strategy in BATCH_PARALLEL:
        return "batch"
    if strategy == "tp":
        return "replicated"
    return "seq"


def switch_bytes(shape: Shape, a: str, b: str) -> float:
    """Transient bytes of moving activations (and their gradient in the backward) from a's boundary
    layout to b's: the destination buffer plus, for an all-to-all, the source copy."""
    if boundary_kind(a) == boundary_kind(b):
        return 0.0
    return boundary_bytes(shape, a) + boundary_bytes(shape, b)


def base_memory(shape: Shape, vocab: int, n_layers: int) -> float:
    """Bytes per device outside the layers that every plan pays: the embedding / head and final
    norm parameters with their gradients and optimizer moments (storage layout), the optimizer
    update's temporary of the whole state, and the batch arrays (inputs, targets, segment ids,
    positions, loss mask; worst case over the token layouts)."""
    spec, N = shape.spec, shape.n_devices
    h, pb = spec.d_model, shape.param_bytes
    emb = embedding_elems(vocab, h, N) + h
    local_layer, _ = layer_param_elems(spec, N)
    states = emb * pb * (2 + shape.optimizer_slots)
    update = (emb + n_layers * local_layer) * pb  # the optimizer's `updates` tree before it is applied
    batch_arrays = 5 * shape.batch * shape.seq_len * 4 / max(1, min(shape.n_devices, shape.d * shape.p))
    return states + update + batch_arrays


def loss_memory(shape: Shape, strategy: str, vocab: int) -> float:
    """Transient bytes per device of the embedding lookup and the loss when `strategy` computes
    them (while every layer's stored activations are alive): float32 logits and their gradient
    for the tokens a device holds (vocabulary-parallel for tp / tp_sp when the vocabulary
    divides, the sequence then gathered for tp_sp), the gathered head table and its full-size
    gradient otherwise, and the final norm's input / output / gradient."""
    h, e, pb = shape.spec.d_model, shape.e_mem, shape.param_bytes
    bl = shape.local_batch(strategy)
    if strategy in ("tp", "tp_sp") and vocab % shape.p == 0:
        logits = bl * shape.seq_len * vocab / shape.p * F32 * 2
        head = 0.0
    else:
        s_loc = shape.seq_len / (shape.p if strategy in SEQ_SHARDED else 1)
        logits = bl * s_loc * vocab * F32 * 2
        head = vocab * h * (pb + (e if e != pb else 0) + F32)
    acts = 3 * bl * (shape.seq_len / (shape.p if strategy in SEQ_SHARDED else 1)) * h * e
    return logits + head + acts


def plan_layer_bytes(shape: Shape, strategy: str, remat: str, n_layers: int,
                     coefficients: Optional[MemoryCoefficients] = None) -> float:
    """Per-device bytes of an n-layer `layer_step` as `costmodel.probe` compiles it (no optimizer
    state): n x (params + grads + stored activations) + peak + the input/output activations."""
    m = layer_memory(shape, strategy, remat, coefficients)
    local, _ = layer_param_elems(shape.spec, shape.n_devices)
    w = local * shape.param_bytes * 2
    return n_layers * (w + m.activations) + m.peak + 2 * boundary_bytes(shape, strategy)


# ------------------------------------------------------------------------------------------------
# Shipped coefficients (fitted on XLA:CPU by benchmarks/costmodel_accuracy.py --write-coefficients)
# ------------------------------------------------------------------------------------------------
DEFAULT_COEFFICIENTS_PATH = os.path.join(os.path.dirname(__file__), "memory_coefficients.json")
_DEFAULT: list = []


def default_coefficients() -> MemoryCoefficients:
    """The memory corrections shipped with dysejax (analytical = all 1 if the file is missing)."""
    if not _DEFAULT:
        coeffs = MemoryCoefficients()
        if os.path.exists(DEFAULT_COEFFICIENTS_PATH):
            with open(DEFAULT_COEFFICIENTS_PATH) as fh:
                coeffs = MemoryCoefficients.from_json(json.load(fh))
        _DEFAULT.append(coeffs)
    return _DEFAULT[0]


def write_default_coefficients(coefficients: MemoryCoefficients, meta: Optional[dict] = None) -> str:
    """Replace the shipped coefficients file (and the cached copy)."""
    data = coefficients.to_json()
    if meta:
        data["meta"] = meta
    with open(DEFAULT_COEFFICIENTS_PATH, "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
    _DEFAULT.clear()
    return DEFAULT_COEFFICIENTS_PATH
