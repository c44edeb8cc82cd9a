"""What a run shows and keeps: log lines, summary, plot, MFU (a longer run compiling nothing new: test_programs)."""
import json
import os

import pytest

import dysejax
import train
from tests.conftest import FAST, TINY


def _cli(tmp_path, *args):
    import subprocess
    import sys

    from tests.conftest import ROOT, compile_flags
    # a user's unrelated flag (and the tests' compile flags): still 8 simulated devices
    env = dict(os.environ, XLA_FLAGS=f"--xla_cpu_enable_fast_math=false {compile_flags()}")
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--config", TINY, *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_piped_run_prints_plans_log_lines_summary_and_draws_the_run(tmp_path):
    work = tmp_path / "run"
    out = _cli(tmp_path, "--workdir", str(work), "--steps", "4", "--set", *FAST, "train.log_every=2",
               "train.progress=true", "data.eval_batches=0")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "mesh data=8 over 8 cpu devices" in text
    table = text[text.index("plans (parallel.plan; budget unlimited per device):"):]
    assert " 64 " in table.splitlines()[2] and " 128 " in table.splitlines()[3] and "dp" in table.splitlines()[2]
    steps = [line for line in text.splitlines() if line.startswith("step ")]
    assert [s.split()[1] for s in steps] == ["1/4", "2/4", "4/4"], steps  # first, every 2nd, last
    assert all("tok/s" in s and "MFU" in s and "plan dp" in s for s in steps)
    assert "\r" not in out.stderr  # no progress bar redrawn into a pipe
    summary = text[text.index(" bucket  steps"):]
    assert summary.splitlines()[-3].split()[:2] == ["all", "4"], summary
    rows = [json.loads(line) for line in open(work / "metrics.jsonl")]
    for r in rows:
        assert 0 < r["mfu"] < 1 and r["model_tflops"] > 0 and r["bucket_tokens_per_s"] > 0
    png = work / "run.png"
    assert png.stat().st_size > 20_000
    png.unlink()
    again = _cli(tmp_path, "--workdir", str(work), "--plot")
    assert again.returncode == 0 and png.stat().st_size > 20_000, again.stderr


@pytest.mark.parametrize("flag", [["--json"], ["--plan-png", "x.png"]])
def test_plan_flags_without_plan_are_an_error(capsys, tmp_path, flag):
    with pytest.raises(SystemExit) as e:
        train.main(["--config", TINY, "--workdir", str(tmp_path), *flag])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"error: {flag[0]} only goes with --plan")
    assert len(err.strip().splitlines()) == 1 and not os.listdir(tmp_path)


def test_plot_without_a_run_is_an_error(capsys, tmp_path):
    assert train.main(["--config", TINY, "--workdir", str(tmp_path / "none"), "--plot"]) == 2
    assert capsys.readouterr().err.startswith("error: --plot: no run in")


def test_model_flops_match_the_compiled_programs_matmuls(tiny_config, tmp_path):
    """MFU's numerator against the dots XLA compiled (loop trip counts included), at dense
    non-causal cost (the dense kernel computes the whole score matrix), remat off; the chunked
    loss's backward recomputes the head's logits (2·tokens·h·V), which MFU does not count."""
    from costmodel.time import hlo_dot_flops
    from dysejax.flops import train_flops

    trainer = dysejax.Trainer(tiny_config("model.attention=dense"), workdir=str(tmp_path), verbose=False)
    for bucket in (64, 128):
        batch = trainer.data.batch_size(bucket)
        compiled = trainer.compile(bucket, "dp")
        xla = hlo_dot_flops(compiled.as_text()) * trainer.n_devices
        model = train_flops(trainer.config.model, batch, bucket, causal=False)
        cfg = trainer.config.model
        xla -= 2 * batch * bucket * cfg.d_model * cfg.vocab_size  # the loss's recompute
        assert abs(model - xla) / xla < 0.02, (bucket, model, xla)


def test_per_bucket_scalars_for_tensorboard_and_wandb():
    from dysejax.metrics import scalars_of
    row = {"step": 3, "loss": 2.5, "bucket": 128, "plan": "dp", "tokens_per_s": 900.0, "mfu": 0.1,
           "bucket_tokens_per_s": 850.0, "step_time_s": 0.5, "finite": True}
    s = scalars_of(row)
    assert s["tokens_per_s/bucket_128"] == 900.0 and s["mfu/bucket_128"] == 0.1
    assert s["bucket_tokens_per_s/bucket_128"] == 850.0 and "plan" not in s and "step" not in s
    assert "finite" not in s
