"""Pipeline parallelism: loss and gradients vs the single-device reference, training and resume
vs `dp`, and the configuration errors."""
import functools

import flax.linen as nn
import jax
import numpy as np
import pytest

import dysejax
from dysejax.model.transformer import Transformer, block_spec, init_params
from dysejax.state import logical_axes
from dysejax.step import loss_sums
from sharding.layout import StorageLayout
from sharding.mesh import build_mesh
from sharding.pipeline import Pipeline, PipelineError
from sharding.plan import parse_plan
from sharding.strategies import STRATEGIES
from tests.conftest import TINY
from tests.reference import model_config, packed_batch, relative_error

LAYERS, BATCH, SEQ = 4, 16, 96


def _step(plan, mesh, cfg, params, batch, pipeline=None):
    """(mean loss, grads) of one step, params in the storage layout of `mesh`."""
    layout = StorageLayout(mesh)
    boxed = init_params(cfg, jax.random.key(0))
    shardings = jax.tree.map(lambda names, p: layout.sharding(names, p.shape), logical_axes(boxed),
                             nn.unbox(boxed), is_leaf=lambda x: isinstance(x, tuple))
    params = jax.device_put(params, shardings)

    def loss(p, b):
        total, count = loss_sums(Transformer(cfg), plan, mesh, p, b, pipeline)
        return total / count

    value, grads = jax.jit(jax.value_and_grad(loss), out_shardings=(None, shardings))(params, batch)
    return float(value), jax.tree.map(np.asarray, grads)


@functools.lru_cache(maxsize=None)
def _reference():
    cfg = model_config(f"model.n_layers={LAYERS}")
    params = jax.tree.map(np.asarray, nn.unbox(init_params(cfg, jax.random.key(0))))
    data = packed_batch(BATCH, SEQ)
    loss, grads = _step(parse_plan("dp", LAYERS, list(STRATEGIES)), build_mesh({"data": 1}, jax.devices()[:1]),
                        cfg, params, data)
    return cfg, params, data, loss, grads


def check_pipeline(pipeline: Pipeline, mesh_axes: dict, plan: str = "dp", rtol: float = 1e-5):
    """Assert a pipelined step's loss and gradients equal the single-device reference."""
    cfg, params, data, ref_loss, ref_grads = _reference()
    plan = parse_plan(plan, LAYERS, list(STRATEGIES))
    loss, grads = _step(plan, build_mesh(mesh_axes), cfg, params, data, pipeline)
    what = f"{pipeline} on {mesh_axes}, plan {plan.id}"
    assert abs(loss - ref_loss) <= rtol * abs(ref_loss), (what, loss, ref_loss)
    for (path, g), r in zip(jax.tree_util.tree_flatten_with_path(grads)[0], jax.tree.leaves(ref_grads)):
        err = relative_error(g, r)
        assert err <= rtol, f"{what}: grad {jax.tree_util.keystr(path)} rel err {err:.2e}"


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("partition", [(), (3, 1)])
def test_pipeline_matches_reference(schedule, partition):
    check_pipeline(Pipeline(2, 4, schedule, partition), {"stage": 2, "data": 4})


def test_fsdp_inside_stages_with_remat_and_m_equal_to_p():
    check_pipeline(Pipeline(2, 2, "1f1b", (1, 3)), {"stage": 2, "data": 4}, [["fsdp", LAYERS, "full"]])


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_tp_sp_inside_stages(schedule):
    check_pipeline(Pipeline(2, 2, schedule), {"stage": 2, "data": 2, "model": 2}, "tp_sp")


def test_selective_remat_inside_stages():
    check_pipeline(Pipeline(2, 2, "1f1b"), {"stage": 2, "data": 2, "model": 2}, [["tp_sp", LAYERS, "selective"]])


# Each strategy's own code inside the stages (its shard_maps nested in the stage's), on a mesh
# where its check passes: one case per strategy not tested above, alternating meshes and schedules.
_STRATEGY_CASES = [
    ("tp", {"stage": 2, "model": 4}, "1f1b"),
    ("ring", {"stage": 2, "data": 2, "model": 2}, "gpipe"),
    ("ulysses", {"stage": 2, "model": 4}, "1f1b"),
    ("metp", {"stage": 2, "data": 2, "model": 2}, "1f1b"),
]


@pytest.mark.parametrize("strategy, mesh_axes, schedule", _STRATEGY_CASES)
def test_strategy_inside_stages(strategy, mesh_axes, schedule):
    check_pipeline(Pipeline(2, 2, schedule), mesh_axes, strategy)


def test_every_strategy_is_tested_inside_stages():
    tested = {"dp", "fsdp", "tp_sp"} | {case[0] for case in _STRATEGY_CASES}
    assert tested == set(STRATEGIES), set(STRATEGIES) - tested


# Mixed plans: each stage runs the same sequence of strategies (tp_sp then metp).
_MIXED = [["tp_sp", 1], ["metp", 1], ["tp_sp", 1], ["metp", 1]]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_mixed_plan_inside_stages(schedule):
    check_pipeline(Pipeline(2, 2, schedule), {"stage": 2, "data": 2, "model": 2}, _MIXED)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_mixed_strategies_and_remat_inside_stages(schedule):
    check_pipeline(Pipeline(2, 2, schedule), {"stage": 2, "model": 4},
                   [["ring", 1], ["ulysses", 1, "selective"]] * 2)


def test_stages_must_run_the_same_sequence_of_runs():
    plan = parse_plan([["tp_sp", 2], ["metp", 2]], LAYERS, list(STRATEGIES))
    with pytest.raises(PipelineError, match=r"every pipeline stage must run the same sequence of \(strategy, remat\) "
                                            r"runs, but plan 'tp_sp:2,metp:2' cut by partition \[2, 2\]"):
        Pipeline(2, 2).check(plan, block_spec(model_config()), build_mesh({"stage": 2, "data": 2, "model": 2}), 16, 96)


@pytest.mark.slow  # pipelines against the reference stay in the default suite
def test_trainer_pipeline_trains_and_resumes_like_dp(tiny_config, tmp_path):
    # Same batches as dp (micro-batches x in-stage devices = 8 = the batch multiple of dp).
    common = ["model.n_layers=3", "data.buckets=[64]", "train.eval_every=2", "train.checkpoint_every=2"]
    dp = dysejax.Trainer(tiny_config(*common), workdir=str(tmp_path / "dp")).fit(steps=3)
    pipe = common + ["parallel.pipeline.stages=2", "parallel.pipeline.microbatches=2",
                     "parallel.pipeline.schedule=1f1b", "parallel.pipeline.partition=[2, 1]"]
    trainer = dysejax.Trainer(tiny_config(*pipe), workdir=str(tmp_path / "pp"))
    assert dict(trainer.mesh.shape) == {"stage": 2, "data": 4}
    first = trainer.fit(steps=2)
    rest = dysejax.Trainer(tiny_config(*pipe), workdir=str(tmp_path / "pp")).fit(steps=3)  # resumes at 2
    assert [r["step"] for r in rest] == [3]
    rows = first + rest
    assert [r["batch_size"] for r in rows] == [r["batch_size"] for r in dp]
    np.testing.assert_allclose([r["loss"] for r in rows], [r["loss"] for r in dp], rtol=1e-5)
    np.testing.assert_allclose(rows[1]["eval_loss"], dp[1]["eval_loss"], rtol=1e-5)


def test_1f1b_needs_less_memory_than_gpipe_for_more_microbatches_than_stages(tiny_config, tmp_path):
    temp = {}
    for schedule in ("gpipe", "1f1b"):
        config = tiny_config("parallel.pipeline.stages=2", "parallel.pipeline.microbatches=8", "data.buckets=[64]",
                             "data.tokens_per_batch=4096", f"parallel.pipeline.schedule={schedule}")
        compiled = dysejax.Trainer(config, workdir=str(tmp_path / schedule)).compile(64)
        assert "collective-permute" in compiled.as_text()  # micro-batches travel between stages
        temp[schedule] = compiled.memory_analysis().temp_size_in_bytes
    assert temp["1f1b"] < 0.7 * temp["gpipe"], temp


@pytest.mark.parametrize("overrides, message", [
    (["parallel.pipeline.partition=[2, 1]"], r"pipeline\.partition \[2, 1\] sums to 3 but model\.n_layers is 2"),
    (["parallel.pipeline.partition=[2]"], r"pipeline\.partition has 1 entries but parallel\.pipeline\.stages is 2"),
    (["parallel.pipeline.schedule=zb"], r"pipeline\.schedule: expected one of 'gpipe' \| '1f1b', got 'zb'"),
    (["parallel.mesh={stage: 4, data: 2}"], r"mesh\.stage \(4\) must equal parallel\.pipeline\.stages \(2\)"),
    (["parallel.pipeline.stages=3"], r"pipeline\.stages \(3\) exceeds model\.n_layers \(2\)"),
])
def test_config_errors(overrides, message):
    with pytest.raises(dysejax.ConfigError, match=message):
        dysejax.load_config(TINY, ["parallel.pipeline.stages=2"] + overrides)


def test_microbatches_need_a_pipeline():
    with pytest.raises(dysejax.ConfigError, match=r"microbatches and \.partition need parallel\.pipeline\.stages > 1"):
        dysejax.load_config(TINY, ["parallel.pipeline.microbatches=4"])


@pytest.mark.parametrize("overrides, message", [
    (["model.n_layers=3", "parallel.pipeline.stages=3"], r"pipeline\.stages \(3\) does not divide the 8 devices"),
    (["parallel.pipeline.stages=2", "parallel.mesh={data: 8}"], r"mesh \{'data': 8\} must cover the 4 devices of one"),
])
def test_trainer_config_errors(tiny_config, tmp_path, overrides, message):
    with pytest.raises(dysejax.ConfigError, match=message):
        dysejax.Trainer(tiny_config(*overrides), workdir=str(tmp_path))


def test_microbatches_must_divide_the_batch():
    plan = parse_plan("dp", LAYERS, list(STRATEGIES))
    with pytest.raises(PipelineError, match=r"microbatches \(4\) x the in-stage batch split \(4\) must divide"):
        Pipeline(2, 4).check(plan, block_spec(model_config()), build_mesh({"stage": 2, "data": 4}), 8, 64)


def test_strategy_checks_apply_inside_stages():
    plan = parse_plan("ring", LAYERS, list(STRATEGIES))
    with pytest.raises(PipelineError, match=r"in a pipeline stage \(micro-batches of 8 rows\): strategy 'ring' needs "
                                            r"sequence length \(90\) divisible by the model-parallel size \(4\)"):
        Pipeline(2, 2).check(plan, block_spec(model_config()), build_mesh({"stage": 2, "model": 4}), 16, 90)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_cost_model_prices_one_pipeline_stage(tiny_config, tmp_path, schedule):
    """`auto`'s memory prediction of a pipelined plan follows XLA's figure: one stage's layers on
    its devices, one pipeline micro-batch, the schedule's live residuals. (Priced as the whole
    model with the stage axis taken for a model-parallel group, 1f1b read 2.2x XLA's figure.)"""
    ratios = {}
    for plan in ("dp", "ring@selective"):
        config = tiny_config("model.n_layers=4", "parallel.pipeline.stages=2", "parallel.pipeline.microbatches=4",
                             f"parallel.pipeline.schedule={schedule}", "data.buckets=[128]",
                             "data.tokens_per_batch=2048", f"parallel.plan={plan}",
                             f"parallel.costmodel_dir={tmp_path / 'costmodel'}")
        trainer = dysejax.Trainer(config, workdir=str(tmp_path / plan))
        batch = trainer.data.batch_size(128)
        chosen = trainer.planner.candidates(128)[0]
        predicted, _ = trainer.planner.predict(128, batch, chosen)
        ratios[plan] = predicted / trainer.programs.get("train", 128, batch, chosen).bytes_per_device
    assert all(0.55 <= r <= 1.3 for r in ratios.values()), ratios


def test_auto_plans_a_stage_and_every_stage_runs_it():
    from dysejax.autoplan import AutoPlanner
    from costmodel.memory import Shape, mesh_roles_of
    spec = block_spec(model_config("model.n_layers=4"))
    assert mesh_roles_of({"stage": 2, "data": 4}) == mesh_roles_of({"data": 4})
    assert Shape(spec, {"stage": 2, "data": 4}, 8, 64).n_devices == 4
    pipe = Pipeline(stages=2, microbatches=4, schedule="1f1b")
    planner = AutoPlanner(spec, {"stage": 2, "data": 4}, 4, 264, "h100", None, pipeline=pipe)
    stage = parse_plan("ring:1@selective,metp:1", 2, list(STRATEGIES))
    assert planner.whole(stage).id == "ring:1@selective,metp:1,ring:1@selective,metp:1"
    assert (pipe.ticks(), pipe.residual_sets()) == (6, 1)
    assert (Pipeline(2, 4, "gpipe").ticks(), Pipeline(2, 4, "gpipe").residual_sets()) == (5, 5)
    best = planner.plan(256, 16)
    for plan in best.candidates:  # every stage runs the same plan
        assert plan.n_layers == 4 and len({p.runs for p in pipe.stage_plans(plan)}) == 1
    # the floor comes last: every layer under `full` (the model may misjudge which plan is leanest)
    assert [(r.remat, r.n_layers) for r in best.candidates[-1].runs] == [("full", 4)]
