"""parallel.plan=auto and the plan report: the search's plans checked against XLA's own figures."""
import json

import pytest

import train
from tests.conftest import FAST, TINY

# Three buckets, so that a tight budget can separate short from long ones.
AUTO = ["parallel.plan=auto", "data.buckets=[64,128,256]", "data.long_policy=split"]


@pytest.fixture(scope="module", autouse=True)
def shared_calibration(tmp_path_factory):
    """One memory calibration of the tiny model for the whole module (it compiles ~56 programs)."""
    AUTO.append(f"parallel.costmodel_dir={tmp_path_factory.mktemp('costmodel')}")
    yield
    AUTO.pop()


def report_of(capsys, tmp_path, *extra):
    rc = train.main(["--config", TINY, "--workdir", str(tmp_path / "run"), "--plan", "--json",
                     "--set", *FAST, *AUTO, *extra])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


def test_plan_json_schema_and_unlimited_budget(capsys, tmp_path):
    rep = report_of(capsys, tmp_path)
    assert rep["devices"] == 8 and rep["memory_budget_bytes"] is None
    assert [b["seq_len"] for b in rep["buckets"]] == [64, 128, 256]
    for b in rep["buckets"]:
        assert isinstance(b["batch_size"], int) and b["fits"] is True
        assert isinstance(b["predicted_bytes"], int) and b["predicted_step_s"] > 0
        assert sum(run[1] for run in b["plan"]) == 2 and all(isinstance(run[0], str) for run in b["plan"])
    assert (tmp_path / "run" / "plan.png").stat().st_size > 10_000


def _trainer(tmp_path, *extra):
    import dysejax
    cfg = dysejax.load_config(TINY, FAST + AUTO + list(extra))
    return dysejax.Trainer(cfg, workdir=str(tmp_path / "run"), verbose=False)


# The two tests below fit the memory model to XLA on these devices first (a budget on CPU:
# ~56 layer programs, minutes of compiling), so they run with the slow tests (.ci/run).
@pytest.mark.slow
def test_fitting_plans_compile_within_budget_and_match_prediction(capsys, tmp_path):
    # a budget between the leanest and the fastest plans' needs at the longest bucket
    free = report_of(capsys, tmp_path)
    budget_gb = 0.7 * free["buckets"][-1]["predicted_bytes"] / 2**30
    rep = report_of(capsys, tmp_path, f"parallel.memory_budget_gb={budget_gb}")
    trainer = _trainer(tmp_path, f"parallel.memory_budget_gb={budget_gb}")
    plans = {b["seq_len"]: b for b in rep["buckets"]}
    assert all(b["fits"] for b in rep["buckets"])
    for s, b in plans.items():
        program = trainer.programs.get("train", s, b["batch_size"], trainer.planner.parse(b["plan"]))
        xla = program.bytes_per_device
        assert xla <= rep["memory_budget_bytes"], (s, b["plan"], xla)
        # uniform plans within 10% (their layers were calibrated at these very shapes); the search
        # picks uniform plans here. A mixed pick on this 2-layer model (runs of one layer, which
        # XLA inlines) is held to -10% / +55%: benchmarks/mixed_plan_memory.py measures -12% to
        # +103% over 48 such plans, so auto lets XLA's figure decide (asserted against the budget
        # above). Mixed plans of runs of two layers: test_forced_mixed_plans_memory_matches_xla.
        over = 0.10 if len(b["plan"]) == 1 else 0.55
        assert -0.10 < (b["predicted_bytes"] - xla) / xla < over, (s, b["plan"], b["predicted_bytes"], xla)
    # under the tight budget the short bucket keeps a faster plan than the long one needs
    short, long_ = plans[64], plans[256]
    assert short["plan"] != long_["plan"]
    planner, bs = trainer.planner, short["batch_size"]
    t_short = planner.predict(64, bs, trainer.planner.parse(short["plan"]))[1]
    t_long_plan = planner.predict(64, bs, trainer.planner.parse(long_["plan"]))[1]
    assert t_short < t_long_plan


# Mixed plans forced on a 4-layer model (runs of two layers, each a scan as in real plans),
# priced by the backward-order bound (costmodel/table.py) from layers calibrated in uniform
# stacks: within 10% of XLA's bytes per device. The tp -> metp order over-predicts
# (benchmarks/mixed_plan_memory.py: +24% to +41%): it is held to an over-estimate below +45%.
FORCED_MIXED = [(64, [["dp", 2, "dots"], ["fsdp", 2]], 0.10), (128, [["ring", 2, "selective"], ["metp", 2]], 0.10),
                (256, [["tp_sp", 2], ["ulysses", 2, "full"]], 0.10), (128, [["tp", 2], ["metp", 2, "full"]], 0.45)]


@pytest.mark.slow
def test_forced_mixed_plans_memory_matches_xla(tmp_path):
    trainer = _trainer(tmp_path, "model.n_layers=4", "parallel.memory_budget_gb=1")  # a budget: calibrated
    for seq_len, value, over in FORCED_MIXED:
        plan, batch = trainer.planner.parse(value), trainer.data.batch_size(seq_len)
        assert len({run.strategy for run in plan.runs}) == 2 and [run.n_layers for run in plan.runs] == [2, 2]
        predicted = trainer.planner.predict(seq_len, batch, plan)[0]
        xla = trainer.programs.get("train", seq_len, batch, plan).bytes_per_device
        assert -0.10 < (predicted - xla) / xla < over, (seq_len, plan.id, predicted, xla)


def test_no_plan_fits_is_reported_for_plan_and_an_error_for_training(capsys, tmp_path):
    # a GPU profile: no calibration; one bucket and no eval: every candidate is compiled to show none fits
    tiny = ["parallel.memory_budget_gb=0.00001", "parallel.hardware=a100-80gb", "data.buckets=[64]",
            "data.eval_batches=0"]
    rep = report_of(capsys, tmp_path, *tiny)
    assert not any(b["fits"] for b in rep["buckets"])
    rc = train.main(["--config", TINY, "--workdir", str(tmp_path / "t"), "--set", *FAST, *AUTO, *tiny,
                     "train.steps=2"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: bucket 64") and "no plan fits the memory budget" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "t" / "checkpoints").exists() or not any((tmp_path / "t" / "checkpoints").iterdir())


def test_auto_falls_back_when_xla_says_over_budget(tmp_path, monkeypatch):
    """The first candidate's prediction is wrong (it is over budget by XLA's figure): the next runs."""
    from dysejax import autoplan
    from sharding.plan import Plan, Run

    original = autoplan.AutoPlanner._search

    def wrong_first(self, seq_len, batch_size):
        bp = original(self, seq_len, batch_size)
        return autoplan.BucketPlan(**{**bp.__dict__, "candidates": (Plan((Run("tp", 2),)),) + bp.candidates})
    monkeypatch.setattr(autoplan.AutoPlanner, "_search", wrong_first)
    gpu = "parallel.hardware=a100-80gb"  # priced for a GPU profile: no calibration needed here
    probe = _trainer(tmp_path, gpu)
    tp_bytes = probe.programs.get("train", 64, probe.data.batch_size(64), probe.planner.parse("tp")).bytes_per_device
    trainer = _trainer(tmp_path, gpu, f"parallel.memory_budget_gb={0.95 * tp_bytes / 2**30}", "data.buckets=[64]")
    trainer.warmup()
    program = trainer.program_for("train", 64, trainer.data.batch_size(64))
    assert program.plan.id != "tp" and program.bytes_per_device <= trainer.budget
    rows = trainer.fit(2)
    assert [r["plan"] for r in rows] == [program.plan.id] * 2 and rows[-1]["compiles_after_warmup"] == 0


def test_written_plans_are_reported_with_predictions(capsys, tmp_path):
    rep = report_of(capsys, tmp_path, "parallel.plan={64: dp, default: [[tp_sp, 1], [metp, 1, full]]}")
    by = {b["seq_len"]: b for b in rep["buckets"]}
    assert by[64]["plan"] == [["dp", 2]] and by[128]["plan"] == [["tp_sp", 1], ["metp", 1, "full"]]
    assert not by[64]["auto"] and by[128]["predicted_bytes"] > 0


def test_unknown_hardware_is_a_config_error(capsys, tmp_path):
    rc = train.main(["--config", TINY, "--workdir", str(tmp_path), "--plan", "--set", *FAST, *AUTO,
                     "parallel.hardware=tpu-v9"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: parallel.hardware: unknown 'tpu-v9': use auto or one of a100-80gb")
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("hardware", ["a100-80gb", "h200"])
def test_planning_a_gpu_from_here_uses_what_jax_could_use_there(capsys, tmp_path, hardware, monkeypatch):
    from costmodel.hardware import PROFILES
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    rep = report_of(capsys, tmp_path, f"parallel.hardware={hardware}", "parallel.memory_headroom=0.1")
    # JAX's allocator takes 75% of the device by default; the headroom comes off that
    assert rep["memory_budget_bytes"] == int(PROFILES[hardware].memory_bytes * 0.75 * 0.9)
    assert rep["hardware"] == hardware and all(b["fits"] for b in rep["buckets"])


@pytest.mark.slow
def test_grad_accum_plans_are_priced_per_micro_batch(tmp_path):
    # 2,048 tokens per batch in two micro-batches: 16 rows of 128 run as 8 at a time (2 x 256 at 256)
    trainer = _trainer(tmp_path, "model.n_layers=4", "data.tokens_per_batch=2048", "train.grad_accum=2",
                       "parallel.memory_budget_gb=1")
    for seq_len, value in ((128, "dp"), (128, "ring@selective"), (256, "tp_sp@full")):
        plan, batch = trainer.planner.parse(value), trainer.data.batch_size(seq_len)
        predicted = trainer.planner.predict(seq_len, batch, plan)[0]
        xla = trainer.programs.get("train", seq_len, batch, plan).bytes_per_device
        assert abs(predicted - xla) / xla < 0.10, (seq_len, value, predicted, xla)
