"""Max trainable length of every strategy at every remat policy, and of `auto`: compiled, not run.

    python benchmarks/max_length.py [--config configs/dynamic.yaml] [--set KEY=VALUE ...]
                                    [--cap 262144] [--json OUT]

For each static strategy (one plan for all layers) and remat policy, the largest power-of-two
multiple of the config's largest bucket whose whole training step (the trainer's own program at
the data's batch size for that length) fits the per-device budget by XLA's figure
(`memory_analysis()`); below the largest bucket, halvings of it down to 256. `best` is the
longest over the policies. `--set` overrides the config (e.g. `model.vocab_size=32768`).
Nothing is timed: the figures do not depend on what else the machine runs.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from contenders import STATIC, auto_fits_at, max_length, strategy_max_lengths  # noqa: E402
from results_io import write_json  # noqa: E402

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "dynamic.yaml")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides")
    ap.add_argument("--strategies", nargs="*", default=list(STATIC))
    ap.add_argument("--cap", type=int, default=262144, help="longest length tried")
    ap.add_argument("--workdir", help="compile cache (default: a fresh temporary directory)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    import dysejax
    from dysejax import runtime

    work = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="max_length_"))
    cfg = dysejax.load_config(args.config, [*args.set, "parallel.plan=auto", "parallel.profile_time=false",
                                            f"train.compile_cache_dir={os.path.join(work, 'jax_cache')}"])
    runtime.configure_host_devices(cfg.parallel.cpu_devices)
    import jax
    t0 = time.time()
    trainer = dysejax.Trainer(cfg, workdir=os.path.join(work, "trainer"))
    if trainer.budget is None:
        sys.exit("error: the benchmark needs a per-device budget: set parallel.memory_budget_gb")
    start = trainer.data.buckets[-1]
    rows = {}
    for s in args.strategies:
        rows[s] = {r: {"max_len": n, "capped": capped} for r, (n, capped) in
                   strategy_max_lengths(trainer, s, start, args.cap).items()}
        print(f"{s:8s} " + "  ".join(f"{r}: {'>=' if v['capped'] else ''}{v['max_len']}" for r, v in rows[s].items()),
              flush=True)
    n, capped = max_length(lambda n: auto_fits_at(trainer, n), start, args.cap)
    rows["auto"] = {"best": {"max_len": n, "capped": capped}}
    print(f"{'auto':8s} best: {'>=' if capped else ''}{n}")
    result = {"config": os.path.relpath(args.config), "overrides": args.set, "budget_bytes": int(trainer.budget),
              "devices": jax.device_count(), "platform": jax.devices()[0].platform,
              "vocab_size": cfg.model.vocab_size, "cap": args.cap, "max_len": rows, "wall_s": time.time() - t0}
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
