"""XGrad (weight prediction, arXiv 2305.18240): each optimizer with s = 0 and s = 1.

(a) The tiny GPT on the built-in corpus (tiny.yaml with the tests' FAST-like settings: 2 layers,
    d_model 64, buckets 64/128, 1024 tokens per batch, the whole corpus), trained through
    `dysejax.Trainer` with the `dp` plan over 8 simulated CPU devices.
(b) scikit-learn's bundled digits (8x8 images, 1797 samples, no download): a 64-128-128-10 MLP
    in flax, trained with the same `dysejax.optim` optimizers and `predict_params`.

For every optimizer, s in {0, 1} and each seed: final train loss, held-out loss (and accuracy
for digits); s = 0 and s = 1 share a seed's data order and initial weights, so the difference
s1 − s0 is paired by seed (mean ± std, and a paired t-test). Overheads: XLA's per-device bytes
of the compiled train step (s = 0 vs s = 1, next to the per-device parameter bytes), and the
step-time ratio s1/s0 from alternating timed calls of the two compiled steps (fastest round).

    python benchmarks/xgrad.py [--quick] [--json OUT] [--seeds 3] [--gpt-steps 300]
                               [--digits-steps 400] [--optimizers adamw,sgdm] [--skip-gpt | --skip-digits]

Needs scikit-learn for (b) (`pip install scikit-learn`). Times are wall-clock on the simulated
devices sharing the host's cores: only ratios measured in one run mean something.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

OPTIMIZERS = ["sgdm", "adam", "adamw", "adabelief", "adam3"]
# Learning rates: tiny.yaml's 3e-3 for the Adam family; SGD with momentum needs a larger one.
GPT_LR = {"sgdm": 0.3, "adam": 3e-3, "adamw": 3e-3, "adabelief": 3e-3, "adam3": 3e-3}
DIGITS_LR = {"sgdm": 0.05, "adam": 1e-3, "adamw": 1e-3, "adabelief": 1e-3, "adam3": 1e-3}
GPT_SETTINGS = ["data.buckets=[64,128]", "data.tokens_per_batch=1024", "model.d_model=64", "model.d_ff=128",
                "data.eval_batches=8", "train.progress=false"]
CONTROL_OPTIMIZERS = ["adamw"]  # also run with s = 0 and twice the lr
TIMED_BUCKET = 128  # the GPT train program whose bytes and time are reported
T_CRIT_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


# ---------------------------------------------------------------------------------------------
# statistics


def mean_std(xs) -> tuple[float, float]:
    xs = [float(x) for x in xs]
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else float("nan")
    return m, sd


def paired(a, b, lower_is_better: bool = True) -> dict:
    """b − a per seed: mean, std, t statistic and a verdict at the two-sided 5% level."""
    d = [float(y) - float(x) for x, y in zip(a, b)]
    m, sd = mean_std(d)
    n = len(d)
    t = m / (sd / math.sqrt(n)) if n > 1 and sd > 0 else float("nan")
    crit = T_CRIT_975.get(n - 1, 2.0)
    if not math.isfinite(t) or abs(t) < crit:
        verdict = "no sig. difference"
    else:
        verdict = "s=1 better" if (m < 0) == lower_is_better else "s=1 worse"
    return {"mean": m, "std": sd, "t": t, "n": n, "verdict": verdict}


def fmt(m: float, sd: float, digits: int = 4) -> str:
    return f"{m:.{digits}f} ± {sd:.{digits}f}" if math.isfinite(sd) else f"{m:.{digits}f}"


def fmt_diff(p: dict, digits: int = 4) -> str:
    mark = {"s=1 better": " (better)", "s=1 worse": " (worse)"}.get(p["verdict"], "")
    return f"{p['mean']:+.{digits}f} ± {p['std']:.{digits}f}{mark}" if math.isfinite(p["std"]) \
        else f"{p['mean']:+.{digits}f}"


def alternate_timing(calls: dict, rounds: int, per_round: int) -> dict:
    """Seconds per call of each zero-argument callable (run to completion), timed alternately.

    The fastest round counts: on a shared machine the other rounds measure the neighbours too.
    """
    samples = {k: [] for k in calls}
    for fn in calls.values():  # warm
        fn()
    for _ in range(rounds):
        for k, fn in calls.items():
            t0 = time.perf_counter()
            for _ in range(per_round):
                fn()
            samples[k].append((time.perf_counter() - t0) / per_round)
    return {k: min(v) for k, v in samples.items()}


# ---------------------------------------------------------------------------------------------
# (a) the tiny GPT through dysejax.Trainer


def gpt_overrides(name: str, s: int, seed: int, steps: int, cache: str, extra=(), lr_scale: float = 1.0) -> list[str]:
    return GPT_SETTINGS + [
        f"optimizer.name={name}", f"optimizer.lr={GPT_LR[name] * lr_scale}", f"optimizer.weight_prediction_steps={s}",
        f"optimizer.warmup_steps={max(1, steps // 20)}", f"train.seed={seed}", f"train.steps={steps}",
        f"train.eval_every={steps}", f"train.checkpoint_every={steps}", f"train.compile_cache_dir={cache}",
        *extra]


def param_bytes_per_device(trainer) -> int:
    """One device's shards of all parameters in the storage layout."""
    import jax
    return sum(math.prod(a.sharding.shard_shape(a.shape)) * a.dtype.itemsize
               for a in jax.tree.leaves(trainer.state_layout.abstract["params"]))


def first_plan(trainer, bucket: int):
    return trainer.planner.candidates(bucket)[0]


def train_program(trainer, bucket: int = TIMED_BUCKET):
    return trainer.programs.get("train", bucket, trainer.data.batch_size(bucket), first_plan(trainer, bucket))


def run_gpt(names, seeds, steps, workroot, log) -> dict:
    import jax

    import dysejax
    from dysejax.trainer import Trainer

    tiny = os.path.join(ROOT, "configs", "tiny.yaml")
    cache = os.path.join(workroot, "compile_cache")
    runs, keep = [], {}

    def one(name, s, seed, lr_scale=1.0):
        cfg = dysejax.load_config(tiny, gpt_overrides(name, s, seed, steps, cache, lr_scale=lr_scale))
        t0 = time.perf_counter()
        trainer = Trainer(cfg, workdir=os.path.join(workroot, f"gpt-{name}-s{s}-lr{lr_scale:g}-seed{seed}"),
                          verbose=False)
        rows = trainer.fit()
        wall = time.perf_counter() - t0
        losses = [r["loss"] for r in rows]
        tail = max(1, steps // 10)
        run = {"task": "gpt", "optimizer": name, "s": s, "seed": seed, "steps": steps, "lr": cfg.optimizer.lr,
               "lr_scale": lr_scale, "train_loss": sum(losses[-tail:]) / tail, "train_loss_window": tail,
               "eval_loss": rows[-1]["eval_loss"], "first_loss": losses[0], "losses": losses,
               "median_step_s": sorted(r["step_time_s"] for r in rows)[len(rows) // 2], "wall_s": wall}
        log(f"  gpt {name:9s} s={s} lr={cfg.optimizer.lr:g} seed={seed}: train {run['train_loss']:.4f} "
            f"eval {run['eval_loss']:.4f} ({wall:.1f} s)")
        return trainer, run

    for name in names:
        for seed in seeds:
            for s in (0, 1):
                trainer, run = one(name, s, seed)
                runs.append(run)
                if seed == seeds[0]:
                    keep[(name, s)] = trainer
    # Control: is s = 1 more than a larger step? The plain optimizer with twice the lr.
    controls = {}
    for name in [n for n in CONTROL_OPTIMIZERS if n in names]:
        ctl = [one(name, 0, seed, lr_scale=2.0)[1] for seed in seeds]
        base = {s: [r for r in runs if r["optimizer"] == name and r["s"] == s] for s in (0, 1)}
        controls[name] = {"lr": ctl[0]["lr"], "runs": ctl, **{
            metric: {"value": mean_std([r[metric] for r in ctl]),
                     "vs_s0": paired([r[metric] for r in base[0]], [r[metric] for r in ctl]),
                     "s1_vs_control": paired([r[metric] for r in ctl], [r[metric] for r in base[1]])}
            for metric in ("train_loss", "eval_loss")}}

    memory, timing = {}, {}
    for name in names:
        pair = {s: keep[(name, s)] for s in (0, 1)}
        programs = {s: train_program(t) for s, t in pair.items()}
        memory[name] = {"bucket": TIMED_BUCKET, "param_bytes_per_device": param_bytes_per_device(pair[0]),
                        **{f"s{s}": {"bytes_per_device": p.bytes_per_device, **p.memory} for s, p in programs.items()}}
        memory[name]["extra_bytes"] = programs[1].bytes_per_device - programs[0].bytes_per_device
        timing[name] = gpt_step_timing(pair, programs)
        log(f"  gpt {name:9s} bytes/device s=0 {programs[0].bytes_per_device} s=1 {programs[1].bytes_per_device} "
            f"(+{memory[name]['extra_bytes']}, params {memory[name]['param_bytes_per_device']}); "
            f"step time s1/s0 {timing[name]['ratio']:.3f}")
    first = keep[(names[0], 0)]
    info = {"model_params": int(sum(x.size for x in jax.tree.leaves(first.state_layout.abstract["params"]))),
            "devices": first.n_devices, "plan": first_plan(first, TIMED_BUCKET).id, "data": first.data.summary(),
            "overrides": GPT_SETTINGS, "lr": {n: GPT_LR[n] for n in names}}
    return {"info": info, "runs": runs, "memory": memory, "timing": timing, "controls": controls,
            "summary": summarize(runs, names, ["train_loss", "eval_loss"])}


def gpt_step_timing(pair: dict, programs: dict, rounds: int = 15, per_round: int = 5) -> dict:
    """Seconds per call of the s=0 and s=1 train programs on one batch, alternating."""
    import jax

    trainer = pair[0]
    it = trainer.data.train_iterator()
    plan_b = it.next_plan()
    while plan_b.bucket != TIMED_BUCKET:
        plan_b = it.next_plan()
    states = {s: t.state for s, t in pair.items()}
    batches = {s: t.load_batch(plan_b, programs[s].plan) for s, t in pair.items()}

    def call(s):
        def go():
            states[s], out = programs[s](states[s], batches[s])  # the state is donated: keep the new one
            jax.block_until_ready(out)
        return go
    secs = alternate_timing({s: call(s) for s in pair}, rounds, per_round)
    return {"s0_s": secs[0], "s1_s": secs[1], "ratio": secs[1] / secs[0]}


def gpt_plan_memory(plans, steps, workroot, log) -> list[dict]:
    """AdamW's train-step bytes per device with s = 0 and s = 1 under each plan (compile only)."""
    import dysejax
    from dysejax.trainer import Trainer

    tiny = os.path.join(ROOT, "configs", "tiny.yaml")
    cache = os.path.join(workroot, "compile_cache")
    out = []
    for label, extra in plans:
        row = {"plan": label}
        for s in (0, 1):
            cfg = dysejax.load_config(tiny, gpt_overrides("adamw", s, 0, steps, cache, extra))
            trainer = Trainer(cfg, workdir=os.path.join(workroot, f"plan-{label}-s{s}"), verbose=False)
            program = train_program(trainer)
            row[f"s{s}"] = program.bytes_per_device
            row["param_bytes_per_device"] = param_bytes_per_device(trainer)
        row["extra_bytes"] = row["s1"] - row["s0"]
        out.append(row)
        log(f"  plan {label:12s} bytes/device s=0 {row['s0']} s=1 {row['s1']} (+{row['extra_bytes']}, "
            f"params {row['param_bytes_per_device']})")
    return out


# ---------------------------------------------------------------------------------------------
# (b) digits MLP with the same optimizers and predict_params


def digits_data():
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    xtr, xte, ytr, yte = train_test_split(x, y.astype(np.int32), test_size=0.3, stratify=y, random_state=0)
    return xtr, ytr, xte, yte


def run_digits(names, seeds, steps, batch_size, log) -> dict:
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from dysejax.config import OptimizerConfig
    from dysejax.optim import build_optimizer, predict_params

    xtr, ytr, xte, yte = digits_data()

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            for _ in range(2):
                x = nn.relu(nn.Dense(128)(x))
            return nn.Dense(10)(x)

    model = MLP()

    def loss_fn(params, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(model.apply({"params": params}, x), y).mean()

    def make_step(opt):
        def step(params, opt_state, k, x, y):
            params_hat = predict_params(opt, params, opt_state, k)  # θ̂; `params` itself when s = 0
            loss, grads = jax.value_and_grad(loss_fn)(params_hat, x, y)
            updates, opt_state = opt.tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss
        return step

    def make_train(opt):
        step = make_step(opt)
        x_all, y_all = jnp.asarray(xtr), jnp.asarray(ytr)

        def body(carry, idx):
            params, opt_state, k = carry
            params, opt_state, loss = step(params, opt_state, k, x_all[idx], y_all[idx])
            return (params, opt_state, k + 1), loss

        def train(params, order):
            (params, _, _), losses = jax.lax.scan(body, (params, opt.init(params), jnp.zeros((), jnp.int32)), order)
            return params, losses
        return jax.jit(train)

    @jax.jit
    def evaluate(params, x, y):
        logits = model.apply({"params": params}, x)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        return loss, jnp.mean(jnp.argmax(logits, -1) == y)

    def order_for(seed):
        rng, n = np.random.default_rng(seed), len(xtr)
        per_epoch = n // batch_size
        epochs = [rng.permutation(n)[:per_epoch * batch_size].reshape(per_epoch, batch_size)
                  for _ in range(-(-steps // per_epoch))]
        return np.concatenate(epochs)[:steps].astype(np.int32)

    def opt_for(name, s):
        cfg = OptimizerConfig(name=name, lr=DIGITS_LR[name], warmup_steps=max(1, steps // 20),
                              weight_prediction_steps=s)
        return build_optimizer(cfg, steps)

    runs, memory, timing = [], {}, {}
    init = lambda seed: model.init(jax.random.key(seed), jnp.zeros((1, xtr.shape[1])))["params"]  # noqa: E731
    for name in names:
        trains = {s: make_train(opt_for(name, s)) for s in (0, 1)}
        orders = {seed: jnp.asarray(order_for(seed)) for seed in seeds}
        for seed in seeds:
            for s in (0, 1):
                params = init(seed)
                jax.block_until_ready(trains[s](params, orders[seed]))  # compile (once) and warm
                t0 = time.perf_counter()
                params, losses = jax.block_until_ready(trains[s](params, orders[seed]))
                wall = time.perf_counter() - t0
                tr_loss, tr_acc = evaluate(params, xtr, ytr)
                te_loss, te_acc = evaluate(params, xte, yte)
                run = {"task": "digits", "optimizer": name, "s": s, "seed": seed, "steps": steps,
                       "train_loss": float(tr_loss), "train_acc": float(tr_acc), "eval_loss": float(te_loss),
                       "eval_acc": float(te_acc), "wall_s": wall, "last_batch_loss": float(losses[-1])}
                runs.append(run)
                log(f"  digits {name:9s} s={s} seed={seed}: train {run['train_loss']:.4f} test {run['eval_loss']:.4f} "
                    f"acc {run['eval_acc']:.4f}")
        # Memory of one compiled step, and its time (alternating calls).
        params = init(seeds[0])
        x, y = jnp.asarray(xtr[:batch_size]), jnp.asarray(ytr[:batch_size])
        steps_c, figures, calls = {}, {}, {}
        for s in (0, 1):
            opt = opt_for(name, s)
            fn = jax.jit(make_step(opt), donate_argnums=(0, 1))
            compiled = fn.lower(params, opt.init(params), jnp.int32(5), x, y).compile()
            m = compiled.memory_analysis()
            figures[s] = {"argument": int(m.argument_size_in_bytes), "output": int(m.output_size_in_bytes),
                          "temp": int(m.temp_size_in_bytes), "alias": int(m.alias_size_in_bytes)}
            figures[s]["bytes_per_device"] = (figures[s]["argument"] + figures[s]["output"] + figures[s]["temp"]
                                              - figures[s]["alias"])
            steps_c[s] = [compiled, jax.tree.map(jnp.copy, params), opt.init(params)]

            def go(s=s):
                c = steps_c[s]
                c[1], c[2], loss = c[0](c[1], c[2], jnp.int32(5), x, y)
                jax.block_until_ready(loss)
            calls[s] = go
        secs = alternate_timing(calls, rounds=15, per_round=50)
        pbytes = sum(p.size * p.dtype.itemsize for p in jax.tree.leaves(params))
        memory[name] = {"param_bytes_per_device": int(pbytes), "s0": figures[0], "s1": figures[1],
                        "extra_bytes": figures[1]["bytes_per_device"] - figures[0]["bytes_per_device"]}
        timing[name] = {"s0_s": secs[0], "s1_s": secs[1], "ratio": secs[1] / secs[0]}
    info = {"data": f"sklearn load_digits: {len(xtr)} train / {len(xte)} test (stratified, random_state=0)",
            "model": "MLP 64-128-128-10 (relu)", "batch_size": batch_size, "steps": steps,
            "lr": {n: DIGITS_LR[n] for n in names}}
    return {"info": info, "runs": runs, "memory": memory, "timing": timing,
            "summary": summarize(runs, names, ["train_loss", "eval_loss", "eval_acc"])}


# ---------------------------------------------------------------------------------------------
# tables


def summarize(runs, names, metrics) -> dict:
    out = {}
    for name in names:
        by_s = {s: sorted((r for r in runs if r["optimizer"] == name and r["s"] == s), key=lambda r: r["seed"])
                for s in (0, 1)}
        entry = {}
        for metric in metrics:
            vals = {s: [r[metric] for r in by_s[s]] for s in (0, 1)}
            entry[metric] = {"s0": mean_std(vals[0]), "s1": mean_std(vals[1]),
                             "diff": paired(vals[0], vals[1], lower_is_better=not metric.endswith("acc"))}
        out[name] = entry
    return out


def gpt_table(res: dict) -> str:
    lines = ["| optimizer (lr) | train loss s=0 | train loss s=1 | eval loss s=0 | eval loss s=1 | "
             "Δ eval loss (s1−s0, paired) | bytes/device s=0 → s=1 (params) | step time s1/s0 |",
             "|---|---|---|---|---|---|---|---|"]
    for name, e in res["summary"].items():
        m, t = res["memory"][name], res["timing"][name]
        lines.append(
            f"| {name} ({GPT_LR[name]:g}) | {fmt(*e['train_loss']['s0'])} | {fmt(*e['train_loss']['s1'])} | "
            f"{fmt(*e['eval_loss']['s0'])} | {fmt(*e['eval_loss']['s1'])} | {fmt_diff(e['eval_loss']['diff'])} | "
            f"{m['s0']['bytes_per_device']:,} → {m['s1']['bytes_per_device']:,} (+{m['extra_bytes']:,}; "
            f"{m['param_bytes_per_device']:,}) | {t['ratio']:.3f} |")
    return "\n".join(lines)


def digits_table(res: dict) -> str:
    lines = ["| optimizer (lr) | train loss s=0 | train loss s=1 | test loss s=0 | test loss s=1 | "
             "test acc s=0 | test acc s=1 | Δ test acc (s1−s0, paired) | bytes s=0 → s=1 (params) | step time s1/s0 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, e in res["summary"].items():
        m, t = res["memory"][name], res["timing"][name]
        lines.append(
            f"| {name} ({DIGITS_LR[name]:g}) | {fmt(*e['train_loss']['s0'])} | {fmt(*e['train_loss']['s1'])} | "
            f"{fmt(*e['eval_loss']['s0'])} | {fmt(*e['eval_loss']['s1'])} | {fmt(*e['eval_acc']['s0'])} | "
            f"{fmt(*e['eval_acc']['s1'])} | {fmt_diff(e['eval_acc']['diff'])} | "
            f"{m['s0']['bytes_per_device']:,} → {m['s1']['bytes_per_device']:,} (+{m['extra_bytes']:,}; "
            f"{m['param_bytes_per_device']:,}) | {t['ratio']:.3f} |")
    return "\n".join(lines)


def control_table(res: dict) -> str:
    lines = ["| run | train loss | eval loss | Δ eval vs s=0 | Δ eval of s=1 vs this |", "|---|---|---|---|---|"]
    for name, c in res["controls"].items():
        e = res["summary"][name]
        lines.append(f"| {name} s=0 lr {GPT_LR[name]:g} | {fmt(*e['train_loss']['s0'])} | {fmt(*e['eval_loss']['s0'])} "
                     f"| | {fmt_diff(e['eval_loss']['diff'])} |")
        lines.append(f"| {name} s=1 lr {GPT_LR[name]:g} | {fmt(*e['train_loss']['s1'])} | {fmt(*e['eval_loss']['s1'])} "
                     f"| {fmt_diff(e['eval_loss']['diff'])} | |")
        lines.append(f"| {name} s=0 lr {c['lr']:g} (2x) | {fmt(*c['train_loss']['value'])} | "
                     f"{fmt(*c['eval_loss']['value'])} | {fmt_diff(c['eval_loss']['vs_s0'])} | "
                     f"{fmt_diff(c['eval_loss']['s1_vs_control'])} |")
    return "\n".join(lines)


def plan_table(rows) -> str:
    lines = ["| plan | bytes/device s=0 | s=1 | extra | parameter bytes/device |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['plan']} | {r['s0']:,} | {r['s1']:,} | +{r['extra_bytes']:,} | "
                     f"{r['param_bytes_per_device']:,} |")
    return "\n".join(lines)


def verdict(results: dict) -> list[str]:
    out = []
    for task, metric in (("gpt", "eval_loss"), ("digits", "eval_loss"), ("digits", "eval_acc")):
        if task not in results:
            continue
        counts = {}
        for name, e in results[task]["summary"].items():
            counts.setdefault(e[metric]["diff"]["verdict"], []).append(name)
        parts = [f"{v}: {', '.join(n)}" for v, n in sorted(counts.items())]
        out.append(f"{task} {metric}: " + "; ".join(parts))
    for name, c in results.get("gpt", {}).get("controls", {}).items():
        p = c["eval_loss"]["s1_vs_control"]
        out.append(f"gpt eval_loss, {name} s=1 vs s=0 with 2x lr: {p['verdict']} ({p['mean']:+.4f} ± {p['std']:.4f})")
    return out


# ---------------------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 2 seeds, few steps")
    p.add_argument("--json", metavar="OUT", help="write all runs and summaries to this JSON file")
    p.add_argument("--seeds", type=int, help="seeds per (optimizer, s) (default 3; --quick 2)")
    p.add_argument("--gpt-steps", type=int, help="tiny-GPT steps per run (default 300; --quick 20)")
    p.add_argument("--digits-steps", type=int, help="digits steps per run (default 400; --quick 60)")
    p.add_argument("--digits-batch", type=int, default=64)
    p.add_argument("--optimizers", default=",".join(OPTIMIZERS), help="comma-separated subset")
    p.add_argument("--skip-gpt", action="store_true")
    p.add_argument("--skip-digits", action="store_true")
    p.add_argument("--workdir", help="keep run directories here (default: a temporary directory)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from dysejax import runtime

    runtime.configure_host_devices(8)  # before JAX starts: the GPT runs on 8 simulated CPU devices
    names = [n.strip() for n in args.optimizers.split(",") if n.strip()]
    unknown = set(names) - set(OPTIMIZERS)
    if unknown:
        raise SystemExit(f"error: unknown optimizer(s) {sorted(unknown)} (known: {', '.join(OPTIMIZERS)})")
    seeds = list(range(args.seeds or (2 if args.quick else 3)))
    gpt_steps = args.gpt_steps or (20 if args.quick else 300)
    digits_steps = args.digits_steps or (60 if args.quick else 400)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    command = "python benchmarks/xgrad.py " + " ".join(sys.argv[1:] if argv is None else argv)

    import jax
    t_start = time.perf_counter()
    results: dict = {"command": command.strip(), "seeds": seeds, "optimizers": names,
                     "host": {"python": platform.python_version(), "jax": jax.__version__,
                              "cpu_count": os.cpu_count(), "backend": jax.default_backend()}}
    with tempfile.TemporaryDirectory() as tmp:
        workroot = os.path.abspath(args.workdir or tmp)
        if not args.skip_gpt:
            log(f"(a) tiny GPT: {len(names)} optimizers x s in (0, 1) x {len(seeds)} seeds, {gpt_steps} steps")
            results["gpt"] = run_gpt(names, seeds, gpt_steps, workroot, log)
            plans = [("dp", ()), ("tp", ("parallel.plan=tp",))] if args.quick else [
                ("dp", ()), ("fsdp", ("parallel.plan=fsdp",)), ("tp", ("parallel.plan=tp",)),
                ("tp_sp", ("parallel.plan=tp_sp",)),
                ("dp, accum 2", ("train.grad_accum=2", "data.tokens_per_batch=2048"))]  # 2 x 8 rows at 128
            log("    adamw train-step memory per plan")
            results["gpt_plans_memory"] = gpt_plan_memory(plans, gpt_steps, workroot, log)
        if not args.skip_digits:
            log(f"(b) digits MLP: {len(names)} optimizers x s in (0, 1) x {len(seeds)} seeds, {digits_steps} steps")
            results["digits"] = run_digits(names, seeds, digits_steps, args.digits_batch, log)
    results["verdict"] = verdict(results)
    results["total_s"] = time.perf_counter() - t_start

    out = [f"XGrad benchmark ({results['command']}; seeds {seeds}; mean ± std over seeds; Δ paired by seed, "
           f"marked better/worse where a paired t-test rejects equality at 5%)", ""]
    if "gpt" in results:
        g = results["gpt"]
        out += [f"(a) tiny GPT, {g['info']['model_params']:,} parameters, {gpt_steps} steps, plan "
                f"{g['info']['plan']} over {g['info']['devices']} devices; train loss = mean of the last "
                f"{g['runs'][0]['train_loss_window']} steps, eval loss on 8 held-out batches; bytes of the "
                f"bucket-{TIMED_BUCKET} train step", "", gpt_table(g), "",
                "Control (is prediction more than a larger step?), paired by seed:", "", control_table(g), "",
                "AdamW train-step bytes per device by plan (bucket 128):", "", plan_table(results["gpt_plans_memory"]), ""]
    if "digits" in results:
        d = results["digits"]
        out += [f"(b) digits: {d['info']['data']}; {d['info']['model']}, batch {d['info']['batch_size']}, "
                f"{digits_steps} steps; train/test loss and accuracy on the full splits at the end", "",
                digits_table(d), ""]
    out += ["Verdict (eval = held-out):"] + [f"- {v}" for v in results["verdict"]]
    out += ["", f"total {results['total_s']:.0f} s"]
    print("\n".join(out))
    if args.json:
        from benchmarks.results_io import write_json
        write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
