"""Program cache: warmup, zero compiles after warmup, plan switching, memory guard, compile API."""
import os
import re
import subprocess
import sys

import jax
import pytest

import dysejax
from dysejax.compile_watch import LOWER_EVENT
from dysejax.runtime import without_device_count
from tests.conftest import FAST, ROOT, TINY

THREE_BUCKETS = ["data.buckets=[32,64,128]", "parallel.plan={32: dp, 64: tp, 128: tp_sp}",
                 "data.tokens_per_batch=512"]


class _Lowerings:
    """An independent count of lowerings through jax.monitoring."""

    def __init__(self):
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self)

    def __call__(self, event, duration, **kwargs):
        if event == LOWER_EVENT:
            self.count += 1

    def close(self):
        jax.monitoring.unregister_event_duration_listener(self)


def test_no_compiles_after_warmup_across_buckets_and_plans(tiny_config, tmp_path):
    trainer = dysejax.Trainer(tiny_config(*THREE_BUCKETS, "train.checkpoint_every=4", "train.eval_every=5"),
                              workdir=str(tmp_path))
    report = trainer.warmup()
    assert {(r["seq_len"], r["plan"]) for r in report if r["kind"] == "train"} == {
        (32, "dp"), (64, "tp"), (128, "tp_sp")}
    listener = _Lowerings()
    try:
        rows = trainer.fit(steps=10)
    finally:
        listener.close()
    assert listener.count == 0
    assert all(r["compiles_after_warmup"] == 0 for r in rows)
    assert len({r["plan"] for r in rows}) >= 2 and len({r["bucket"] for r in rows}) >= 2, \
        sorted({(r["bucket"], r["plan"]) for r in rows})
    # hot switching moves no parameters: the state keeps the storage layout whatever ran
    for leaf, want in zip(jax.tree.leaves(trainer.state), jax.tree.leaves(trainer.state_layout.shardings)):
        assert leaf.sharding == want


def test_compile_returns_the_warmed_program(tiny_config, tmp_path):
    trainer = dysejax.Trainer(tiny_config(*THREE_BUCKETS), workdir=str(tmp_path))
    report = {(r["kind"], r["seq_len"]): r for r in trainer.warmup()}
    compiled = trainer.compile(64)
    assert isinstance(compiled, jax.stages.Compiled)
    mem = compiled.memory_analysis()
    need = (mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
            - mem.alias_size_in_bytes)
    assert need == report[("train", 64)]["bytes_per_device"]
    assert compiled is trainer.programs.selected_program("train", 64, trainer.data.batch_size(64)).compiled
    hlo = trainer.compile(128, plan="tp_sp").as_text()
    assert "all-gather" in hlo and "reduce-scatter" in hlo  # Megatron SP collectives
    other = trainer.compile(64, plan="fsdp")
    assert other is not compiled and other.cost_analysis()["flops"] > 0
    with pytest.raises(dysejax.ConfigError, match=r"100 is not a bucket length \(buckets: 32, 64, 128\)"):
        trainer.compile(100)


def test_memory_guard_refuses_over_budget_programs(tiny_config, tmp_path):
    trainer = dysejax.Trainer(tiny_config("parallel.memory_budget_gb=0.001"), workdir=str(tmp_path))
    with pytest.raises(dysejax.PlanError) as e:
        trainer.fit(steps=2)
    message = str(e.value)
    assert message.startswith("bucket 64 (batch 16, train): no plan fits the memory budget of 0.001 GiB per device (dp needs ")
    assert "raise parallel.memory_budget_gb" in message
    assert any(not r["fits"] for r in trainer.warmup_report)
    assert not os.path.exists(tmp_path / "metrics.jsonl")


def test_a_plan_that_cannot_split_an_accumulation_micro_batch_is_refused(tiny_config, tmp_path):
    # bucket 128: 1,024 tokens = 8 rows, two micro-batches of 4, which dp cannot split over 8 devices
    with pytest.raises(dysejax.PlanError, match=r"^bucket 128 \(batch 8, micro-batches of 4 rows with "
                       r"train.grad_accum=2\): strategy 'dp' needs batch size \(4\) divisible by the device "
                       r"count \(8\); raise data.tokens_per_batch or lower train.grad_accum$"):
        dysejax.Trainer(tiny_config("train.grad_accum=2", "parallel.plan=dp"), workdir=str(tmp_path / "w"))
    assert not os.path.exists(tmp_path / "w" / "metrics.jsonl")


def test_plan_mapping_errors(tiny_config, tmp_path):
    with pytest.raises(dysejax.ConfigError, match=r"parallel.plan: 100 is not a bucket length \(buckets: 64, 128; or use the key 'default'\)"):
        dysejax.Trainer(tiny_config("parallel.plan={100: dp}"), workdir=str(tmp_path))
    with pytest.raises(dysejax.ConfigError, match="parallel.plan: no plan for bucket 128: add `128: <plan>` or a `default` entry"):
        dysejax.Trainer(tiny_config("parallel.plan={64: dp}"), workdir=str(tmp_path))
    t = dysejax.Trainer(tiny_config("parallel.plan={64: tp, default: fsdp}"), workdir=str(tmp_path))
    assert [p.id for p in t.planner.candidates(128)] == ["fsdp"]


def _warmup_only(tmp_path, name, cache, *overrides, devices=1):
    """`train.py --warmup-only` in a fresh process with `devices` simulated CPU devices."""
    env = dict(os.environ, XLA_FLAGS=without_device_count(os.environ.get("XLA_FLAGS", "")))
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--config", TINY, "--workdir", str(tmp_path / name),
           "--warmup-only", "--set", *FAST, f"parallel.cpu_devices={devices}", f"train.compile_cache_dir={cache}",
           *overrides]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _compiled_and_loaded(stdout, cache):
    """(XLA compilations, programs loaded from the compile cache) a --warmup-only run reports."""
    found = re.search(rf"XLA compiled (\d+), (\d+) from the compile cache \({re.escape(str(cache))}\)", stdout)
    assert found, stdout
    return int(found.group(1)), int(found.group(2))


def test_warmup_only_cli_fills_the_persistent_cache_and_a_longer_run_compiles_nothing_new(tmp_path):
    cache = tmp_path / "cache"
    out = _warmup_only(tmp_path, "w", cache, "train.steps=3")
    assert out.returncode == 0, out.stderr
    # train and eval programs of buckets 64 and 128 (one fixed eval batch per bucket)
    assert "warmup train bucket     64" in out.stdout and "warmup: 4 programs" in out.stdout
    compiled, loaded = _compiled_and_loaded(out.stdout, cache)
    assert compiled >= 4 and loaded == 0
    assert len(os.listdir(cache)) >= 3
    assert not os.path.exists(tmp_path / "w" / "metrics.jsonl")
    # the lr schedule's horizon is an input of the step: a longer run loads every program
    again = _warmup_only(tmp_path, "longer", cache, "train.steps=80", "optimizer.total_steps=7")
    compiled, loaded = _compiled_and_loaded(again.stdout, cache)
    assert compiled == 0 and loaded >= 4, again.stdout + again.stderr
    # a change that is compiled in (the peak lr is a constant of the step) is compiled again
    changed = _warmup_only(tmp_path, "lr", cache, "optimizer.lr=1e-4")
    assert _compiled_and_loaded(changed.stdout, cache)[0] >= 2, changed.stdout + changed.stderr


def test_the_persistent_cache_stays_off_on_several_cpu_devices(tmp_path):
    # XLA:CPU's cached multi-device programs can deadlock (dysejax.runtime.persistent_cache_refusal)
    out = _warmup_only(tmp_path, "w", tmp_path / "cache", "data.buckets=[64]", devices=8)
    assert out.returncode == 0, out.stderr
    assert _compiled_and_loaded(out.stdout, "off")[1] == 0
    assert ("from the compile cache (off): XLA:CPU with 8 devices: its cached programs lose "
            "the order of the collectives inside loops and can deadlock") in out.stdout
    assert not os.path.exists(tmp_path / "cache")
    over = _warmup_only(tmp_path, "w", tmp_path / "cache", "data.buckets=[64]", "parallel.memory_budget_gb=0.001",
                        devices=8)
    assert over.returncode == 2 and over.stderr.strip().splitlines()[-1].startswith(
        "error: bucket 64 (batch 16, train): no plan fits the memory budget")
