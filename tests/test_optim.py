"""dysejax.optim: schedules, the five optimizers, AdaM3, masked decay and XGrad weight prediction.

References are written here in float64 numpy from the update rules, never by calling optax.
"""
import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    # Only takes effect when no other test module has started JAX yet (the conftest does it too).
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from dysejax.config import OptimizerConfig
from dysejax.optim import (adam3, build_optimizer, predict_params, scale_by_adam3,
                           update_direction, weight_decay_mask)

NAMES = ["sgdm", "adam", "adamw", "adabelief", "adam3"]
ADABELIEF_EPS_ROOT = 1e-16  # optax.adabelief's default, which build_optimizer keeps


# ---------------------------------------------------------------------------------------------
# numpy references


@pytest.fixture
def x64():
    """Run the JAX side in float64 for comparisons with the float64 references.

    In float32, 1 - b2**t alone (b2 = 0.999, t = 2) is off by ~1e-5 relative from cancellation,
    in optax as here, so a 1e-6 check against hand-computed values needs float64. (optax's
    schedules still return float32 for an int32 count: the lr carries ~1e-7 relative error.)
    """
    with jax.enable_x64(True):
        yield


def np_lr(k, lr, warmup, total, ratio):
    """Linear warmup 0 -> lr over `warmup` steps, cosine to lr*ratio at `total`."""
    if warmup > 0 and k < warmup:
        return lr * k / warmup
    if warmup >= total:
        return lr
    t = min(k - warmup, total - warmup)
    return lr * (ratio + (1 - ratio) * 0.5 * (1 + math.cos(math.pi * t / (total - warmup))))


class NumpyOptimizer:
    """The five optimizers' recurrences on a dict of float64 arrays, plus XGrad's Δ."""

    def __init__(self, name, cfg, params):
        self.name, self.cfg, self.count = name, cfg, 0
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def _ratio(self, k):
        c = self.cfg
        m_hat = self.m[k] / (1 - c.b1 ** self.count)
        v_hat = self.v[k] / (1 - c.b2 ** self.count)
        return m_hat / (np.sqrt(v_hat) + c.eps)

    def direction(self):
        if self.name == "sgdm":
            return {k: m.copy() for k, m in self.m.items()}
        if self.count == 0:
            return {k: np.zeros_like(m) for k, m in self.m.items()}
        return {k: self._ratio(k) for k in self.m}

    def step(self, grads, params, lr):
        c = self.cfg
        if c.clip_norm is not None:
            norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads.values()))
            if norm >= c.clip_norm:
                grads = {k: g / norm * c.clip_norm for k, g in grads.items()}
        self.count += 1
        out = {}
        for k, g in grads.items():
            if self.name == "sgdm":
                self.m[k] = g + c.momentum * self.m[k]
                out[k] = params[k] - lr * self.m[k]
                continue
            self.m[k] = c.b1 * self.m[k] + (1 - c.b1) * g
            if self.name in ("adam", "adamw"):
                self.v[k] = c.b2 * self.v[k] + (1 - c.b2) * g * g
            elif self.name == "adabelief":
                self.v[k] = c.b2 * self.v[k] + (1 - c.b2) * (g - self.m[k]) ** 2 + ADABELIEF_EPS_ROOT
            else:  # adam3: second moment of the momentum
                self.v[k] = c.b2 * self.v[k] + (1 - c.b2) * self.m[k] ** 2
            u = self._ratio(k)
            if self.name == "adamw" and params[k].ndim >= 2:
                u = u + c.weight_decay * params[k]
            out[k] = params[k] - lr * u
        return out


def quadratic():
    """θ0, a, c of the loss 0.5·Σ a (θ − c)², on a matrix and a vector parameter.

    θ0 starts 2-4 away from c in every coordinate, so over the few small steps of a test no
    gradient changes sign: float32 moments then carry no cancellation and 1e-6 holds per element.
    """
    rng = np.random.default_rng(0)
    shapes = {"w": (3, 4), "b": (4,)}
    c = {k: rng.normal(size=s) for k, s in shapes.items()}
    theta = {k: (c[k] + rng.choice([-1.0, 1.0], size=s) * rng.uniform(2.0, 4.0, size=s)).astype(np.float32)
             for k, s in shapes.items()}
    a = {k: rng.uniform(0.5, 2.0, size=s).astype(np.float32) for k, s in shapes.items()}
    return theta, a, {k: v.astype(np.float32) for k, v in c.items()}


def tree64(tree):
    return {k: np.asarray(v, np.float64) for k, v in tree.items()}


def loss(params, a, c):
    return 0.5 * sum(jnp.sum(a[k] * (params[k] - c[k]) ** 2) for k in params)


def cfg_for(name, **kw):
    base = dict(name=name, lr=0.01, warmup_steps=2, min_lr_ratio=0.1, weight_decay=0.1, b1=0.9,
                b2=0.99, eps=1e-8, momentum=0.9, clip_norm=2.0, weight_prediction_steps=2)
    base.update(kw)
    return OptimizerConfig(**base)


def xgrad_step_fn(opt, a, c):
    """The train step as dysejax/step.py does it, also returning Δ and θ̂."""

    @jax.jit
    def step(params, state, k):
        direction = update_direction(opt, state)
        p_hat = predict_params(opt, params, state, k)
        grads = jax.grad(loss)(p_hat, a, c)
        updates, state = opt.tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, direction, p_hat

    return step


def assert_tree_close(got, want, what):
    """1e-6 relative per element; elements passing near 0 are held to 1e-6 of the leaf's scale."""
    for k in want:
        scale = float(np.max(np.abs(want[k])))
        np.testing.assert_allclose(np.asarray(got[k], np.float64), want[k], rtol=1e-6, atol=1e-6 * scale,
                                   err_msg=f"{what}[{k!r}]")


# ---------------------------------------------------------------------------------------------
# schedule


@pytest.mark.parametrize("warmup,total", [(4, 20), (0, 20), (25, 20), (19, 20)])
def test_schedule_warmup_then_cosine(warmup, total):
    opt = build_optimizer(cfg_for("adamw", lr=1.0, warmup_steps=warmup, min_lr_ratio=0.1), total)
    for k in [0, 1, 2, 3, 4, 5, 10, 12, 19, 20, 26, 40]:
        want = np_lr(k, 1.0, warmup, total, 0.1)
        got = float(opt.schedule(k))
        assert got == pytest.approx(want, rel=1e-6, abs=1e-7), f"warmup={warmup} total={total} step={k}"


def test_schedule_landmarks():
    s = build_optimizer(cfg_for("adam", lr=2.0, warmup_steps=4, min_lr_ratio=0.25), 20).schedule
    assert float(s(0)) == 0.0
    assert float(s(2)) == pytest.approx(1.0)
    assert float(s(4)) == pytest.approx(2.0)
    assert float(s(12)) == pytest.approx(2.0 * (0.25 + 0.75 * 0.5))  # cosine half way
    assert float(s(20)) == pytest.approx(0.5) and float(s(100)) == pytest.approx(0.5)


def test_config_total_steps_overrides_argument():
    opt = build_optimizer(cfg_for("adam", lr=1.0, warmup_steps=0, min_lr_ratio=0.0, total_steps=10), 1000)
    assert float(opt.schedule(10)) == pytest.approx(0.0, abs=1e-7)


# ---------------------------------------------------------------------------------------------
# XGrad: Δ and θ̂ against numpy


@pytest.mark.parametrize("clip_norm", [2.0, None])  # 2.0 clips every step here
@pytest.mark.parametrize("name", NAMES)
def test_xgrad_direction_and_prediction_match_numpy(name, clip_norm, x64):
    theta0, a, c = (tree64(t) for t in quadratic())
    cfg = cfg_for(name, clip_norm=clip_norm)
    total = 10
    opt = build_optimizer(cfg, total)
    step = xgrad_step_fn(opt, a, c)
    params = {k: jnp.asarray(v) for k, v in theta0.items()}
    state = opt.init(params)

    ref_theta = dict(theta0)
    ref = NumpyOptimizer(name, cfg, ref_theta)
    for k in range(6):
        lr = np_lr(k, cfg.lr, cfg.warmup_steps, total, cfg.min_lr_ratio)
        want_dir = ref.direction()
        want_hat = {n: ref_theta[n] - cfg.weight_prediction_steps * lr * want_dir[n] for n in ref_theta}
        grads = {n: a[n] * (want_hat[n] - c[n]) for n in ref_theta}
        ref_theta = ref.step(grads, ref_theta, lr)

        before = params
        params, state, got_dir, got_hat = step(params, state, k)
        assert_tree_close(got_dir, want_dir, f"{name} step {k} Δ")
        assert_tree_close(got_hat, want_hat, f"{name} step {k} θ̂")
        assert_tree_close(params, ref_theta, f"{name} step {k} θ")
        if k >= 1:  # past step 0 (Δ = 0, lr = 0) the prediction moves θ
            for n in before:
                assert np.all(np.asarray(got_hat[n]) != np.asarray(before[n])), f"{name} step {k} {n}"


@pytest.mark.parametrize("name", NAMES)
def test_step_zero_direction_is_zero_and_finite(name):
    theta0, _, _ = quadratic()
    params = {k: jnp.asarray(v) for k, v in theta0.items()}
    for eps in (1e-8, 0.0):  # eps = 0 would give 0/0 at count 0 without the guard
        opt = build_optimizer(cfg_for(name, eps=eps, warmup_steps=0, weight_prediction_steps=3), 10)
        state = opt.init(params)
        direction = jax.jit(lambda st: update_direction(opt, st))(state)
        p_hat = jax.jit(lambda p, st: predict_params(opt, p, st, 0))(params, state)
        for k in params:
            assert np.all(np.asarray(direction[k]) == 0.0), f"{name} eps={eps} Δ[{k}] at step 0"
            np.testing.assert_array_equal(np.asarray(p_hat[k]), theta0[k])


def test_direction_found_wherever_the_chain_puts_it():
    theta0, a, c = quadratic()
    opt = build_optimizer(cfg_for("adam"), 10)
    wrapped = dataclasses.replace(
        opt, tx=optax.chain(optax.scale(1.0), optax.masked(optax.scale(1.0), weight_decay_mask), opt.tx))
    params = {k: jnp.asarray(v) for k, v in theta0.items()}
    s1, s2 = opt.init(params), wrapped.init(params)
    g = jax.grad(loss)(params, a, c)
    for _ in range(3):
        _, s1 = jax.jit(opt.update)(g, s1, params)
        _, s2 = jax.jit(wrapped.update)(g, s2, params)
    d1 = jax.jit(lambda st: update_direction(opt, st))(s1)
    d2 = jax.jit(lambda st: update_direction(wrapped, st))(s2)
    for k in params:
        np.testing.assert_array_equal(np.asarray(d1[k]), np.asarray(d2[k]))
    with pytest.raises(ValueError, match="TraceState"):
        update_direction(dataclasses.replace(opt, name="sgdm"), s1)


# ---------------------------------------------------------------------------------------------
# s = 0 is the plain optimizer, bit for bit


def plain_optax(name, cfg, total):
    sched = optax.warmup_cosine_decay_schedule(0.0, cfg.lr, cfg.warmup_steps, total, cfg.lr * cfg.min_lr_ratio)
    base = {
        "sgdm": lambda: optax.sgd(sched, momentum=cfg.momentum),
        "adam": lambda: optax.adam(sched, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps),
        "adamw": lambda: optax.adamw(sched, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay,
                                     mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)),
        "adabelief": lambda: optax.adabelief(sched, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps),
        "adam3": lambda: adam3(sched, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps),
    }[name]()
    return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), base)


@pytest.mark.parametrize("name", NAMES)
def test_no_prediction_is_bit_identical_to_plain_optimizer(name):
    theta0, a, c = quadratic()
    cfg = cfg_for(name, weight_prediction_steps=0)
    opt = build_optimizer(cfg, 10)
    plain = plain_optax(name, cfg, 10)

    @jax.jit
    def xgrad_step(params, state, k):
        p_hat = predict_params(opt, params, state, k)
        updates, state = opt.tx.update(jax.grad(loss)(p_hat, a, c), state, params)
        return optax.apply_updates(params, updates), state

    @jax.jit
    def plain_step(params, state):
        updates, state = plain.update(jax.grad(loss)(params, a, c), state, params)
        return optax.apply_updates(params, updates), state

    p1 = {k: jnp.asarray(v) for k, v in theta0.items()}
    p2 = {k: jnp.asarray(v) for k, v in theta0.items()}
    s1, s2 = opt.init(p1), plain.init(p2)
    assert predict_params(opt, p1, s1, 0) is p1
    for k in range(6):
        p1, s1 = xgrad_step(p1, s1, k)
        p2, s2 = plain_step(p2, s2)
        for n in p1:
            assert np.array_equal(np.asarray(p1[n]), np.asarray(p2[n])), f"{name} step {k} {n}"


# ---------------------------------------------------------------------------------------------
# AdaM3 itself, and weight decay


@pytest.mark.parametrize("eps_root", [0.0, 1e-3])
def test_adam3_transformation_matches_numpy(eps_root, x64):
    b1, b2, eps = 0.9, 0.999, 1e-8
    rng = np.random.default_rng(1)
    grads = [rng.normal(size=(5, 3)) for _ in range(6)]
    tx = scale_by_adam3(b1, b2, eps, eps_root)
    state = tx.init(jnp.zeros((5, 3), jnp.float64))
    update = jax.jit(tx.update)
    m = v = np.zeros((5, 3))
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * m * m + eps_root
        want = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
        got, state = update(jnp.asarray(g), state)
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-6, err_msg=f"step {t}")
        assert int(state.count) == t


@pytest.mark.parametrize("name", NAMES)
def test_weight_decay_only_on_matrices_of_adamw(name):
    theta0, _, _ = quadratic()
    params = {k: jnp.asarray(v) for k, v in theta0.items()}
    lr, wd = 0.05, 0.1
    opt = build_optimizer(cfg_for(name, lr=lr, warmup_steps=0, min_lr_ratio=1.0, weight_decay=wd,
                                  clip_norm=None), 10)
    zero = {k: jnp.zeros_like(v) for k, v in params.items()}
    updates, _ = opt.update(zero, opt.init(params), params)
    np.testing.assert_array_equal(np.asarray(updates["b"]), 0.0)
    if name == "adamw":
        np.testing.assert_allclose(np.asarray(updates["w"]), -lr * wd * theta0["w"], rtol=1e-6)
    else:
        np.testing.assert_array_equal(np.asarray(updates["w"]), 0.0)
    assert weight_decay_mask(params) == {"w": True, "b": False}


# ---------------------------------------------------------------------------------------------
# sharding


@pytest.mark.parametrize("name", NAMES)
def test_prediction_keeps_parameter_sharding(name):
    n = min(jax.device_count(), 8)
    if n < 2:
        pytest.skip(f"needs >= 2 devices, JAX sees {jax.device_count()}")
    mesh = jax.make_mesh((n,), ("data",), axis_types=(AxisType.Auto,), devices=jax.devices()[:n])
    specs = {"w": P("data", None), "e": P(None, "data"), "b": P("data"), "g": P()}
    shapes = {"w": (2 * n, 6), "e": (6, 4 * n), "b": (3 * n,), "g": (5,)}
    rng = np.random.default_rng(2)
    host = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    target = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    shardings = {k: NamedSharding(mesh, specs[k]) for k in specs}
    params = {k: jax.device_put(host[k], shardings[k]) for k in host}

    opt = build_optimizer(cfg_for(name, weight_prediction_steps=2), 10)
    sq = lambda p: 0.5 * sum(jnp.sum((p[k] - target[k]) ** 2) for k in p)  # noqa: E731

    @jax.jit
    def train(params, state):
        updates, state = opt.tx.update(jax.grad(sq)(params), state, params)
        return optax.apply_updates(params, updates), state

    predict = jax.jit(lambda p, st, k: predict_params(opt, p, st, k))
    state = opt.init(params)
    for _ in range(3):
        params, state = train(params, state)
    p_hat = predict(params, state, 3)

    local = {k: jnp.asarray(np.asarray(v)) for k, v in params.items()}
    local_state = jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), state)
    want = predict_params(opt, local, local_state, 3)
    # The same with the whole state replicated: θ̂ still follows the parameters.
    p_hat_rep = predict(params, jax.device_put(state, NamedSharding(mesh, P())), 3)
    for k in params:
        for got, how in ((p_hat, "state as trained"), (p_hat_rep, "replicated state")):
            assert got[k].sharding.is_equivalent_to(params[k].sharding, got[k].ndim), (
                f"{name}, {how}: θ̂[{k!r}] sharded {got[k].sharding}, params {params[k].sharding}")
            np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=1e-6, atol=1e-7)
        assert not np.array_equal(np.asarray(p_hat[k]), np.asarray(params[k]))


def test_prediction_keeps_dtype_and_jits_with_static_optimizer():
    opt = build_optimizer(cfg_for("adamw", lr=0.5, warmup_steps=0, weight_prediction_steps=1), 10)
    params = {"w": jnp.ones((4, 4), jnp.bfloat16), "b": jnp.ones((4,), jnp.bfloat16)}
    state = opt.init(params)
    _, state = opt.update(jax.tree.map(lambda p: 0.5 * p, params), state, params)
    p_hat = jax.jit(predict_params, static_argnums=0)(opt, params, state, 1)
    for k in params:
        assert p_hat[k].dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(p_hat[k], np.float32), 1 - float(opt.schedule(1)), rtol=1e-2)
