"""Warmup and dispatch overhead of the per-bucket program cache.

1. First vs second warmup of the tiny config with 6 buckets, each in a fresh process sharing
   one fresh persistent compile cache (the second finds every program in the cache). On one
   CPU device: with several, XLA:CPU programs are never loaded from the cache
   (`dysejax.runtime.persistent_cache_refusal`).
2. Host-side dispatch per step (next batch plan, materialise, device_put, program lookup)
   vs the step time at the smallest bucket.
3. dysejax's train step vs a hand-written `jax.jit` train step of the same model, optimizer
   and `dp` sharding, on the same batches, as a time ratio in one run.

    python benchmarks/warmup.py [--steps 30] [--json OUT]

Times are wall-clock on this machine (simulated CPU devices share the host's cores: only the
ratios in one run mean something).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from dysejax.runtime import without_device_count  # noqa: E402  (imports no JAX)
BUCKETS = "[32,64,96,128,192,256]"
OVERRIDES = [f"data.buckets={BUCKETS}", "train.progress=false", "data.eval_batches=0"]


def warmup_seconds(cache: str, workdir: str) -> tuple[float, float]:
    """(warmup seconds as reported, process wall seconds) of one `--warmup-only` process."""
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--config", os.path.join(ROOT, "configs", "tiny.yaml"),
           "--workdir", workdir, "--warmup-only", "--set", *OVERRIDES, f"train.compile_cache_dir={cache}",
           "parallel.cpu_devices=1"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True,
                         env=dict(os.environ, XLA_FLAGS=without_device_count(os.environ.get("XLA_FLAGS", ""))))
    wall = time.perf_counter() - t0
    return float(re.search(r"warmup: \d+ programs in ([\d.]+) s", out.stdout).group(1)), wall


def dispatch_and_step(steps: int) -> dict:
    """Host dispatch vs device step at the smallest bucket, and dysejax vs hand-written jit."""
    import jax
    import optax

    import dysejax
    from dysejax.trainer import Trainer

    smallest = int(BUCKETS.strip("[]").split(",")[0])
    config = dysejax.load_config(os.path.join(ROOT, "configs", "tiny.yaml"),
                                 [f"data.buckets=[{smallest}]", "train.progress=false", "data.eval_batches=0",
                                  "train.compile_cache=false"])
    trainer = Trainer(config, workdir=tempfile.mkdtemp(), verbose=False)
    trainer.warmup()
    state = trainer.state_layout.init(0)
    it = trainer.data.train_iterator()
    batches, host, device = [], [], []
    for _ in range(steps + 3):
        t0 = time.perf_counter()
        plan_b = it.next_plan()
        program = trainer.program_for("train", plan_b.bucket, plan_b.batch_size)
        batch = trainer.load_batch(plan_b, program.plan)
        t1 = time.perf_counter()
        state, out = program(state, batch)
        jax.block_until_ready(out)
        t2 = time.perf_counter()
        batches.append(batch)
        host.append(t1 - t0)
        device.append(t2 - t1)

    # The same step written by hand: model.apply, the same optax chain, jit with the shardings.
    model, tx, plan, mesh = trainer.model, trainer.optimizer.tx, program.plan, trainer.mesh

    def hand_step(state, batch):
        def loss(p):
            total, count = model.apply({"params": p}, batch["inputs"], batch["segment_ids"], batch["positions"],
                                       batch["targets"], batch["loss_mask"], plan=plan, mesh=mesh)
            return total / count
        value, grads = jax.value_and_grad(loss)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        return {"step": state["step"] + 1, "params": optax.apply_updates(state["params"], updates),
                "opt_state": opt_state}, value

    shardings = trainer.state_layout.shardings
    hand = jax.jit(hand_step, in_shardings=(shardings, program.compiled.input_shardings[0][1]),
                   out_shardings=(shardings, None), donate_argnums=0)
    hand_state = trainer.state_layout.init(0)
    ours_state = trainer.state_layout.init(0)
    hand_state, _ = hand(hand_state, batches[0])  # compile outside the timing
    jax.block_until_ready(hand_state)
    hand_t, ours_t = [], []
    for batch in batches[3:]:  # interleave the two so machine noise hits both alike
        t0 = time.perf_counter()
        hand_state, v = hand(hand_state, batch)
        jax.block_until_ready(v)
        t1 = time.perf_counter()
        ours_state, out = program(ours_state, batch)
        jax.block_until_ready(out)
        t2 = time.perf_counter()
        hand_t.append(t1 - t0)
        ours_t.append(t2 - t1)
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {"bucket": smallest, "batch_size": trainer.data.batch_size(smallest),
            "host_dispatch_s": med(host[3:]), "step_s": med(device[3:]),
            "dispatch_fraction": med(host[3:]) / med(device[3:]),
            "dysejax_step_s": med(ours_t), "hand_jit_step_s": med(hand_t),
            "dysejax_over_hand": med(ours_t) / med(hand_t)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        cache = os.path.join(tmp, "cache")
        first, first_wall = warmup_seconds(cache, os.path.join(tmp, "w1"))
        second, second_wall = warmup_seconds(cache, os.path.join(tmp, "w2"))
    result = {"buckets": json.loads(BUCKETS), "first_warmup_s": first, "second_warmup_s": second,
              "warmup_ratio": first / second, "first_process_s": first_wall, "second_process_s": second_wall}
    result.update(dispatch_and_step(args.steps))

    print(f"{'measure':44s} {'value':>10s}")
    rows = [("warmup, 6 buckets, fresh cache (s)", result["first_warmup_s"]),
            ("warmup, same config, warm cache (s)", result["second_warmup_s"]),
            ("first / second warmup", result["warmup_ratio"]),
            (f"host dispatch per step, bucket {result['bucket']} (ms)", 1e3 * result["host_dispatch_s"]),
            (f"step time, bucket {result['bucket']} x {result['batch_size']} (ms)", 1e3 * result["step_s"]),
            ("dispatch / step", result["dispatch_fraction"]),
            ("dysejax step / hand-written jit step", result["dysejax_over_hand"])]
    for name, value in rows:
        print(f"{name:44s} {value:10.3f}")
    if args.json:
        from benchmarks.results_io import write_json
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
