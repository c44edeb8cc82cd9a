"""Device mesh from a mapping of named axes to sizes (one host or many)."""
from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh


class MeshError(ValueError):
    """The requested mesh shape does not fit the devices."""


def resolve_mesh_shape(axes: Mapping[str, int], n_devices: int) -> dict[str, int]:
    """Fill a single `-1` entry from the device count and check the product equals it."""
    sizes = dict(axes)
    unknown = [name for name, size in sizes.items() if size == -1]
    known = math.prod(size for size in sizes.values() if size != -1)
    if len(unknown) > 1:
        raise MeshError(f"parallel.mesh: at most one axis may be -1, got {list(unknown)}")
    if unknown:
        if n_devices % known:
            raise MeshError(f"parallel.mesh {dict(axes)}: fixed axes multiply to {known}, "
                            f"which does not divide the {n_devices} devices")
        sizes[unknown[0]] = n_devices // known
    total = math.prod(sizes.values())
    if total != n_devices:
        raise MeshError(f"parallel.mesh {dict(axes)} multiplies to {total} but there are {n_devices} "
                        f"devices: make the sizes multiply to {n_devices} or use -1 for one axis")
    return sizes


def build_mesh(axes: Mapping[str, int], devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
    """A mesh with Auto axis types (GSPMD-style sharding constraints work inside it).

    Devices are ordered by process then id, so a host's devices are contiguous along the last
    axes (fast links inside a host for the inner axes, as in MaxText's hybrid meshes).
    """
    devices = list(devices if devices is not None else jax.devices())
    devices.sort(key=lambda d: (d.process_index, d.id))
    sizes = resolve_mesh_shape(axes, len(devices))
    grid = np.array(devices, dtype=object).reshape(tuple(sizes.values()))
    return Mesh(grid, tuple(sizes.keys()), axis_types=(AxisType.Auto,) * len(sizes))


def describe_mesh(mesh: Mesh) -> str:
    """One line: axes, sizes and device kind."""
    axes = " x ".join(f"{name}={size}" for name, size in mesh.shape.items())
    kind = mesh.devices.flat[0].device_kind
    return f"mesh {axes} over {mesh.devices.size} {mesh.devices.flat[0].platform} devices ({kind})"


# Mesh axes that split the batch inside a strategy; every other axis (model, seq, ...) forms
# the model-parallel group that splits sequence, heads or MLP columns, except the pipeline's
# stage axis, which belongs to neither (`sharding.pipeline`).
BATCH_AXES = ("data", "replica", "fsdp")
STAGE_AXIS = "stage"


def with_stage_axis(axes: Mapping[str, int], stages: int, n_devices: int) -> dict[str, int]:
    """`axes` with the `stage` axis first (added with `stages` devices unless named): a stage's
    devices are contiguous, so a stage stays inside a host when it fits in one."""
    if STAGE_AXIS in axes:
        return {STAGE_AXIS: axes[STAGE_AXIS], **{a: n for a, n in axes.items() if a != STAGE_AXIS}}
    if stages == 1:
        return dict(axes)
    if n_devices % stages:
        raise MeshError(f"parallel.pipeline.stages ({stages}) does not divide the {n_devices} devices: "
                        f"choose a divisor of {n_devices}")
    try:
        rest = resolve_mesh_shape(axes, n_devices // stages)
    except MeshError:
        raise MeshError(f"parallel.mesh {dict(axes)} must cover the {n_devices // stages} devices of one stage "
                        f"(parallel.pipeline.stages={stages} of {n_devices} devices): use -1 for one axis") from None
    return {STAGE_AXIS: stages, **rest}


def mesh_roles(mesh: Mesh) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(batch axes, model-parallel axes), never the stage axis. A mesh of batch axes only puts
    all of them in the model group (one node of p devices, as in ParaDySe), leaving the batch
    unsplit."""
    names = tuple(a for a in mesh.axis_names if a != STAGE_AXIS)
    batch = tuple(a for a in names if a in BATCH_AXES)
    model = tuple(a for a in names if a not in BATCH_AXES)
    if not model:
        return (), batch
    return batch, model


def axes_size(mesh: Mesh, axes: Sequence[str]) -> int:
    """Number of devices along these mesh axes."""
    return math.prod(mesh.shape[a] for a in axes)
