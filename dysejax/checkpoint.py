"""Checkpoints with orbax: train state, data-iterator position and run metadata per step.

orbax writes each step into a temporary directory and renames it when complete, so a kill at
any point never leaves a half-written step as the latest one. Restores go into explicit target
shardings, so a checkpoint restores onto a different mesh shape.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from dysejax.errors import CheckpointError
from dysejax.glob_safe import glob_safe, real_paths

# Metadata fields that must match for a checkpoint to restore into the configured model.
COMPATIBLE_FIELDS = ("model",)


def _one_line(e: BaseException) -> str:
    text = real_paths(" ".join(str(e).split()))
    return (text[:200] + "...") if len(text) > 200 else text


def _differences(saved: dict, current: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: checkpoint {a!r}, config {b!r}")
    return out


def _state_handler() -> ocp.PyTreeCheckpointHandler:
    # Each shard is written by one replica (no replica-parallel slicing): orbax would otherwise
    # compile slicing programs during the first save, i.e. on the training path after warmup.
    registry = ocp.type_handlers.create_type_handler_registry(
        (jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False)))
    return ocp.PyTreeCheckpointHandler(type_handler_registry=registry)


class Checkpointer:
    """Save every `every` steps (and on demand), keep the last `keep`, restore the latest."""

    def __init__(self, directory: str, every: int, keep: int, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        self.every = every
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                               enable_async_checkpointing=async_save)
        self.manager = ocp.CheckpointManager(
            glob_safe(self.directory, create=True), options=options,
            item_handlers={"state": _state_handler(), "data": ocp.JsonCheckpointHandler(),
                           "meta": ocp.JsonCheckpointHandler()})

    def latest_step(self) -> Optional[int]:
        return self.manager.latest_step()

    def should_save(self, step: int) -> bool:
        return step % self.every == 0

    def save(self, step: int, state, data_state: dict, meta: dict) -> None:
        """Start saving `step` (asynchronously when enabled); a step already saved is skipped."""
        if step in self.manager.all_steps():
            return
        self.manager.save(step, force=True, args=ocp.args.Composite(
            state=ocp.args.PyTreeSave(state),
            data=ocp.args.JsonSave(data_state),
            meta=ocp.args.JsonSave(meta)))

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def _where(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def read_meta(self, step: int) -> dict:
        try:
            out = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
            return dict(out["meta"])
        except Exception as e:
            raise CheckpointError(f"checkpoint {self._where(step)} is unreadable ({_one_line(e)}): "
                                  "move it away or use another --workdir") from None

    def check_compatible(self, step: int, meta: dict) -> dict:
        """The saved metadata, after checking the model it holds matches `meta`."""
        saved = self.read_meta(step)
        diffs = []
        for name in COMPATIBLE_FIELDS:
            diffs += _differences(saved.get(name, {}), meta.get(name, {}), f"{name}.")
        if diffs:
            shown = "; ".join(diffs[:3]) + (f"; and {len(diffs) - 3} more" if len(diffs) > 3 else "")
            raise CheckpointError(f"checkpoint {self._where(step)} is from another model ({shown}): "
                                  "use another --workdir or restore the matching config")
        return saved

    def restore(self, step: int, abstract_state) -> tuple[Any, dict]:
        """(state placed as `abstract_state`'s shardings, data-iterator state) of `step`."""
        try:
            out = self.manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.PyTreeRestore(abstract_state, restore_args=ocp.checkpoint_utils.construct_restore_args(
                    abstract_state)), data=ocp.args.JsonRestore()))
        except Exception as e:
            raise CheckpointError(f"checkpoint {self._where(step)} is unreadable or does not fit the "
                                  f"model ({_one_line(e)}): move it away or use another --workdir") from None
        return out["state"], dict(out["data"])

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


# -- parameters alone (imported models; `train.init_from`) ------------------------------------
def save_params(path: str, params) -> None:
    """Write a parameter tree (numpy or jax arrays) as an orbax checkpoint at `path` (its folder
    name without glob syntax; the folders above it may have any)."""
    path = os.path.abspath(path)
    ckpt = ocp.StandardCheckpointer()
    ckpt.save(os.path.join(glob_safe(os.path.dirname(path), create=True), os.path.basename(path)), params)
    ckpt.wait_until_finished()


def read_numpy(path: str):
    """Every array of an orbax checkpoint at `path` as host numpy arrays (any saving mesh)."""
    # the item's own handler: a checkpoint's state folder has no step metadata of its own
    handler = ocp.PyTreeCheckpointHandler()
    try:
        where = epath.Path(glob_safe(path))
        args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), handler.metadata(where).tree)
        return handler.restore(where, args=ocp.args.PyTreeRestore(restore_args=args))
    except Exception as e:
        raise CheckpointError(f"{path} is not a readable orbax checkpoint ({_one_line(e)}): point at the folder "
                              "`python -m dysejax.hf import` wrote, or a checkpoint's state folder") from None
    finally:
        handler.close()


def restore_params(path: str, abstract_params):
    """Parameters saved by `save_params`, placed as `abstract_params`' shardings; a one-line
    CheckpointError when they do not fit the model."""
    want = jax.tree_util.tree_flatten_with_path(abstract_params)[0]
    try:
        meta = ocp.StandardCheckpointer().metadata(glob_safe(path))
        tree = meta.item_metadata.tree if hasattr(meta, "item_metadata") else meta
    except Exception as e:
        raise CheckpointError(f"train.init_from {path!r} is not a readable parameter checkpoint "
                              f"({_one_line(e)}): point it at what `python -m dysejax.hf import` wrote") from None
    have = {jax.tree_util.keystr(p): m for p, m in jax.tree_util.tree_flatten_with_path(tree)[0]}
    for p, a in want:
        m = have.get(jax.tree_util.keystr(p))
        if m is None or tuple(m.shape) != tuple(a.shape) or np.dtype(m.dtype) != np.dtype(a.dtype):
            got = "missing" if m is None else f"{tuple(m.shape)} {np.dtype(m.dtype).name}"
            raise CheckpointError(f"train.init_from {path!r}: parameter {jax.tree_util.keystr(p)} is {got}, the "
                                  f"model needs {tuple(a.shape)} {np.dtype(a.dtype).name}: use the config the "
                                  "import wrote, or another init_from")
    return ocp.StandardCheckpointer().restore(glob_safe(path), abstract_params)
