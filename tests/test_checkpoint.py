"""Checkpoints: restore onto another mesh, corrupt and incompatible checkpoints."""
import hashlib
import os

import jax
import numpy as np
import pytest

import dysejax
from dysejax.checkpoint import Checkpointer
from dysejax.config import load_config
from dysejax.optim import build_optimizer
from dysejax.state import StateLayout
from sharding.layout import StorageLayout
from sharding.mesh import build_mesh
from tests.conftest import FAST, TINY


def _tree_hash(path):
    h = hashlib.sha256()
    for root, dirs, files in sorted(os.walk(path)):
        dirs.sort()
        for name in sorted(files):
            p = os.path.join(root, name)
            h.update(p.encode())
            with open(p, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


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


def _train(tmp_path, *extra, steps=2):
    config = dysejax.load_config(TINY, FAST + ["train.checkpoint_every=2"] + list(extra))
    return dysejax.Trainer(config, workdir=str(tmp_path)).fit(steps=steps)


def test_incompatible_checkpoint_is_refused_and_kept(tmp_path):
    _train(tmp_path)
    before = _tree_hash(tmp_path / "checkpoints")
    with pytest.raises(dysejax.CheckpointError) as e:
        _train(tmp_path, "model.d_model=96", steps=4)
    assert "is from another model (model.d_model: checkpoint 64, config 96" in str(e.value)
    assert "use another --workdir" in str(e.value)
    with pytest.raises(dysejax.CheckpointError, match="model.param_dtype: checkpoint 'float32', config 'bfloat16'"):
        _train(tmp_path, "model.param_dtype=bfloat16", steps=4)
    assert _tree_hash(tmp_path / "checkpoints") == before


def test_corrupt_checkpoint_is_refused_and_kept(tmp_path):
    _train(tmp_path)
    state_dir = tmp_path / "checkpoints" / "2" / "state"
    for root, _, files in os.walk(state_dir):
        for name in files:
            if name not in ("commit_success.txt",):
                with open(os.path.join(root, name), "r+b") as f:
                    f.truncate(max(0, os.path.getsize(os.path.join(root, name)) // 3))
    before = _tree_hash(tmp_path / "checkpoints")
    with pytest.raises(dysejax.CheckpointError) as e:
        _train(tmp_path, steps=4)
    assert str(e.value).startswith(f"checkpoint {tmp_path / 'checkpoints' / '2'} is unreadable")
    assert "move it away or use another --workdir" in str(e.value)
    assert _tree_hash(tmp_path / "checkpoints") == before
