"""dysejax's train step against a plain JAX step of the same model, on one CPU device.

The plain step (`plain_step.py`, written for this benchmark, no dysejax code) is the plainest
correct JAX program of the model: layers under `lax.scan`, causal attention as a block loop
(query block i attends to keys [0, (i+1)·block), segment ids masked), optax clip + adamw.
Before timing a case, one step's loss and gradients of both sides are computed on the same
parameters and batch and asserted equal (relative 1e-5). Then both compiled steps run in
interleaved rounds (the order alternates every round); each side's median and range are
reported, with plain / dysejax (> 1: dysejax faster). The attention kernels alone (forward +
backward of one layer's attention, the model's heads) are timed the same way. A float32
matmul rate is measured in the same run, and each side's achieved model FLOP/s
(`dysejax.flops.train_flops`: no recompute counted, causal attention halved) is given as a
share of it.

    python benchmarks/step_vs_plain.py --json benchmarks/results/step_vs_plain.json
    python benchmarks/step_vs_plain.py --cases small:8x512:none --rounds 3     # one case
    python benchmarks/gpu.py --vs-plain                                         # the same on a GPU

Cases are model:BATCHxLENGTH[:docs]:remat; `docs` > 1 packs that many equal documents into
each row. Models: `small` (configs/dynamic.yaml: d 128, 4 layers, 8 heads, d_ff 384 gated),
`mid` and `wide` (the same with d 256, d_ff 768: heads of 32, and d 512, d_ff 1536: heads of
64); `base` is --config as it is. A case whose step needs more XLA temp memory than --max-gib
is compiled, not run (the plain step keeps every block's probabilities for its backward:
46.7 GiB at 1 x 16,384 without remat).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CONFIG = os.path.join(ROOT, "configs", "dynamic.yaml")
MODELS = {"small": [], "base": [], "mid": ["model.d_model=256", "model.d_ff=768"],
          "wide": ["model.d_model=512", "model.d_ff=1536"]}  # overrides of --config
DEFAULT_CASES = ("small:8x512:none", "small:8x512:selective", "small:1x4096:none", "small:1x4096:selective",
                 "small:1x8192:selective", "small:1x16384:none", "small:1x4096:4:none", "small:1x4096:4:selective",
                 "wide:8x512:none", "wide:8x512:selective", "wide:1x4096:none", "wide:1x4096:selective")
TOL = 1e-5  # float32; pass --tol for a bfloat16 compute dtype


def parse_case(text: str) -> dict:
    parts = text.split(":")
    if len(parts) not in (3, 4) or parts[0] not in MODELS:
        raise SystemExit(f"bad case {text!r}: want model:BATCHxLENGTH[:docs]:remat, model in {list(MODELS)}")
    batch, length = (int(x) for x in parts[1].split("x"))
    docs = int(parts[2]) if len(parts) == 4 else 1
    return {"name": text, "model": parts[0], "batch": batch, "seq": length, "docs": docs, "remat": parts[-1]}


def make_batch(batch: int, seq: int, docs: int, vocab: int, seed: int = 0) -> dict:
    """Rows of `docs` equal documents (segment ids 1..docs, positions restarting per document),
    random tokens; the loss masks each document's last token."""
    import numpy as np
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (batch, seq + 1), dtype=np.int32)
    doc_len = seq // docs
    seg = np.minimum(np.arange(seq) // doc_len, docs - 1).astype(np.int32) + 1
    pos = (np.arange(seq) - (seg - 1) * doc_len).astype(np.int32)
    mask = np.ones(seq, np.float32)
    mask[np.r_[np.flatnonzero(np.diff(seg)), seq - 1]] = 0.0
    rows = lambda a: np.broadcast_to(a, (batch, seq)).copy()  # noqa: E731
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "segment_ids": rows(seg),
            "positions": rows(pos), "loss_mask": rows(mask)}


def relative_error(a, b) -> float:
    import numpy as np
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def timed(fn, *args):
    import jax
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t


def interleaved(runners: dict, rounds: int) -> dict:
    """{name: [seconds per round]}: each runner once per round, the order reversed every round."""
    names, times = list(runners), {n: [] for n in runners}
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            times[n].append(runners[n]())
    return times


def summary(ts) -> dict:
    import numpy as np
    return {"median_s": float(np.median(ts)), "min_s": float(min(ts)), "max_s": float(max(ts)), "samples": list(ts)}


def matmul_rate(rounds: int) -> dict:
    """float32 FLOP/s of a 1024^3 matmul on this device (median of `rounds` x 8 products)."""
    from dysejax.flops import matmul_rate as measure
    return measure(rounds=rounds)


def run_case(case: dict, rounds: int, workdir: str, max_gib: float, config_path: str = CONFIG, extra=(),
             tol: float = TOL) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import dysejax
    from benchmarks import plain_step
    from dysejax.batches import batch_sharding
    from dysejax.build import build
    from dysejax.flops import train_flops_split
    from dysejax.model.transformer import block_spec
    from dysejax.step import loss_sums
    from sharding.ops.blocks import local_attention
    from sharding.plan import Plan, Run

    overrides = MODELS[case["model"]] + [
        "parallel.plan=dp", "parallel.mesh={data: 1}", "parallel.cpu_devices=1", "parallel.profile_time=false",
        "parallel.memory_budget_gb=null", "data.source=synthetic", f"data.buckets=[{case['seq']}]",
        f"data.tokens_per_batch={case['batch'] * case['seq']}", "data.eval_batches=0", "data.synthetic.num_docs=8",
        f"model.remat={case['remat']}", "train.progress=false", "train.compile_cache=false", "optimizer.warmup_steps=0",
        *extra]
    config = dysejax.load_config(config_path, overrides)
    setup = build(config, workdir=workdir, verbose=False)
    plan = Plan((Run("dp", config.model.n_layers, None),))
    B, S, m = case["batch"], case["seq"], config.model
    arrays = make_batch(B, S, case["docs"], m.vocab_size)
    batch = jax.device_put(arrays, batch_sharding(plan, setup.mesh))
    state = setup.state_layout.init(0)
    params = jax.tree.map(np.asarray, state["params"])
    plain_cfg = plain_step.PlainConfig.of(m, remat=case["remat"])
    pparams = plain_step.from_dysejax(params)

    # the two train steps, each run only where XLA says it fits in --max-gib
    t0 = time.perf_counter()
    program = setup.programs.get("train", S, B, plan)
    compile_d = time.perf_counter() - t0
    tx = plain_step.optimizer(config.optimizer)
    pstate = {"params": jax.device_put(pparams), "opt": tx.init(pparams)}
    t0 = time.perf_counter()
    pstep = jax.jit(lambda st, b: plain_step.train_step(plain_cfg, tx, st, b), donate_argnums=0).lower(pstate, arrays).compile()
    compile_p = time.perf_counter() - t0
    need = {"plain": pstep.memory_analysis().temp_size_in_bytes / 2**30, "dysejax": program.memory["temp"] / 2**30}
    over = {k: v for k, v in need.items() if v > max_gib}
    if over:
        return {**case, "skipped": ", ".join(f"the {k} step needs {v:.1f} GiB of XLA temp memory" for k, v in over.items())
                + f", over --max-gib {max_gib:g}", "temp_gib": need}

    # equal loss and gradients, before any timing
    def ours(p, b):
        total, count = loss_sums(setup.model, plan, setup.mesh, p, b)
        return total / count

    loss_d, grads_d = jax.jit(jax.value_and_grad(ours))(state["params"], batch)
    loss_p, grads_p = jax.jit(jax.value_and_grad(lambda p, b: plain_step.loss(plain_cfg, p, b)))(pparams, arrays)
    grads_p = plain_step.to_dysejax(jax.tree.map(np.asarray, grads_p))
    loss_err = abs(float(loss_p) - float(loss_d)) / abs(float(loss_d))
    grad_err = max(relative_error(a, b) for a, b in zip(jax.tree.leaves(grads_p), jax.tree.leaves(jax.tree.map(np.asarray, grads_d))))
    assert loss_err <= tol and grad_err <= tol, f"{case['name']}: plain vs dysejax loss {loss_err:.2e}, grads {grad_err:.2e}"

    holder = {"d": state, "p": pstate}

    def run_d():
        t = time.perf_counter()
        holder["d"], out = program(holder["d"], batch)
        jax.block_until_ready(out)
        return time.perf_counter() - t

    def run_p():
        t = time.perf_counter()
        holder["p"], out = pstep(holder["p"], arrays)
        jax.block_until_ready(out)
        return time.perf_counter() - t

    run_d(), run_p()  # warm
    steps = interleaved({"plain": run_p, "dysejax": run_d}, rounds)

    # the attention kernels alone: one layer's q, k, v with the model's heads, forward + backward
    spec = block_spec(setup.model.cfg)
    rng = np.random.default_rng(1)
    q, k, v, ct = (jnp.asarray(rng.standard_normal((B, S, spec.n_heads, spec.head_dim)), jnp.float32) for _ in range(4))
    seg = jnp.asarray(arrays["segment_ids"])

    def grads_of(attend):
        return jax.jit(jax.grad(lambda q, k, v: jnp.sum(attend(q, k, v) * ct), argnums=(0, 1, 2)))

    att_d = grads_of(lambda q, k, v: local_attention(q, k, v, spec, q_segment_ids=seg, kv_segment_ids=seg))
    att_p = grads_of(lambda q, k, v: plain_step.attention(q, k, v, seg, block=m.attention_block))
    att_err = max(relative_error(a, b) for a, b in zip(att_d(q, k, v), att_p(q, k, v)))
    assert att_err <= tol, f"{case['name']}: attention grads differ by {att_err:.2e}"
    attention = interleaved({"plain": lambda: timed(att_p, q, k, v), "dysejax": lambda: timed(att_d, q, k, v)}, rounds)

    matmul, attn = train_flops_split(m, B, S)
    return {**case, "loss_rel_err": loss_err, "grad_rel_err": grad_err, "attention_grad_rel_err": att_err,
            "model_flops": matmul + attn, "attention_flops": attn, "compile_s": {"plain": compile_p, "dysejax": compile_d},
            "temp_gib": need,
            "step": {k: summary(v) for k, v in steps.items()}, "attention": {k: summary(v) for k, v in attention.items()}}


def format_row(r: dict, rate: float) -> str:
    if "skipped" in r:
        return f"{r['name']:<24} not run: {r['skipped']}"
    st, at = r["step"], r["attention"]
    ratio = st["plain"]["median_s"] / st["dysejax"]["median_s"]
    aratio = at["plain"]["median_s"] / at["dysejax"]["median_s"]
    share = lambda side: r["model_flops"] / st[side]["median_s"] / rate  # noqa: E731
    span = lambda s: f"{s['median_s']:7.3f} ({s['min_s']:.3f}-{s['max_s']:.3f})"  # noqa: E731
    return (f"{r['name']:<24} {span(st['plain'])} {span(st['dysejax'])} {ratio:6.2f}  "
            f"{span(at['plain'])} {span(at['dysejax'])} {aratio:6.2f}  {100 * share('plain'):5.1f}% {100 * share('dysejax'):5.1f}%")


HEADER = (f"{'case (model:BxS[:docs]:remat)':<24} {'plain step s (range)':>22} {'dysejax step s':>22} {'ratio':>6}  "
          f"{'plain attn s':>22} {'dysejax attn s':>22} {'ratio':>6}  {'plain':>6} {'dysejax':>7}\n"
          f"{'':<24} {'':>22} {'':>22} {'p/d':>6}  {'(fwd+bwd, 1 layer)':>22} {'':>22} {'p/d':>6}  "
          f"{'FLOP/s share of matmul':>15}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(DEFAULT_CASES))
    p.add_argument("--config", default=CONFIG, help="the model's config (models `small`/`base` as it is)")
    p.add_argument("--set", action="append", default=[], help="a config override for both sides (repeatable)")
    p.add_argument("--tol", type=float, default=TOL, help="relative tolerance of the loss / grads check")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per case (interleaved)")
    p.add_argument("--max-gib", type=float, default=8.0, help="run no step whose XLA temp memory exceeds this")
    p.add_argument("--note", default="", help="recorded with the results (e.g. the machine was shared)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    cases = [parse_case(c) for c in args.cases.split(",")]

    from dysejax import runtime
    runtime.configure_host_devices(1)
    import jax

    from benchmarks.results_io import write_json
    t_start = time.perf_counter()
    rate = matmul_rate(args.rounds)
    print(f"device: {jax.devices()[0].device_kind}, 1 device; float32 matmul rate {rate['flops'] / 1e9:.1f} GFLOP/s "
          f"(1024^3, median of {args.rounds}); {args.rounds} interleaved rounds per case\n{HEADER}", flush=True)
    rows = []
    result = {"device": jax.devices()[0].device_kind, "config": os.path.relpath(args.config, ROOT), "overrides": args.set,
              "matmul_rate": rate, "rounds": args.rounds, "max_gib": args.max_gib, "cases": rows, "note": args.note}
    for case in cases:
        row = run_case(case, args.rounds, "/tmp/dysejax-step-vs-plain", args.max_gib, args.config, args.set, args.tol)
        rows.append(row)
        print(format_row(row, rate["flops"]), flush=True)
        if args.json:  # after every case, so that a run stopped early keeps the cases it finished
            write_json(args.json, {**result, "finished": False, "seconds": time.perf_counter() - t_start})
    rate_after = matmul_rate(args.rounds)
    print(f"matmul rate after the cases: {rate_after['flops'] / 1e9:.1f} GFLOP/s")
    if args.json:
        write_json(args.json, {**result, "matmul_rate_after": rate_after, "finished": True,
                               "seconds": time.perf_counter() - t_start})
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
