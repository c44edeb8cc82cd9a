"""Train state (step, params, optimizer state) in the unified storage layout.

The state is a plain dict pytree. Its shardings come from the parameters' logical axes through
`sharding.layout.StorageLayout`; optimizer moments take the sharding of the parameter they
mirror, scalars are replicated. It is initialised directly in that layout (no device ever
holds the full parameters).
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from dysejax.compiled_memo import compile_once
from dysejax.config import ModelConfig
from dysejax.model.transformer import abstract_params, init_params
from dysejax.optim import Optimizer
from sharding.layout import StorageLayout


def _is_box(x) -> bool:
    return isinstance(x, nn.Partitioned)


def logical_axes(boxed_params):
    """Tree of logical-axis tuples matching the (unboxed) parameter tree."""
    return jax.tree.map(lambda b: tuple(b.names), boxed_params, is_leaf=_is_box)


def _mirror_shardings(tree, param_shardings, params, fallback: NamedSharding):
    """Shardings for a tree whose sub-trees mirror the params (optimizer moments)."""
    by_path = {path: (s, p.shape) for (path, s), p in zip(
        jax.tree_util.tree_flatten_with_path(param_shardings)[0], jax.tree.leaves(params))}

    def pick(path, leaf):
        for n in range(len(path), 0, -1):
            hit = by_path.get(tuple(path[-n:]))
            if hit is not None and hit[1] == leaf.shape:
                return hit[0]
        return fallback
    return jax.tree_util.tree_map_with_path(pick, tree)


class StateLayout:
    """Abstract train state and its shardings for one model, optimizer and storage layout."""

    def __init__(self, model_cfg: ModelConfig, optimizer: Optimizer, layout: StorageLayout):
        self.model_cfg, self.optimizer, self.layout = model_cfg, optimizer, layout
        self._compiled_init = None
        boxed = abstract_params(model_cfg)
        self.logical = logical_axes(boxed)
        params = nn.unbox(boxed)
        param_shardings = jax.tree.map(lambda names, p: layout.sharding(names, p.shape),
                                       self.logical, params, is_leaf=lambda x: isinstance(x, tuple))
        opt_state = jax.eval_shape(optimizer.init, params)
        replicated = layout.replicated()
        self.shardings = {
            "step": replicated,
            "params": param_shardings,
            "opt_state": _mirror_shardings(opt_state, param_shardings, params, replicated),
        }
        shapes = {"step": jax.ShapeDtypeStruct((), jnp.int32), "params": params, "opt_state": opt_state}
        self.abstract = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, self.shardings)

    def compiled_init(self):
        """The state initialiser, compiled ahead of time (seed -> state in the storage layout)."""
        if self._compiled_init is None:
            def build(seed):
                params = nn.unbox(init_params(self.model_cfg, jax.random.key(seed)))
                return {"step": jnp.zeros((), jnp.int32), "params": params,
                        "opt_state": self.optimizer.init(params)}
            lowered = jax.jit(build, out_shardings=self.shardings).lower(jax.ShapeDtypeStruct((), jnp.uint32))
            self._compiled_init, _ = compile_once(lowered, [d.id for d in self.layout.mesh.devices.flat])
        return self._compiled_init

    def from_params(self, params):
        """A step-0 state around given parameters (in the storage layout), optimizer state fresh."""
        def build(params):
            return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": self.optimizer.init(params)}
        return jax.jit(build, out_shardings=self.shardings)(params)

    def bytes_per_device(self) -> int:
        """Bytes one device holds of the parameters, their gradients and the optimizer state
        (exact: each leaf's shard under its sharding)."""
        def shard_bytes(tree):
            return sum(math.prod(a.sharding.shard_shape(a.shape)) * a.dtype.itemsize for a in jax.tree.leaves(tree))
        return 2 * shard_bytes(self.abstract["params"]) + shard_bytes(self.abstract["opt_state"])

    def init(self, seed: int):
        """A fresh state, created directly in the storage layout."""
        return self.compiled_init()(np.uint32(seed))
