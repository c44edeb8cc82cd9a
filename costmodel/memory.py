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

from sharding.layout import BATCH, SEQ, STORAGE_PRIORITY
from sharding.mesh import BATCH_AXES, STAGE_AXIS
from sharding.ops.blocks import BlockSpec
from sharding.stack import layer_weight_shapes
from sharding.strategies import STRATEGIES, StrategyShapeError, get_strategy
from sharding.strategies.description import F32, Description, Extents, LayerShape, Saved

STORED_FEATURES = ("act", "saved", "quad", "wsave")
PEAK_FEATURES = ("wpeak", "actX", "actF", "recomp", "buf", "tile", "quadp")


# ------------------------------------------------------------------------------------------------
# Shapes
# ------------------------------------------------------------------------------------------------
def mesh_roles_of(mesh_shape: Mapping[str, int]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(batch axes, model axes) of a mesh given as {axis: size} (as `sharding.mesh.mesh_roles`:
    never a pipeline's stage axis)."""
    names = tuple(a for a in mesh_shape if a != STAGE_AXIS)
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
        """Devices a layer spans: every axis but a pipeline's stage axis (a stage holds its layers)."""
        return math.prod(n for a, n in self.mesh_shape.items() if a != STAGE_AXIS)

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

    @property
    def layer(self) -> LayerShape:
        """The shape as strategy descriptions take it."""
        return LayerShape(self.spec, self.p, self.d, self.batch, self.seq_len, self.e, self.e_mem,
                          self.param_bytes, self.backend)

    def local_batch(self, strategy: str) -> float:
        return get_strategy(strategy).rows(self.layer)

    def with_seq(self, seq_len: int) -> "Shape":
        return Shape(self.spec, self.mesh_shape, self.batch, seq_len, self.param_bytes, self.optimizer_slots,
                     self.backend)


def strategy_names() -> tuple[str, ...]:
    """The registered strategies, now (one registered after this module's import included)."""
    return tuple(STRATEGIES)


def feasible_strategies(spec: BlockSpec, mesh_shape: Mapping[str, int], batch: int, seq_len: int,
                        names: Optional[Iterable[str]] = None) -> list[str]:
    """Registered strategies whose checks accept this shape on this mesh (no devices needed)."""
    shape = Shape(spec, mesh_shape, batch, seq_len).layer
    out = []
    for name in (names or STRATEGIES):
        try:
            STRATEGIES[name].check_shape(shape)
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


def describe(shape: Shape, strategy: str, remat: str = "none") -> Description:
    """What one layer of `strategy` keeps and moves on one device (the strategy's own description)."""
    return get_strategy(strategy).describe(shape.layer, remat)


def geometry(shape: Shape, strategy: str) -> Extents:
    """Local extents of one layer of `strategy` on one device."""
    return describe(shape, strategy).extents


def _saved_bytes(saved: Saved, geo: Extents, shape: Shape) -> float:
    """Bytes of the arrays a description says the backward keeps."""
    h, k, e = shape.spec.d_model, shape.spec.head_dim, shape.e_mem
    return (saved.boundary_f32 * geo.rows * geo.seq * h * F32
            + saved.boundary * geo.rows * geo.seq * h * e
            + saved.inputs * geo.rows * geo.seq_in * h * e
            + saved.att * geo.att_tokens * geo.heads * k * e
            + saved.kv * geo.att_tokens * geo.kv_heads * k * e
            + saved.mlp * geo.mlp_elems * e
            + saved.lse * geo.att_tokens * geo.heads * F32)


def analytical_features(shape: Shape, strategy: str, remat: str = "none") -> tuple[dict, dict]:
    """(stored features, peak features), bytes per device, of one layer of `strategy` under `remat`.

    Every feature is priced from the strategy's description (`Strategy.describe`):
      * act (remat none) / saved (remat full or dots): the arrays the backward keeps
        (`Description.saved`: boundary-sized f32 and compute-dtype arrays, sub-layer inputs,
        attention-width q/o and k/v arrays, the f32 log-sum-exp, MLP hidden arrays), as JAX
        saves them for the scanned layer (`jax._src.ad_checkpoint.saved_residuals`);
      * quad: the dense attention probabilities [rows, heads, s, s] in f32 (remat none);
      * wsave: weight bytes kept per layer (`weights_kept`).
    Peak features: the layer's residual-sized working set in its backward, by kind ("actX"
    hidden- and attention-width-sized, "actF" MLP-hidden-sized x g: gradients of its
    residuals), under remat the rebuilt residuals ("recomp", of which XLA keeps only part live at
    once), gathered weights and their full-size gradients or travelling weight blocks ("wpeak":
    `weights_transient`), blocks in flight ("buf": `buffers`), blockwise score tiles ("tile"),
    dense score transients and hoisted masks ("quadp").
    """
    desc = describe(shape, strategy, remat)
    geo = desc.extents
    e, h, k = shape.e_mem, shape.spec.d_model, shape.spec.head_dim
    st = dict.fromkeys(STORED_FEATURES, 0.0)
    pk = dict.fromkeys(PEAK_FEATURES, 0.0)
    Xin = geo.rows * geo.seq_in * h * e
    A = geo.att_tokens * geo.heads * k * e
    F = geo.mlp_elems * e
    quad = geo.score_rows * F32
    # gradients of the sub-layer inputs / outputs and attention-width arrays, as the sub-layer
    # sees them, and of the MLP hidden (g of them for gated MLPs) (in the compute dtype even on
    # XLA:CPU, whose bf16 residuals are f32: fits the measured peaks)
    r = shape.e / e
    pk["wpeak"] = desc.weights_transient
    pk["actX"] = 3 * (Xin + A) * r
    pk["actF"] = 3 * shape.g * F * r
    pk["buf"] = desc.buffers
    pk["tile"] = geo.tiles * F32
    pk["quadp"] = quad
    pk["recomp"] = 0.0
    saved = _saved_bytes(desc.saved, geo, shape)
    if remat == "none":
        st["act"] = saved
        st["quad"] = quad
        st["wsave"] = desc.weights_kept
        return st, pk
    act_none = _saved_bytes(describe(shape, strategy, "none").saved, geo, shape)
    st["saved"] = saved
    st["wsave"] = desc.weights_kept
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
    loss: dict = field(default_factory=dict)  # {"strategy:loss split": {loss feature: c}}

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
        return {"stored": self.stored, "peak": self.peak, "loss": self.loss}

    @classmethod
    def from_json(cls, data: Mapping) -> "MemoryCoefficients":
        return cls(stored=dict(data.get("stored", {})), peak=dict(data.get("peak", {})),
                   loss=dict(data.get("loss", {})))


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
    strat = get_strategy(strategy)
    return strat.rows(shape.layer) * strat.boundary_seq(shape.layer) * shape.spec.d_model * shape.e


def same_boundary(a: str, b: str) -> bool:
    """Whether two strategies lay out activations between layers alike (switching is free)."""
    return get_strategy(a).boundary == get_strategy(b).boundary


def switch_bytes(shape: Shape, a: str, b: str) -> float:
    """Transient bytes of moving activations (and their gradient in the backward) from a's boundary
    layout to b's: the destination buffer plus, for an all-to-all, the source copy."""
    if same_boundary(a, b):
        return 0.0
    return boundary_bytes(shape, a) + boundary_bytes(shape, b)


def base_memory(shape: Shape, vocab: int, n_layers: int, grad_accum: int = 1) -> float:
    """Bytes per device outside the layers that every plan pays: the embedding / head and final
    norm parameters with their gradients and optimizer moments (storage layout), the optimizer
    update's temporary of the whole state, and the batch arrays (inputs, targets, segment ids,
    positions, loss mask; worst case over the token layouts). With `grad_accum` > 1, `shape` is
    one micro-batch: the whole batch's arrays stay alive and a gradient tree holds the running
    sum of the micro-batches' gradients."""
    spec, N = shape.spec, shape.n_devices
    h, pb = spec.d_model, shape.param_bytes
    emb = embedding_elems(vocab, h, N) + h
    local_layer, _ = layer_param_elems(spec, N)
    states = emb * pb * (2 + shape.optimizer_slots)
    gradients = (emb + n_layers * local_layer) * pb  # one gradient tree of the whole model
    update = gradients  # the optimizer's `updates` tree before it is applied
    accumulator = gradients if grad_accum > 1 else 0.0
    rows = shape.batch * grad_accum
    batch_arrays = 5 * rows * shape.seq_len * 4 / max(1, min(shape.n_devices, shape.d * shape.p))
    return states + update + accumulator + batch_arrays


# float32 [chunk, vocabulary block] buffers alive at once in the chunked loss's backward (the
# recomputed logits and their gradient): XLA's temp bytes of the loss alone are 2.00-2.01 of
# them at 8K and 16K tokens, chunks 512 and 1,024, vocabularies 16K and 32K
# (tests/test_chunked_loss.py checks it)
LOSS_CHUNK_COPIES = 2.0
LOSS_FEATURES = ("logits", "tokens", "gathered", "head", "stats")


def loss_features(shape: Shape, strategy: str, vocab: int, chunk: int = 1024) -> tuple[str, dict]:
    """(the key of its multipliers, the loss transient's analytical terms in bytes per device)
    when `strategy` computes the
    embedding lookup and the loss (while every layer's stored activations are alive), as
    `sharding.ops.chunked_loss` computes it `chunk` tokens at a time (<= 0: all at once) with
    the vocabulary split the strategy's `loss_split` names:

      logits    float32 logits and their gradient of one chunk and one vocabulary block
      tokens    the final norm's input, output and gradient for this device's tokens
      gathered  the vocabulary-parallel loss's tokens gathered from the model group (kept for
                its backward)
      head      a ring's travelling head block (double buffered) with its gradient; a whole
                head's gathered table with its full-size gradient
      stats     a ring's per-token gradient and online statistics

    The key is `strategy:split` (`ring`, `vocab` or `whole`, as `loss_split` names it): a
    strategy's multipliers hold for the way it splits this vocabulary.
    """
    h, e, pb = shape.spec.d_model, shape.e_mem, shape.param_bytes
    strat, layer = get_strategy(strategy), shape.layer
    bl, s_loc = strat.rows(layer), strat.boundary_seq(layer)
    token_split = strat.boundary.split(BATCH, layer) * strat.boundary.split(SEQ, layer)
    kind, split = strat.loss_split(vocab, token_split, shape.n_devices, shape.p)
    own = bl * s_loc
    tokens = bl * shape.seq_len / strat.compute.split(SEQ, layer) if kind == "vocab" else own
    c = tokens if chunk <= 0 else min(chunk, tokens)
    out = dict.fromkeys(LOSS_FEATURES, 0.0)
    out["logits"] = c * vocab / split * F32 * LOSS_CHUNK_COPIES
    out["tokens"] = 3 * own * h * e
    if kind == "vocab":
        out["gathered"] = (tokens - own) * h * e
    elif kind == "ring":
        out["head"] = h * vocab / split * (2 * pb + F32)
        out["stats"] = tokens * (h + 4) * F32
    else:
        out["head"] = vocab * h * (pb + (e if e != pb else 0) + F32)
    return f"{strategy}:{kind}", out


def loss_memory(shape: Shape, strategy: str, vocab: int, chunk: int = 1024,
                coefficients: Optional["MemoryCoefficients"] = None) -> float:
    """Transient bytes per device of the embedding lookup and the loss when `strategy` computes
    them: `loss_features` with this strategy's multipliers (None: the shipped ones, fitted to
    XLA's loss programs by `python benchmarks/loss_memory.py --fit`; `ANALYTICAL`: all 1)."""
    if coefficients is None:
        coefficients = default_coefficients()
    key, features = loss_features(shape, strategy, vocab, chunk)
    c = coefficients.loss.get(key, {})
    return sum(c.get(name, 1.0) * v for name, v in features.items())


def megatron_activation_bytes(shape: Shape, strategy: str) -> float:
    """Megatron-LM's stored activation bytes of one layer per device (Korthikanti et al. 2022,
    34·sbh + 5·as²b at 2-byte activations) adapted to this model: no dropout, flash-style
    attention keeping its output and float32 log-sum-exp instead of the score matrices, the
    MLP's kind and width. Term by term (docs/strategies.md), in the compute dtype as XLA keeps it:

      the two norms' inputs and the two sub-layers' inputs    4 boundary-sized [rows, seq, h]
      q, k, v and the attention output                        2·n·k + 2·G·k per token
      the attention's log-sum-exp (float32)                   n per token
      the MLP's pre-activations and the activation output     (g + 1)·f per token

    The boundary-sized terms are as the strategy lays out activations between sub-layers (whole
    under `tp`, the shard under `tp_sp`, as in Megatron with and without sequence parallelism);
    the others are the layer's totals over the N devices that share its compute."""
    spec, strat, layer = shape.spec, get_strategy(strategy), shape.layer
    tokens = shape.batch * shape.seq_len / shape.n_devices
    boundary = 4 * strat.rows(layer) * strat.boundary_seq(layer) * spec.d_model
    width = 2 * spec.head_dim * (spec.n_heads + spec.kv_heads) + (shape.g + 1) * spec.d_ff
    return (boundary + tokens * width) * shape.e_mem + tokens * spec.n_heads * F32


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
    """Replace the shipped coefficients file (and the cached copy); the shipped loss multipliers
    are kept unless `coefficients` has its own."""
    data = coefficients.to_json()
    data["loss"] = coefficients.loss or default_coefficients().loss
    if meta:
        data["meta"] = meta
    with open(DEFAULT_COEFFICIENTS_PATH, "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
    _DEFAULT.clear()
    return DEFAULT_COEFFICIENTS_PATH
