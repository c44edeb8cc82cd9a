"""Trainer through the notebook API: rows, loss, plans, accumulation, resume."""
import numpy as np

import dysejax
from dysejax.metrics import read_metrics

import pytest

ROW_KEYS = {"step", "loss", "tokens", "bucket", "plan", "step_time_s", "loss_tokens", "batch_size",
            "lr", "grad_norm", "bytes_per_device", "tokens_per_s"}


# Trainers whose programs differ from the plain tiny config's skip the eval programs they do
# not test; references keep the plain config, whose programs an earlier test in this worker
# process has usually compiled already (dysejax/compiled_memo.py reuses them).
NO_EVAL = "data.eval_batches=0"


def _losses(rows):
    return np.array([r["loss"] for r in rows])


def test_fit_writes_complete_rows_and_loss_falls(tiny_config, tmp_path):
    config = tiny_config("train.eval_every=6", "optimizer.warmup_steps=2")
    rows = dysejax.Trainer(config, workdir=str(tmp_path)).fit(steps=12)
    assert [r["step"] for r in rows] == list(range(1, 13))
    for r in rows:
        assert ROW_KEYS <= set(r), ROW_KEYS - set(r)
        assert r["plan"] == "dp" and r["bucket"] in (64, 128) and 0 < r["tokens"] <= r["batch_size"] * r["bucket"]
    assert "eval_loss" in rows[5] and "eval_loss" in rows[11] and "eval_loss" not in rows[0]
    assert rows[11]["eval_loss"] < rows[5]["eval_loss"]
    losses = _losses(rows)
    assert losses[-3:].mean() < losses[:2].mean() - 0.5, losses
    assert read_metrics(str(tmp_path)) == rows


def test_fsdp_equals_dp(tiny_config, tmp_path):
    dp = dysejax.Trainer(tiny_config(), workdir=str(tmp_path / "dp")).fit(steps=3)
    fsdp = dysejax.Trainer(tiny_config("parallel.plan=fsdp", NO_EVAL), workdir=str(tmp_path / "fsdp")).fit(steps=3)
    assert [r["plan"] for r in fsdp] == ["fsdp"] * 3
    np.testing.assert_allclose(_losses(fsdp), _losses(dp), rtol=1e-5)


def test_grad_accumulation_matches_one_big_batch(tiny_config, tmp_path):
    # Same batches (batch multiple 16 either way), split in two micro-batches or not.
    one = dysejax.Trainer(tiny_config("data.tokens_per_batch=2048", "train.grad_accum=1", NO_EVAL),
                          workdir=str(tmp_path / "a"))
    two = dysejax.Trainer(tiny_config("data.tokens_per_batch=2048", "train.grad_accum=2", NO_EVAL),
                          workdir=str(tmp_path / "b"))
    assert one.data.batch_sizes == two.data.batch_sizes
    np.testing.assert_allclose(_losses(two.fit(steps=3)), _losses(one.fit(steps=3)), rtol=1e-5)


def test_written_plan_and_remat_match_dp(tiny_config, tmp_path):
    mixed = tiny_config("parallel.plan=[[dp, 1], [fsdp, 1, full]]", "model.scan_layers=false", NO_EVAL)
    rows = dysejax.Trainer(mixed, workdir=str(tmp_path / "m")).fit(steps=2)
    assert rows[0]["plan"] == "dp:1,fsdp:1@full"
    ref = dysejax.Trainer(tiny_config(), workdir=str(tmp_path / "r")).fit(steps=2)
    np.testing.assert_allclose(_losses(rows), _losses(ref), rtol=1e-5)


def test_bf16_compute_trains(tiny_config, tmp_path):
    rows = dysejax.Trainer(tiny_config("model.compute_dtype=bfloat16", NO_EVAL), workdir=str(tmp_path)).fit(steps=4)
    assert all(np.isfinite(_losses(rows)))
    ref = dysejax.Trainer(tiny_config(), workdir=str(tmp_path / "f32")).fit(steps=1)
    assert abs(rows[0]["loss"] - ref[0]["loss"]) < 0.05


def test_resume_continues_exactly(tiny_config, tmp_path):
    config = tiny_config("train.checkpoint_every=3")
    full = dysejax.Trainer(config, workdir=str(tmp_path / "full")).fit(steps=6)
    part = tmp_path / "part"
    first = dysejax.Trainer(config, workdir=str(part)).fit(steps=3)
    rest = dysejax.Trainer(config, workdir=str(part)).fit(steps=6)
    assert [r["step"] for r in rest] == [4, 5, 6]
    assert _losses(first + rest).tolist() == _losses(full).tolist()
    assert [r["step"] for r in read_metrics(str(part))] == list(range(1, 7))
    assert dysejax.Trainer(config, workdir=str(part)).fit(steps=6) == []  # already there


def test_resume_after_a_lost_tail_truncates_metrics(tiny_config, tmp_path):
    # A run that got past its last checkpoint (as after kill -9) resumes from that checkpoint
    # and rewrites the rows after it.
    config = tiny_config("train.checkpoint_every=2", "train.keep_checkpoints=5")
    rows = dysejax.Trainer(config, workdir=str(tmp_path)).fit(steps=5)
    import shutil
    for step in (4, 5):
        shutil.rmtree(tmp_path / "checkpoints" / str(step))
    again = dysejax.Trainer(config, workdir=str(tmp_path)).fit(steps=5)
    assert [r["step"] for r in again] == [3, 4, 5]
    assert [r["loss"] for r in read_metrics(str(tmp_path))] == _losses(rows).tolist()


def test_nonfinite_loss_stops_or_skips(tiny_config, tmp_path):
    # Adam steps of size ~lr: at 1e30 the weights overflow and the loss turns non-finite.
    bad = ["optimizer.lr=1e30", "optimizer.warmup_steps=0", "optimizer.clip_norm=null", NO_EVAL]
    with pytest.raises(dysejax.TrainingError, match=r"non-finite loss or gradient at step \d+ \(bucket \d+, plan dp\)"):
        dysejax.Trainer(tiny_config(*bad), workdir=str(tmp_path / "stop")).fit(steps=6)
    trainer = dysejax.Trainer(tiny_config(*bad, "train.nonfinite=skip"), workdir=str(tmp_path / "skip"))
    rows = trainer.fit(steps=6)
    assert rows[-1]["skipped_steps"] > 0 and len(rows) == 6


def test_skipped_step_leaves_the_state_unchanged(tiny_config, tmp_path):
    import jax
    trainer = dysejax.Trainer(tiny_config("train.nonfinite=skip", "data.eval_batches=0"), workdir=str(tmp_path))
    trainer.warmup()
    state = trainer.state_layout.init(0)
    params = dict(state["params"])
    params["final_norm"] = params["final_norm"] * float("nan")  # every loss is NaN now
    state = {**state, "params": params}
    before = jax.tree.map(np.asarray, state)
    plan_b = trainer.data.train_iterator().next_plan()
    program = trainer.program_for("train", plan_b.bucket, plan_b.batch_size)
    after, out = program(state, trainer.load_batch(plan_b, program.plan))
    assert not bool(out["finite"])
    for a, b in zip(jax.tree.leaves(before["params"]) + jax.tree.leaves(before["opt_state"]),
                    jax.tree.leaves(after["params"]) + jax.tree.leaves(after["opt_state"])):
        np.testing.assert_array_equal(np.asarray(b), a)
