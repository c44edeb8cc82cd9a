"""Checkpoints: restore onto another mesh (and from a folder whose path has glob syntax)."""
import os

import jax
import numpy as np
import pytest

from dysejax.checkpoint import Checkpointer
from dysejax.config import load_config
from dysejax.optim import build_optimizer
from dysejax.state import StateLayout
from sharding.layout import StorageLayout
from sharding.mesh import build_mesh
from tests.conftest import FAST, TINY


# the second folder's name has glob syntax, which orbax would otherwise read as a pattern
@pytest.mark.parametrize("folder, target_mesh, devices", [("ck", {"data": 4}, 4),
                                                          ("runs [x]*?/ck", {"data": 2, "model": 4}, 8)])
def test_restore_onto_another_mesh_is_exact(tmp_path, folder, target_mesh, devices):
    config = load_config(TINY, FAST)
    optimizer = build_optimizer(config.optimizer, config.train.steps)
    source = StateLayout(config.model, optimizer, StorageLayout(build_mesh({"data": 8})))
    state = source.init(seed=3)
    ckpt = Checkpointer(str(tmp_path / folder), every=1, keep=2)
    ckpt.save(1, state, {"epoch": 0, "index": 1}, {"model": {}})
    ckpt.wait()

    mesh = build_mesh(target_mesh, jax.devices()[:devices])
    target = StateLayout(config.model, optimizer, StorageLayout(mesh))
    restored, data_state = ckpt.restore(1, target.abstract)
    ckpt.close()
    assert os.listdir(tmp_path / folder) == ["1"]
    assert data_state == {"epoch": 0, "index": 1}
    for a, b, want in zip(jax.tree.leaves(state), jax.tree.leaves(restored), jax.tree.leaves(target.shardings)):
        assert b.sharding == want
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the layout really changed: a 4-way split instead of an 8-way one
    wq = restored["params"]["layers_wq"]
    assert len(wq.sharding.device_set) == devices


# Incompatible (another d_model, another param dtype) and corrupt checkpoints refused in one line and
# kept byte for byte: tests/test_bad_inputs.py (ckpt_shape, ckpt_dtype, ckpt_corrupt).
