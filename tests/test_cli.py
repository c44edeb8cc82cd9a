"""End to end through `python train.py`: the embedded default, SIGKILL + resume, SIGTERM."""
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import FAST, ROOT, TINY, compile_flags


def _env():
    return dict(os.environ, XLA_FLAGS=compile_flags())  # the CLI must set up 8 CPU devices by itself


def _cmd(workdir, steps, *extra):
    args = [sys.executable, os.path.join(ROOT, "train.py"), "--config", TINY, "--workdir", str(workdir),
            "--steps", str(steps), "--set", *FAST, "train.checkpoint_every=3", *extra]
    return args


def _run(workdir, steps, *extra):
    return subprocess.run(_cmd(workdir, steps, *extra), cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=600)


def _rows(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def _complete_steps(workdir):
    d = os.path.join(workdir, "checkpoints")
    return sorted(int(n) for n in os.listdir(d) if n.isdigit()) if os.path.isdir(d) else []


@pytest.mark.slow  # the CLI end to end stays in the default suite through test_cli_auto.py
def test_cli_trains_with_embedded_devices_and_survives_kill_9(tmp_path):
    full = _run(tmp_path / "full", 8)
    assert full.returncode == 0, full.stderr
    assert "mesh data=8 over 8 cpu devices" in full.stdout
    ref = _rows(tmp_path / "full")
    assert [r["step"] for r in ref] == list(range(1, 9))
    assert ref[-1]["loss"] < ref[0]["loss"]

    # Kill -9 once a checkpoint is complete, then re-run the same command to the end.
    work = tmp_path / "killed"
    proc = subprocess.Popen(_cmd(work, 8, "train.async_checkpoint=false"), cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not _complete_steps(work) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    assert _complete_steps(work), "no checkpoint appeared before the kill"
    again = _run(work, 8)
    assert again.returncode == 0, again.stderr
    assert "resumed from checkpoint step" in again.stdout
    assert [r["loss"] for r in _rows(work)] == [r["loss"] for r in ref]


def test_sigterm_saves_the_current_step(tmp_path):
    work = tmp_path / "term"
    proc = subprocess.Popen(_cmd(work, 400), cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(work / "metrics.jsonl") and len(_rows(work)) >= 4:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, out
    last = _rows(work)[-1]["step"]
    assert last < 400 and _complete_steps(work)[-1] == last
    assert f"stopped by SIGTERM at step {last}" in out


def _temporary(workdir):
    """orbax's in-progress checkpoint folders (renamed to the step number once complete)."""
    d = os.path.join(workdir, "checkpoints")
    return {n for n in os.listdir(d) if "tmp" in n} if os.path.isdir(d) else set()


@pytest.mark.slow
def test_kill_9_at_random_points_and_during_saves_resumes_exactly(tmp_path):
    """Seeded kill points (after random steps, and while orbax writes a checkpoint); each rerun
    resumes from the last complete checkpoint and the final losses equal an uninterrupted run."""
    rng = random.Random(8)
    cache = f"train.compile_cache_dir={tmp_path / 'cache'}"
    ref = _run(tmp_path / "full", 12, cache)
    assert ref.returncode == 0, ref.stderr
    work = tmp_path / "killed"
    points = [("step", rng.randint(1, 4)), ("save", None), ("step", rng.randint(7, 10)), ("save", None)]
    caught_saving = 0
    for kind, at in points:
        complete, leftover = _complete_steps(work), _temporary(work)
        proc = subprocess.Popen(_cmd(work, 12, cache), cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if kind == "save" and _temporary(work) - leftover:
                caught_saving += 1
                break
            rows = _rows(work) if os.path.exists(work / "metrics.jsonl") else []
            if kind == "step" and rows and rows[-1]["step"] >= at:
                break
            time.sleep(0.002)
        proc.kill()
        out, _ = proc.communicate()
        assert proc.returncode == -signal.SIGKILL, f"{kind} {at}: the run ended before the kill\n{out}"
        if complete:  # the rerun resumed from the newest complete checkpoint, not a half-written one
            assert f"resumed from checkpoint step {complete[-1]} " in out, out
    assert caught_saving >= 1, "no kill landed during a checkpoint save"
    final = _run(work, 12, cache)
    assert final.returncode == 0, final.stderr
    assert [r["loss"] for r in _rows(work)] == [r["loss"] for r in _rows(tmp_path / "full")]
