"""What a strategy is, as data: its compute rules and what one layer keeps and moves per call.

Compute rules map logical axes to mesh roles (MaxText's logical axis rules over our storage
layout): `batch` (the batch axes, size d), `model` (the model-parallel group, size p) or
`devices` (both: every axis but `stage`, N = d x p devices); an axis no rule names is whole on
every device. Every PartitionSpec a strategy uses is derived from its rules and the logical
axes of what it lays out (`sharding.layout`).

A `Description` is what one layer of the strategy holds and moves on one device for one
`LayerShape`: local extents, the arrays its backward saves, weights kept and transient,
buffers in flight, matmul and attention work, collectives by kind and mesh role, ring steps.
The cost model (`costmodel/`) prices descriptions; it knows no strategy by name.

Notation as in `costmodel.memory`: b batch rows, s sequence length, h d_model, n heads, k
head_dim, f d_ff, G K/V heads, g = 2 for gated MLPs, e bytes of a compute-dtype element
(e_mem as XLA keeps it), pb bytes of a stored parameter.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from jax.sharding import PartitionSpec as P

from sharding.mesh import STAGE_AXIS, mesh_roles
from sharding.ops.blocks import BlockSpec
from sharding.ops.flash import tile_sizes
from sharding.remat import NAMES as REMAT_NAMES, remat_policy

BATCH_ROLE, MODEL_ROLE, DEVICES_ROLE = "batch", "model", "devices"
ROLES = (BATCH_ROLE, MODEL_ROLE, DEVICES_ROLE)
F32 = 4


# ------------------------------------------------------------------------------------------
# Compute rules
# ------------------------------------------------------------------------------------------
def role_axes(mesh, role: str) -> tuple[str, ...]:
    """Mesh axes of a role (never the pipeline's stage axis)."""
    batch, model = mesh_roles(mesh)
    if role == BATCH_ROLE:
        return batch
    if role == MODEL_ROLE:
        return model
    if role == DEVICES_ROLE:
        return tuple(a for a in mesh.axis_names if a != STAGE_AXIS)
    raise ValueError(f"unknown mesh role {role!r} (known: {', '.join(ROLES)})")


def axes_entry(axes: Sequence[str]):
    """Mesh axes as one PartitionSpec entry (None when empty)."""
    axes = tuple(axes)
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else axes


@dataclass(frozen=True)
class Rules:
    """Logical axis -> mesh role; unnamed axes are whole on every device."""

    roles: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, **roles: str) -> "Rules":
        """Rules from keyword pairs, e.g. `Rules.of(batch="batch", seq="model")`."""
        for role in roles.values():
            if role not in ROLES:
                raise ValueError(f"unknown mesh role {role!r} (known: {', '.join(ROLES)})")
        return cls(tuple(roles.items()))

    def role(self, logical: str) -> Optional[str]:
        return dict(self.roles).get(logical)

    def spec(self, logical: Sequence[Optional[str]], mesh) -> P:
        """PartitionSpec of an array with these logical axes on `mesh`."""
        return P(*(axes_entry(role_axes(mesh, self.role(a))) if self.role(a) else None for a in logical))

    def split(self, logical: str, shape: "LayerShape") -> int:
        """Ways a logical axis is split on a mesh of this shape (1 when whole)."""
        role = self.role(logical)
        return shape.size(role) if role else 1

    def uses_model_group(self) -> bool:
        """Whether some axis is split over the model-parallel group (alone or with the batch axes)."""
        return any(role in (MODEL_ROLE, DEVICES_ROLE) for _, role in self.roles)


# ------------------------------------------------------------------------------------------
# The shape a description is a function of
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerShape:
    """One layer on one mesh for one bucket, as a strategy sees it: the layer spec, the model
    group p, the batch axes d, the global batch and length, element bytes (compute dtype `e`,
    as XLA keeps it `e_mem`, stored parameter `param_bytes`) and the backend."""

    spec: BlockSpec
    p: int
    d: int
    batch: int
    seq_len: int
    e: int = 4
    e_mem: int = 4
    param_bytes: int = 4
    backend: str = "gpu"

    @classmethod
    def of_mesh(cls, spec: BlockSpec, mesh, batch: int, seq_len: int) -> "LayerShape":
        """The shape on a jax mesh (or anything with `axis_names` and `shape`)."""
        batch_axes, model_axes = mesh_roles(mesh)
        size = lambda axes: math.prod(mesh.shape[a] for a in axes)  # noqa: E731
        return cls(spec, size(model_axes), size(batch_axes), batch, seq_len)

    @property
    def n_devices(self) -> int:
        return self.p * self.d

    def size(self, role: str) -> int:
        """Devices along a mesh role."""
        return {BATCH_ROLE: self.d, MODEL_ROLE: self.p, DEVICES_ROLE: self.n_devices}[role]

    @property
    def g(self) -> int:
        return 2 if self.spec.gated else 1

    @property
    def kv_group(self) -> int:
        """K/V heads as the model group holds them: replicated up to one per device when G < p."""
        return max(self.spec.kv_heads, self.p)

    @property
    def blockwise(self) -> bool:
        return self.spec.use_blockwise(self.seq_len)

    @property
    def converted(self) -> bool:
        """Weights are cast to the compute dtype (a separate buffer)."""
        return self.e != self.param_bytes

    @property
    def matrix_elems(self) -> int:
        """Elements of one layer's four weight matrices (without the norm scales)."""
        s = self.spec
        h, k, f = s.d_model, s.head_dim, s.d_ff
        return h * s.n_heads * k + h * 2 * s.kv_heads * k + s.n_heads * k * h + h * self.g * f + f * h

    @property
    def qkv_elems(self) -> int:
        """Elements of the q, k, v projection weights."""
        s = self.spec
        return (s.n_heads + 2 * s.kv_heads) * s.d_model * s.head_dim

    @property
    def matmul_flops_per_token(self) -> int:
        """Forward FLOPs of the projections and the MLP per token."""
        s = self.spec
        return 2 * (self.qkv_elems + s.n_heads * s.head_dim * s.d_model + self.g * s.d_model * s.d_ff
                    + s.d_ff * s.d_model)

    def tiles(self, s_q: int, s_kv: int, batch_heads: float = 1) -> int:
        """Score tiles the flash kernel visits over s_q queries and s_kv keys of `batch_heads`
        rows x heads (`sharding.ops.flash`: cache-sized tiles of at most attention_block; a
        square block is causal, so its lower triangle)."""
        bq, bk = tile_sizes(self.spec.attention_block, self.spec.attention_block, s_q, s_kv, int(batch_heads))
        nq, nk = math.ceil(s_q / bq), math.ceil(s_kv / bk)
        return nq * (nq + 1) // 2 if (s_q, bq) == (s_kv, bk) else nq * nk


# ------------------------------------------------------------------------------------------
# What one layer keeps and moves
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Extents:
    """What one device holds of one layer (elements, not bytes)."""

    rows: float  # batch rows
    seq: float  # sequence positions of the boundary activation
    seq_in: float  # sequence positions of a sub-layer's input as the sub-layer sees it
    att_tokens: float  # rows x positions of the attention-width activations (q, k, v, o)
    heads: float  # heads those activations carry
    kv_heads: float  # K/V heads of the k and v activations (grouped-query attention)
    mlp_elems: float  # elements of one MLP hidden activation that autodiff keeps [tokens, d_ff share]
    dense: bool  # attention materialises the score matrix
    score_rows: float  # batch x heads x queries x keys of the dense scores (0 if blockwise)
    tiles: float  # elements of one (bq x bk) score tile x heads x rows (blockwise kernels)


@dataclass(frozen=True)
class Saved:
    """Arrays the backward keeps, counted in units of one layer's arrays: `boundary_f32` /
    `boundary` [rows, seq, h] in float32 / the compute dtype, `inputs` [rows, seq_in, h], `att`
    [att_tokens, heads, k] (q, o), `kv` [att_tokens, kv_heads, k] (k, v), `lse` [att_tokens,
    heads] float32, `mlp` [mlp_elems]."""

    boundary_f32: float = 0.0
    boundary: float = 0.0
    inputs: float = 0.0
    att: float = 0.0
    kv: float = 0.0
    lse: float = 0.0
    mlp: float = 0.0


@dataclass(frozen=True)
class Collective:
    """`count` collectives of one kind over a mesh role, each handling `size` bytes (the gathered
    array for all-gather / reduce-scatter / all-reduce, the local array for all-to-all).
    `prefetch`: a weight gather or a weight gradient's reduce-scatter, which does not wait for
    the layer's activations, so a scheduler can run it during a neighbouring layer's compute."""

    kind: str  # all-gather | reduce-scatter | all-reduce | all-to-all
    role: str  # batch | model | devices
    size: float
    count: float = 1.0
    prefetch: bool = False


@dataclass(frozen=True)
class RingStep:
    """`hops` steps of a ring over the model group, in each of which `size` bytes travel by
    `kind` (a ppermute hop, or an all-reduce over the group) while the device computes
    `matmul_flops` plus the given fractions of the layer's forward attention FLOPs and score
    elements (part of the totals, not extra)."""

    hops: float
    size: float
    kind: str = "collective-permute"
    matmul_flops: float = 0.0
    attention: float = 0.0
    scores: float = 0.0


@dataclass(frozen=True)
class AttentionWork:
    """Attention's score and PV matmuls on one device: `rows` x `heads` queries of length s_q
    against `blocks` key blocks of s_kv each (causal: the slowest device computes blocks - 1 full
    blocks and the diagonal one); `tiled`: tiles above the diagonal are skipped; `flash`: the
    backward has 5 matmuls (a flash kernel) rather than 4 (dense)."""

    rows: float
    heads: float
    s_q: float
    s_kv: float
    blocks: int = 1
    tiled: bool = False
    flash: bool = False


@dataclass(frozen=True)
class Description:
    """One layer of a strategy under one remat policy, per device (bytes and FLOPs)."""

    extents: Extents
    saved: Saved  # what the backward keeps under this remat policy
    weights_kept: float  # weight bytes kept per layer until the backward
    weights_transient: float  # weight bytes on top while the layer runs (gathered copies, grads, blocks)
    buffers: float  # ring / METP blocks in flight
    matmul_flops: float  # projections + MLP, forward + backward (+ recompute)
    attention: AttentionWork
    iterations: float  # tile-loop and ring-step iterations per pass over the layer
    collectives: tuple[Collective, ...] = ()
    ring_steps: tuple[RingStep, ...] = ()


# ------------------------------------------------------------------------------------------
# Shared pieces of descriptions
# ------------------------------------------------------------------------------------------
REMATS = REMAT_NAMES


def recomputes(remat: str) -> int:
    """Extra forward passes of the matmuls under this remat policy."""
    return remat_policy(remat).matmul_recompute


def recomputes_attention(remat: str) -> int:
    """Extra forward passes of attention under this remat policy."""
    return remat_policy(remat).attention_recompute


def keeps_gathered(remat: str) -> bool:
    """Whether arrays gathered in the forward are kept for the backward (else gathered again)."""
    return remat_policy(remat).keeps_gathered


def residuals(ext: Extents, att: float = 2, kv: float = 2, mlp: float = 6) -> Saved:
    """What autodiff keeps of a layer without remat: 4 boundary-sized f32 arrays (x and the
    residual sum, upcast, with their norm statistics), the 2 sub-layer inputs as the sub-layers
    see them, `att` q-sized and `kv` k-sized attention arrays (dense attention: one more, and
    the probabilities, counted apart), the log-sum-exp (blockwise) and `mlp` MLP hidden arrays."""
    return Saved(boundary_f32=4, inputs=2, att=att + (1 if ext.dense else 0), kv=kv,
                 lse=0 if ext.dense else 1, mlp=mlp)


def selective(ext: Extents, g: float, att: float = 2, kv: float = 2) -> Saved:
    """What `selective` keeps (`sharding.remat`): the layer input and the residual sum after
    attention, `att` q-sized (q, o) and `kv` k-sized attention arrays with the log-sum-exp
    (dense attention keeps no o or log-sum-exp: it runs again), the `g` MLP pre-activations."""
    return Saved(boundary=2, att=att - (1 if ext.dense else 0), kv=kv, lse=0 if ext.dense else 1, mlp=g)


def saved_under(remat: str, none: Saved, dots: Saved, kept_by_selective: Saved) -> Saved:
    """The backward's residuals under a remat policy: all of them, the marked ones
    (`selective`), the matmul outputs without batch dimensions (`dots`), or the layer input
    only (`full`)."""
    remat_policy(remat)
    return {"none": none, "selective": kept_by_selective, "dots": dots, "full": Saved(boundary=1)}[remat]


def dense_or_tiles(shape: LayerShape, rows: float, heads: float, s: float) -> tuple[bool, float, float]:
    """(dense, score elements, tile elements) of a local attention over s queries and keys."""
    if shape.blockwise:
        return False, 0.0, rows * heads * tile_elements(shape.spec, s, s, rows * heads)
    return True, rows * heads * s * s, 0.0


def tile_elements(spec: BlockSpec, s_q: float, s_kv: float, batch_heads: float) -> float:
    """Elements of one score tile of the flash kernel per row and head (`flash.tile_sizes`)."""
    bq, bk = tile_sizes(spec.attention_block, spec.attention_block, int(s_q), int(s_kv), max(1, int(batch_heads)))
    return float(bq * bk)


def gathered_weights(shape: LayerShape, remat: str) -> tuple[float, float]:
    """(kept, transient) bytes of weights gathered whole per layer (ZeRO-3): the compute-dtype
    copy kept for the backward (none under remat); the gathered copy (+ its cast) and its
    full-size float32 gradient while the layer runs."""
    big, pb, e = shape.matrix_elems, shape.param_bytes, shape.e_mem
    cast = e if shape.converted else 0
    kept = big * (e if shape.converted else pb) if keeps_gathered(remat) else 0.0
    return kept, big * (pb + cast) + big * F32


def gather_per_layer(shape: LayerShape, remat: str, role: str = DEVICES_ROLE, share: int = 1) -> tuple[Collective, ...]:
    """The weight gathers (again in the backward under remat) and gradient reduce-scatter of a
    strategy that gathers `1/share` of each layer's weights over `role` per layer."""
    big = shape.matrix_elems / share if share > 1 else shape.matrix_elems
    return (Collective("all-gather", role, big * shape.param_bytes, 1 + (0 if keeps_gathered(remat) else 1), True),
            Collective("reduce-scatter", role, big * F32, prefetch=True))


def model_block_weights(shape: LayerShape, remat: str) -> tuple[float, float]:
    """(kept, transient) bytes of a strategy computing with its 1/p block of every weight: a
    compute-dtype copy of the block kept when it was cast or gathered over the batch axes; the
    block gathered over the batch axes and its gradient (or only its cast) while it runs."""
    blk = shape.matrix_elems / shape.p
    kept = blk * shape.e_mem if keeps_gathered(remat) and (shape.converted or shape.d > 1) else 0.0
    if shape.d > 1:
        return kept, blk * (shape.param_bytes + F32)
    return kept, blk * (shape.e_mem if shape.converted else 0)


def standard_dots(shape: LayerShape) -> Saved:
    """What `dots` keeps of a layer computed on whole sub-layer inputs: the layer input and the
    attention output sum, q / k / v, and the MLP pre-activations."""
    return Saved(boundary=2, att=3, mlp=shape.g)


def projection_flops(shape: LayerShape, tokens: float, remat: str, split: int = 1) -> float:
    """Matmul FLOPs (forward, backward and recompute) of the projections and the MLP over
    `tokens` tokens, split `split` ways."""
    return shape.matmul_flops_per_token * tokens / split * (3 + recomputes(remat))
