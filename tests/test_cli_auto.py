"""`python train.py` with `plan: auto` under a budget, as a user runs it: plans with remat
suffixes, mixed plans written as ids, per-bucket plans, trained to the last step. Auto prices
with a GPU profile here (`parallel.hardware`), which needs no calibration: the runs train on
this machine's devices with the plans it picked (calibrating this model on the CPU devices
takes minutes; its cache is tested in test_costmodel)."""
import json
import os
import subprocess
import sys

from tests.conftest import FAST, ROOT, TINY, compile_flags

MIXED = "ring:1@selective,metp:1@full"  # a plan id: runs, layer counts and remat policies
HARDWARE = "parallel.hardware=h100"
# The run under a budget: 8 layers, so that plans without remat need far more than those with
# it, and a plan written for the short bucket that fits where auto needs remat at the long one
LAYERS = "model.n_layers=8"
WRITTEN = "ring:4@full,metp:4@full"


def _run(workdir, *settings, flags=(), steps=3):
    env = dict(os.environ, XLA_FLAGS=compile_flags())  # the CLI sets up its devices itself
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--config", TINY, "--workdir", str(workdir),
           "--steps", str(steps), "--set", *FAST, "data.eval_batches=0", "train.checkpoint_every=100", *settings, *flags]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)


def _rows(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def _plan_report(workdir, *settings):
    out = _run(workdir, *settings, flags=("--plan", "--json"))
    assert out.returncode == 0, out.stderr
    return {b["seq_len"]: b for b in json.loads(out.stdout)["buckets"]}


def _budget_that_needs_remat(tmp_path, seq_len, written: dict):
    """A budget under what every uniform plan without remat needs at `seq_len`, over what the
    leanest plan under `full` needs there and over what each `written` {bucket: plan id} needs
    (the cost model's predictions for HARDWARE; XLA:CPU's figure, which training checks, can be
    ~15% above them, hence the margin on the written plans)."""
    import dysejax
    from dysejax.build import build
    from dysejax.errors import PlanError
    from sharding.strategies import STRATEGIES

    cfg = dysejax.load_config(TINY, FAST + ["data.eval_batches=0", "parallel.plan=auto", HARDWARE, LAYERS,
                                            "parallel.memory_budget_gb=100"])
    planner = build(cfg, str(tmp_path / "budget"), verbose=False).planner

    def need(plan_id, length):
        return planner.predict(length, planner.data.batch_size(length), planner.parse(plan_id))[0]
    needs = {}
    for name in STRATEGIES:
        for suffix in ("", "@full"):
            try:
                planner.check(planner.parse(name + suffix), seq_len, planner.data.batch_size(seq_len))
            except PlanError:
                continue
            needs[name + suffix] = need(name + suffix, seq_len)
    without = min(n for pid, n in needs.items() if "@" not in pid)
    lean = min(n for pid, n in needs.items() if "@" in pid)
    budget = max([lean + 0.25 * (without - lean)] + [1.3 * need(p, b) for b, p in written.items()])
    assert budget < without, (needs, budget)
    return budget / 2**30


def test_auto_under_a_budget_with_written_mixed_and_remat_plans_trains_to_the_end(tmp_path):
    budget_gb = _budget_that_needs_remat(tmp_path, 128, {64: WRITTEN})
    plan = f'{{64: "{WRITTEN}", default: auto}}'
    run = _run(tmp_path / "run", f"parallel.plan={plan}", f"parallel.memory_budget_gb={budget_gb}", HARDWARE, LAYERS)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = _rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert WRITTEN in run.stdout  # the plan table priced the written id
    auto_long = next(line for line in run.stdout.splitlines() if line.split()[:1] == ["128"])
    assert "@" in auto_long, f"auto's plan at 128 within {budget_gb:.4f} GiB has no remat policy: {auto_long}"
    assert all(r["plan"] == WRITTEN for r in rows if r["bucket"] == 64)


def test_plan_ids_anywhere_a_plan_is_read(tmp_path):
    """The id every report prints is accepted by --set, by a per-bucket mapping and by --plan."""
    rep = _plan_report(tmp_path / "ids", f"parallel.plan={MIXED}")
    assert all(b["plan"] == [["ring", 1, "selective"], ["metp", 1, "full"]] for b in rep.values())
    bad = _run(tmp_path / "bad", "parallel.plan=ring:1@selective,metp:x", flags=("--plan",))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1] == (
        "error: parallel.plan: 'ring:1@selective,metp:x' is not a plan: write STRATEGY, STRATEGY@REMAT or runs "
        "STRATEGY:LAYERS[@REMAT] joined by commas, e.g. tp_sp:3@selective,metp:1@full")
    assert not (tmp_path / "bad").exists()
