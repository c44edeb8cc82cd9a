"""Several processes through `train.py --coordinator`: 2 x 4 simulated CPU devices against 1 x 8
(a plan switch between buckets, a checkpoint resume, the persistent compile cache kept off), a
lost peer, and processes that cannot join."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, TINY, compile_flags

# Two buckets, each with its own plan; with this seed step 3 and step 8 are 64-token batches (dp)
# and the others 128-token ones (fsdp). The schedule horizon is fixed so every run shares programs.
SETS = ["data.tokenizer=bytes", "model.vocab_size=264", "data.buckets=[64,128]", "data.tokens_per_batch=1024",
        "data.max_docs=300", "data.pack=false",
        "data.eval_batches=0", "train.seed=1", "train.progress=false", "model.d_model=64", "model.d_ff=128",
        "optimizer.total_steps=8", "train.checkpoint_every=2", "parallel.plan={64: dp, 128: fsdp}"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra):
    env = dict(os.environ, XLA_FLAGS=compile_flags())  # train.py sets up its own devices
    env.update(extra)
    return env


def _cmd(workdir, steps, *extra, process=None, n=2, port=None):
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--config", TINY, "--workdir", str(workdir),
           "--steps", str(steps)]
    if process is not None:
        cmd += ["--coordinator", f"127.0.0.1:{port}", "--num-processes", str(n), "--process-id", str(process)]
    return cmd + ["--set", *SETS, *extra]


def _launch(workdir, steps, *extra, n=2, env=None):
    """Processes n-1 .. 0 of one run (process 0 hosts the coordinator), as Popen objects by id."""
    port = _free_port()
    procs = {}
    for i in reversed(range(n)):
        procs[i] = subprocess.Popen(_cmd(workdir, steps, f"parallel.cpu_devices={8 // n}", *extra, process=i, n=n,
                                         port=port), cwd=ROOT, env=env or _env(), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
    return procs


def _finish(procs, timeout=300):
    """{id: (returncode, stdout, stderr)} once every process has exited."""
    out = {}
    for i, p in procs.items():
        stdout, stderr = p.communicate(timeout=timeout)
        out[i] = (p.returncode, stdout, stderr)
    return out


def _losses(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


# Every word of gloo's "[Gloo] Rank R is connected to N peer ranks. Expected number of connected peer
# ranks is : N": its threads write the pieces separately, so one notice can be split over several lines.
_GLOO_WORDS = {"gloo", "rank", "is", "connected", "to", "peer", "ranks", "expected", "number", "of"}


def _is_gloo_fragment(line):
    words = re.findall(r"[A-Za-z]+", line)
    rest = re.sub(r"[A-Za-z]+|\d+|[\s.:\[\]]", "", line)
    return not rest and all(w.lower() in _GLOO_WORDS for w in words)


def _own_lines(text):
    """Output lines of ours, without gloo's connection notices or their fragments."""
    return [line for line in text.splitlines() if line.strip() and not _is_gloo_fragment(line)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 1 x 8 run to step 8, and a 2 x 4 run to step 4 resumed to step 8 (compile hits logged)."""
    root = tmp_path_factory.mktemp("mp")
    one = subprocess.run(_cmd(root / "one", 8), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    first = _finish(_launch(root / "two", 4))
    resumed = _finish(_launch(root / "two", 8, env=_env(JAX_LOG_COMPILES="1")))
    for result in (first, resumed):
        for i, (rc, _, err) in result.items():
            assert rc == 0, f"process {i}: {err[-3000:]}"
    return {"one": root / "one", "two": root / "two", "first": first, "resumed": resumed}


@pytest.mark.slow  # three processes trained in one module fixture (~3 min)
def test_two_processes_match_one_process_across_a_plan_switch_and_a_resume(runs):
    ref, two = _losses(runs["one"]), _losses(runs["two"])
    assert [r["step"] for r in two] == list(range(1, 9))
    assert [r["plan"] for r in two] == [r["plan"] for r in ref]
    assert {r["plan"] for r in two} == {"dp", "fsdp"}, "the run must switch plans between buckets"
    for a, b in zip(ref, two):
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(a["loss"]), (a["step"], a["loss"], b["loss"])
    assert "resumed from checkpoint step 4" in runs["resumed"][0][1]
    # only process 0 prints and writes metrics
    assert "mesh data=8 over 8 cpu devices" in runs["first"][0][1]
    assert _own_lines(runs["first"][1][1]) == [] and _own_lines(runs["resumed"][1][1]) == []


@pytest.mark.slow  # three processes trained in one module fixture (~3 min)
def test_processes_keep_the_persistent_compile_cache_off_on_cpu(runs):
    # XLA:CPU's cached multi-device programs can deadlock (dysejax.runtime.persistent_cache_refusal):
    # every process compiles its programs, writes no entry and reads none
    assert not os.path.exists(runs["two"] / "compile_cache")
    assert "compile cache: off (XLA:CPU with 8 devices: its cached programs lose the order" in runs["first"][0][1]
    for i, (_, _, err) in runs["resumed"].items():
        assert "Traceback" not in err and "Persistent compilation cache hit" not in err, err[-2000:]
        assert "compilation(s) after warmup" not in err, err[-2000:]


@pytest.mark.slow  # three processes trained in one module fixture (~3 min)
def test_a_lost_peer_stops_the_others_within_the_timeout(tmp_path, runs):
    timeout = 5
    procs = _launch(tmp_path, 400, f"train.peer_timeout_s={timeout}",
                    f"train.compile_cache_dir={runs['two'] / 'compile_cache'}")
    deadline = time.time() + 240
    while time.time() < deadline and procs[0].poll() is None:
        if os.path.exists(tmp_path / "metrics.jsonl") and len(_losses(tmp_path)) >= 2:
            break
        time.sleep(0.1)
    assert procs[0].poll() is None, procs[0].communicate()[1][-2000:]
    procs[1].send_signal(signal.SIGKILL)
    t0 = time.time()
    _, err = procs[0].communicate(timeout=120)
    elapsed = time.time() - t0
    procs[1].communicate()
    lines = _own_lines(err)
    assert procs[0].returncode == 1, err[-2000:]
    assert lines[-1].startswith("error: lost process 1 of 2: no heartbeat for"), err[-2000:]
    assert elapsed < timeout + 10, f"process 0 took {elapsed:.1f} s to notice"


def test_processes_that_derive_different_batches_refuse_to_start(tmp_path):
    port = _free_port()
    procs = {i: subprocess.Popen(_cmd(tmp_path / "w", 4, "parallel.cpu_devices=4", f"train.seed={i}", process=i,
                                      port=port), cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for i in (1, 0)}
    for i, (rc, _, err) in _finish(procs).items():
        assert rc == 2, f"process {i}: {err[-2000:]}"
        assert _own_lines(err)[-1].startswith("error: process(es) 1 derived another config, data or plan table "
                                              "than process 0"), err[-2000:]


@pytest.mark.parametrize("process, message", [
    (1, "error: cannot reach the coordinator 127.0.0.1:"),
    (0, "error: not every process joined through 127.0.0.1:"),
])
def test_a_process_that_cannot_join_exits_2(tmp_path, process, message):
    cmd = _cmd(tmp_path / "w", 4, "train.peer_timeout_s=2", process=process, port=_free_port())
    t0 = time.time()
    out = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = _own_lines(out.stderr)
    assert len(lines) == 1 and lines[0].startswith(message), out.stderr
    assert time.time() - t0 < 30
    assert not (tmp_path / "w").exists()
