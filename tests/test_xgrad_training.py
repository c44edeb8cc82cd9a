"""XGrad weight prediction through `dysejax.Trainer` (the optimizer maths is in test_optim.py).

The train step takes the loss and gradients at θ̂ = θ − s·lr·Δ and applies the plain update to
θ. Checked here at the trainer level: s = 0 is the plain optimizer bit for bit; with s = 1 the
loss of step 2 is the loss at a hand-computed θ̂ and θ_2 is θ_1 plus the plain update with the
gradient at θ̂; every plan and gradient accumulation agree; the compiled step needs at most one
parameter-sized buffer more (XLA's per-device figures) and the same collectives; shardings hold.

All runs share one bucket and batch (64 x 32 rows) so a run compiles one train program.
"""
import dataclasses
import math
import re
from collections import Counter

import jax
import numpy as np
import optax
import pytest

from costmodel.hlo import collective_bytes

import dysejax
import dysejax.step
from dysejax.config import TrainConfig
from dysejax.batches import abstract_batch, batch_sharding
from dysejax.step import loss_sums, make_train_step
from tests.conftest import FAST, TINY

BASE = FAST + ["data.buckets=[64]", "data.tokens_per_batch=2048", "data.eval_batches=0",
               "optimizer.warmup_steps=2"]
PEAK_LR, WARMUP = 3e-3, 2  # tiny.yaml's lr; the warmup above
S1 = "optimizer.weight_prediction_steps=1"
STEPS = 8  # the long runs (loss must fall)
SHORT = 4  # runs compared with the dp s=1 run
BUCKET = 64
OPTIMIZERS = ["sgdm", "adam", "adamw", "adabelief", "adam3"]


def _config(*extra):
    return dysejax.load_config(TINY, BASE + list(extra))


def _plan(trainer, bucket=BUCKET):
    return trainer.planner.candidates(bucket)[0]


def _losses(rows):
    return np.array([r["loss"] for r in rows])


def _bypass_prediction(monkeypatch):
    """Train steps built from now on never call the prediction code (the plain optimizer)."""
    monkeypatch.setattr(dysejax.step, "predict_params", lambda optimizer, params, opt_state, step, horizon=None: params)


def _host(tree):
    return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), tree)


class Runs:
    """Trainer runs shared by the tests of this module, each made once."""

    def __init__(self, tmp_path_factory):
        self.tmp, self.cache = tmp_path_factory, {}
        # One persistent compilation cache for the module: runs differ in few programs.
        self.shared = []
        if "compile_cache_dir" in {f.name for f in dataclasses.fields(TrainConfig)}:
            self.shared = ["train.compile_cache_dir=" + str(tmp_path_factory.mktemp("compile_cache"))]

    def trainer(self, *extra):
        return dysejax.Trainer(_config(*self.shared, *extra), workdir=str(self.tmp.mktemp("run")),
                               verbose=False)

    def get(self, *extra, steps=SHORT):
        key = (extra, steps)
        if key not in self.cache:
            trainer = self.trainer(*extra)
            self.cache[key] = (trainer, trainer.fit(steps=steps))
        return self.cache[key]

    def s1_dp(self):
        """The s = 1 dp run, paused after steps 1 and 2 to keep those states (resume is exact)."""
        if "s1_dp" not in self.cache:
            trainer = self.trainer(S1)
            rows = trainer.fit(steps=1)
            state1 = _host(trainer.state)
            rows += trainer.fit(steps=2)
            state2 = _host(trainer.state)
            rows += trainer.fit(steps=STEPS)
            self.cache["s1_dp"] = (trainer, rows, state1, state2)
        return self.cache["s1_dp"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory)


# ---------------------------------------------------------------------------------------------
# (1) s = 0 is the plain optimizer


def test_s0_is_the_default_and_bit_identical_to_the_plain_optimizer(runs, monkeypatch):
    assert _config().optimizer == _config("optimizer.weight_prediction_steps=0").optimizer
    _, s0 = runs.get("optimizer.weight_prediction_steps=0", steps=STEPS)
    _bypass_prediction(monkeypatch)
    plain = runs.trainer().fit(steps=STEPS)
    assert _losses(s0).tolist() == _losses(plain).tolist()
    assert [r["grad_norm"] for r in s0] == [r["grad_norm"] for r in plain]


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_s0_train_step_traces_to_the_plain_step(runs, monkeypatch, name):
    # The whole train step (grad accumulation included), not just predict_params.
    trainer = runs.trainer(f"optimizer.name={name}", "train.grad_accum=2")
    plan = _plan(trainer)
    batch = abstract_batch(trainer.data.batch_size(BUCKET), BUCKET, batch_sharding(plan, trainer.mesh))

    def jaxpr():
        step = make_train_step(trainer.model, trainer.optimizer, plan, trainer.mesh, grad_accum=2)
        return str(jax.make_jaxpr(step)(trainer.state_layout.abstract, batch))

    with_prediction_code = jaxpr()
    _bypass_prediction(monkeypatch)
    assert with_prediction_code == jaxpr()


# ---------------------------------------------------------------------------------------------
# (2) s = 1: the loss and gradients are taken at θ̂, the update is applied to θ


def test_s1_changes_losses_after_step_one_and_trains(runs):
    _, s0 = runs.get("optimizer.weight_prediction_steps=0", steps=STEPS)
    _, s1, _, _ = runs.s1_dp()
    a, b = _losses(s0), _losses(s1)
    print(f"\nlosses s=0: {np.round(a, 4).tolist()}\nlosses s=1: {np.round(b, 4).tolist()}")
    assert [r["step"] for r in s1] == list(range(1, STEPS + 1))
    assert a[0] == b[0]  # Δ = 0 at step 0: θ̂ = θ exactly
    assert np.all(np.abs(a[1:] - b[1:]) > 1e-4), (a, b)
    assert b[-2:].mean() < b[:2].mean() - 0.5, b


def _find(opt_state, state_type):
    is_match = lambda x: isinstance(x, state_type)  # noqa: E731
    (found,) = [x for x in jax.tree.leaves(opt_state, is_leaf=is_match) if is_match(x)]
    return found


def test_s1_loss_and_update_are_at_hand_computed_prediction(runs):
    trainer, rows, state1, state2 = runs.s1_dp()
    cfg = trainer.config.optimizer
    assert cfg.name == "adamw" and int(state1["step"]) == 1
    # θ̂_1 = θ_1 − lr(1)·m̂/(√v̂ + ε), bias-corrected with count 1, in float64.
    adam = _find(state1["opt_state"], optax.ScaleByAdamState)
    assert int(adam.count) == 1
    lr1 = PEAK_LR * 1 / WARMUP  # linear warmup from 0
    t = 1

    def predict(p, m, v):
        m_hat = m.astype(np.float64) / (1 - cfg.b1 ** t)
        v_hat = v.astype(np.float64) / (1 - cfg.b2 ** t)
        return (p - lr1 * m_hat / (np.sqrt(v_hat) + cfg.eps)).astype(p.dtype)

    theta1 = state1["params"]
    theta_hat = jax.tree.map(predict, theta1, adam.mu, adam.nu)
    moved = max(float(np.max(np.abs(h - p))) for h, p in zip(jax.tree.leaves(theta_hat), jax.tree.leaves(theta1)))
    assert 0.5 * lr1 < moved <= 1.01 * lr1  # after one Adam step |Δ| ≈ 1 where the gradient is not tiny

    # Step 2's batch (the iterator is a pure function of the seed) and its loss/grads at θ̂.
    it = trainer.data.train_iterator()
    it.next_plan()
    plan_b = it.next_plan()
    plan = _plan(trainer, plan_b.bucket)
    sharding = batch_sharding(plan, trainer.mesh)
    batch = {k: jax.device_put(v, sharding) for k, v in trainer.data.materialize(plan_b).as_dict().items()
             if k in dysejax.step.BATCH_KEYS}
    shardings = trainer.state_layout.shardings
    grad_fn = jax.jit(jax.value_and_grad(lambda p, b: loss_sums(trainer.model, plan, trainer.mesh, p, b),
                                         has_aux=True))
    (loss_sum, count), grads = grad_fn(jax.device_put(theta_hat, shardings["params"]), batch)
    np.testing.assert_allclose(rows[1]["loss"], float(loss_sum / count), rtol=1e-6)
    (loss_at_theta, count_t), _ = grad_fn(jax.device_put(theta1, shardings["params"]), batch)
    assert abs(rows[1]["loss"] - float(loss_at_theta / count_t)) > 1e-3  # the two are far apart

    # θ_2 = θ_1 + plain update(g(θ̂_1), state_1, θ_1): applied to θ, not to θ̂.
    grads = jax.tree.map(lambda g: g / count, grads)
    opt_state1 = jax.device_put(state1["opt_state"], shardings["opt_state"])
    updates, _ = trainer.optimizer.tx.update(grads, opt_state1, jax.device_put(theta1, shardings["params"]))
    want = _host(optax.apply_updates(jax.device_put(theta1, shardings["params"]), updates))
    on_hat = _host(optax.apply_updates(jax.device_put(theta_hat, shardings["params"]), updates))
    for got, w, wrong in zip(jax.tree.leaves(state2["params"]), jax.tree.leaves(want), jax.tree.leaves(on_hat)):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-7)
    assert max(float(np.max(np.abs(g - w))) for g, w in zip(
        jax.tree.leaves(state2["params"]), jax.tree.leaves(on_hat))) > 0.5 * lr1


# ---------------------------------------------------------------------------------------------
# (3) plans and gradient accumulation


VARIANTS = {"fsdp": ("parallel.plan=fsdp",), "tp": ("parallel.plan=tp",), "accum2": ("train.grad_accum=2",)}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_s1_every_plan_and_grad_accum_match_dp(runs, variant):
    trainer, rows = runs.get(S1, *VARIANTS[variant])
    ref_trainer, ref, _, _ = runs.s1_dp()
    assert trainer.data.batch_sizes == ref_trainer.data.batch_sizes
    if variant in ("fsdp", "tp"):
        assert {r["plan"] for r in rows} == {variant}
    np.testing.assert_allclose(_losses(rows), _losses(ref[:SHORT]), rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# (4) memory and collectives of the compiled step, (5) shardings


def _param_bytes_per_device(trainer) -> int:
    """Bytes of one device's shards of all parameters, in the storage layout."""
    return sum(math.prod(a.sharding.shard_shape(a.shape)) * a.dtype.itemsize
               for a in jax.tree.leaves(trainer.state_layout.abstract["params"]))


def _collectives(program) -> Counter:
    ops = re.findall(r"= \S+ (all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)"
                     r"(?:-start)?\(", program.compiled.as_text())
    return Counter(ops)


def _train_program(trainer):
    return trainer.programs.get("train", BUCKET, trainer.data.batch_size(BUCKET), _plan(trainer))


@pytest.mark.parametrize("variant", ["dp"] + list(VARIANTS))
def test_s1_costs_at_most_one_parameter_buffer(runs, variant):
    extra = VARIANTS.get(variant, ())
    with_s1 = runs.s1_dp()[0] if variant == "dp" else runs.get(S1, *extra)[0]
    without = runs.get("optimizer.weight_prediction_steps=0", steps=STEPS)[0] if variant == "dp" \
        else runs.trainer(*extra)
    p1, p0 = _train_program(with_s1), _train_program(without)
    param_bytes = _param_bytes_per_device(with_s1)
    assert param_bytes == _param_bytes_per_device(without)
    extra_bytes = p1.bytes_per_device - p0.bytes_per_device
    print(f"\n{variant}: train step bytes/device s=0 {p0.bytes_per_device}, s=1 {p1.bytes_per_device} "
          f"(+{extra_bytes}); parameters {param_bytes} bytes/device; s=0 {p0.memory}, s=1 {p1.memory}")
    assert extra_bytes <= param_bytes
    # θ̂ is formed in the parameters' layout: no moment is gathered, no collective is added (XLA
    # may combine the gathers differently: at most as many, moving at most as many bytes).
    c1, c0 = _collectives(p1), _collectives(p0)
    assert all(c1[k] <= c0[k] for k in c1), (c1, c0)
    b1, b0 = collective_bytes(p1.compiled.as_text()), collective_bytes(p0.compiled.as_text())
    assert sum(b1.values()) <= sum(b0.values()), (b1, b0)


@pytest.mark.parametrize("variant", ["dp"] + list(VARIANTS))
def test_s1_keeps_state_shardings(runs, variant):
    trainer = runs.s1_dp()[0] if variant == "dp" else runs.get(S1, *VARIANTS[variant])[0]
    want = trainer.state_layout.shardings
    for part in ("params", "opt_state"):
        got, expected = jax.tree.leaves(trainer.state[part]), jax.tree.leaves(want[part])
        assert len(got) == len(expected)
        for x, s in zip(got, expected):
            assert x.sharding.is_equivalent_to(s, x.ndim), (part, x.shape, x.sharding, s)
    sharded = [x for x in jax.tree.leaves(trainer.state["params"]) if not x.sharding.is_fully_replicated]
    assert sharded  # the storage layout really splits the parameters
