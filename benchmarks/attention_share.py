"""Attention's share of a train step, per strategy, on the simulated CPU devices.

Each contender (strategy:ROWSxLENGTH) has its whole train step compiled twice: as it is, and with
the local attention kernel (`sharding.ops.kernels.Kernel`, what every strategy runs per device
and per ring step) replaced by a stand-in that costs next to nothing (out = q, lse = q[..., 0];
backward dq = dout, dk = k, dv = v: no matmul, nothing XLA can fold away). Everything else stays:
projections, MLP, loss, optimizer and each strategy's collectives (ring's K/V passes, ulysses'
all-to-alls). Both steps run in interleaved rounds (the order reversed every round); the kernel's
share of the step is 1 - stand-in / real, from the medians, its range from the extreme samples.

The same share of the step's model FLOPs (`dysejax.flops.train_flops_split`) is printed beside
it, and their odds ratio, "cost per FLOP": (time share / (1 - time share)) / (FLOP share /
(1 - FLOP share)), how much dearer a FLOP of attention is than a FLOP of the rest of the step.
It compares kernels across row lengths: `dp` at 8 rows of L and `ring` at one row of 8L have
the same tokens per device but not the same attention FLOPs per token.

    python benchmarks/attention_share.py --json benchmarks/results/attention_share.json
    python benchmarks/attention_share.py --contenders dp:8x512,ring:1x4096 --rounds 3

On CPU the 8 simulated devices share the cores: a step's time is the devices' work summed over
the cores plus waiting, so shares compare strategies' kernels, not parallel speed.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CONFIG = os.path.join(ROOT, "configs", "dynamic.yaml")
DEFAULT = "dp:8x1024,ring:1x8192,ulysses:1x8192,metp:1x8192"


def parse_contender(text: str) -> dict:
    strategy, _, shape = text.partition(":")
    try:
        rows, length = (int(x) for x in shape.split("x"))
    except ValueError:
        raise SystemExit(f"error: bad contender {text!r}: want STRATEGY:ROWSxLENGTH, e.g. ring:1x8192")
    return {"name": text, "strategy": strategy, "rows": rows, "length": length}


@contextlib.contextmanager
def stand_in_kernel():
    """Every local attention kernel traced inside this block is the near-free stand-in."""
    from sharding.ops.kernels import Kernel
    saved = Kernel.forward, Kernel.backward

    def forward(self, q, k, v, ids, *, causal, scale):
        q = q.astype("float32")
        return q, q[..., 0]

    def backward(self, q, k, v, ids, lse, dout, delta, *, causal, scale):
        return dout, k, v

    Kernel.forward, Kernel.backward = forward, backward
    try:
        yield
    finally:
        Kernel.forward, Kernel.backward = saved


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--contenders", default=DEFAULT)
    p.add_argument("--config", default=CONFIG)
    p.add_argument("--set", action="append", default=[], help="a config override (repeatable)")
    p.add_argument("--remat", default="none")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--note", default="", help="recorded with the results (e.g. how the machine was shared)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    contenders = [parse_contender(c) for c in args.contenders.split(",")]

    import dysejax
    from dysejax import runtime
    lengths = sorted({c["length"] for c in contenders})
    tokens = max(c["rows"] * c["length"] for c in contenders)
    config = dysejax.load_config(args.config, [
        "parallel.plan=ring", "parallel.profile_time=false", "parallel.memory_budget_gb=null", "data.source=synthetic",
        f"data.buckets=[{','.join(map(str, lengths))}]", f"data.tokens_per_batch={tokens}", "data.eval_batches=0",
        "data.synthetic.num_docs=8", f"model.remat={args.remat}", "train.progress=false", "train.compile_cache=false",
        "optimizer.warmup_steps=0", *args.set])
    runtime.configure_host_devices(config.parallel.cpu_devices)
    import jax

    from dysejax.batches import batch_sharding
    from dysejax.build import build
    from dysejax.flops import train_flops_split
    from results_io import write_json
    from sharding.plan import Plan, Run
    from step_vs_plain import interleaved, make_batch, summary

    t_start = time.perf_counter()
    setups = {"real": build(config, workdir="/tmp/dysejax-attention-share/real", verbose=False)}
    with stand_in_kernel():
        setups["stand-in"] = build(config, workdir="/tmp/dysejax-attention-share/stand-in", verbose=False)
    n = config.model.n_layers
    runners, compile_s, holders = {}, {}, {}
    for c in contenders:
        plan = Plan((Run(c["strategy"], n, args.remat),))
        arrays = make_batch(c["rows"], c["length"], 1, config.model.vocab_size)
        for variant, setup in setups.items():
            batch = jax.device_put(arrays, batch_sharding(plan, setup.mesh))
            t0 = time.perf_counter()
            with stand_in_kernel() if variant == "stand-in" else contextlib.nullcontext():
                program = setup.programs.get("train", c["length"], c["rows"], plan)
            key = f"{c['name']} {variant}"
            compile_s[key] = time.perf_counter() - t0
            holders[key] = setup.state_layout.init(0)

            def run(key=key, program=program, batch=batch):
                t = time.perf_counter()
                holders[key], out = program(holders[key], batch)
                jax.block_until_ready(out)
                return time.perf_counter() - t

            run()  # warm
            runners[key] = run
    times = {k: summary(v) for k, v in interleaved(runners, args.rounds).items()}

    rows = []
    print(f"{jax.device_count()} {jax.devices()[0].platform} devices; remat {args.remat}; {args.rounds} interleaved "
          "rounds; share = 1 - stand-in / real step (medians; range from extreme samples)")
    print(f"{'contender':<18} {'tokens/dev':>10} {'real step s (range)':>22} {'stand-in s (range)':>22} "
          f"{'time share':>17} {'FLOP share':>10} {'cost/FLOP':>9}")
    for c in contenders:
        real, stand = times[f"{c['name']} real"], times[f"{c['name']} stand-in"]
        share = 1 - stand["median_s"] / real["median_s"]
        low, high = 1 - stand["max_s"] / real["min_s"], 1 - stand["min_s"] / real["max_s"]
        matmul, attention = train_flops_split(config.model, c["rows"], c["length"])
        fshare = attention / (matmul + attention)
        odds = (share / (1 - share)) / (fshare / (1 - fshare)) if 0 < share < 1 else float("nan")
        per_device = c["rows"] * c["length"] // jax.device_count()
        rows.append({**c, "tokens_per_device": per_device, "real": real, "stand_in": stand, "time_share": share,
                     "time_share_range": [low, high], "flop_share": fshare, "cost_per_flop": odds,
                     "compile_s": {"real": compile_s[f"{c['name']} real"],
                                   "stand_in": compile_s[f"{c['name']} stand-in"]}})
        span = lambda s: f"{s['median_s']:7.3f} ({s['min_s']:.3f}-{s['max_s']:.3f})"  # noqa: E731
        print(f"{c['name']:<18} {per_device:>10} {span(real)} {span(stand)} {100 * share:5.1f}% "
              f"({100 * low:.0f}-{100 * high:.0f}%) {100 * fshare:9.1f}% {odds:9.2f}", flush=True)
    print(f"compiles: {', '.join(f'{k} {v:.0f} s' for k, v in compile_s.items())}")
    if args.json:
        write_json(args.json, {"config": os.path.relpath(args.config, ROOT), "overrides": args.set, "remat": args.remat,
                               "rounds": args.rounds, "note": args.note, "contenders": rows,
                               "seconds": time.perf_counter() - t_start})
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
