"""What a run shows and keeps: no recompiles for a longer run, log lines, summary, plot, MFU."""
import json
import os

import numpy as np
import pytest

import dysejax
import train
from tests.conftest import FAST, TINY


def _warm_backend_compiles(tiny_config, workdir, cache, *extra):
    """XLA compilations (not served by the persistent cache) of a fresh trainer's warmup."""
    trainer = dysejax.Trainer(tiny_config(f"train.compile_cache_dir={cache}", "data.eval_batches=0",
                                          "data.buckets=[64]", *extra),
                              workdir=str(workdir), verbose=False)
    before = trainer.compiles.xla_compiled
    trainer.warmup()
    return trainer.compiles.xla_compiled - before, trainer


def test_a_longer_run_compiles_nothing_new(tiny_config, tmp_path):
    cache = tmp_path / "cache"
    first, _ = _warm_backend_compiles(tiny_config, tmp_path / "a", cache, "train.steps=3")
    assert first > 0
    for extra in ("train.steps=80", "optimizer.total_steps=7"):  # the schedule's horizon is an input
        again, trainer = _warm_backend_compiles(tiny_config, tmp_path / extra, cache, extra)
        assert again == 0, f"{extra}: {again} programs compiled again"
    # the counter does see a change that is compiled in (the peak lr is a constant of the step)
    changed, _ = _warm_backend_compiles(tiny_config, tmp_path / "lr", cache, "optimizer.lr=1e-4")
    assert changed > 0
