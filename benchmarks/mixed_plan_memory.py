"""Mixed plans' memory: the cost model's backward-order bound against XLA, by run length.

    python benchmarks/mixed_plan_memory.py [--layers 2 4] [--json OUT]

The tiny config (d 64, byte tokens, 8 simulated CPU devices, float32) with `parallel.plan=auto`
and a budget, so the memory model is this model's own calibration (fitted to XLA at these
buckets, as `auto` does). For each pair of options (A, B) in both orders, the plan runs the
first half of the layers under A and the second half under B; the model's prediction
(`AutoPlanner.predict`: base + max over layers of the stored bytes up to it + its peak) against
XLA's bytes per device of the compiled train step. With 2 layers each run is one layer (XLA
inlines a scan of one step); with 4 layers each run is a scan of two, as in real plans.
Compiled, not run.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from results_io import write_json  # noqa: E402  (the script's folder is on sys.path)

CONFIG = os.path.join(ROOT, "configs", "tiny.yaml")
BUCKETS = {64: 16, 128: 8, 256: 4}  # length: rows (1,024 tokens per batch)
PAIRS = [(("ring", "selective"), ("ring", "none")), (("ulysses", "full"), ("ulysses", "none")),
         (("metp", "full"), ("metp", "none")), (("dp", "dots"), ("fsdp", "none")),
         (("dp", "selective"), ("fsdp", "full")), (("ring", "selective"), ("metp", "none")),
         (("tp_sp", "none"), ("ulysses", "full")), (("metp", "full"), ("tp", "none")),
         (("fsdp", "none"), ("ring", "full"))]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    import numpy as np

    import dysejax
    from dysejax import runtime
    from dysejax.errors import PlanError
    runtime.configure_host_devices(8)
    work = tempfile.mkdtemp(prefix="mixed_plan_memory_")
    t0 = time.time()
    rows = []
    print(f"{'layers':>6} {'length':>6}  {'plan':44s} {'model MiB':>9} {'XLA MiB':>8} {'model vs XLA':>12}")
    for n in args.layers:
        cfg = dysejax.load_config(CONFIG, [
            "data.tokenizer=bytes", "model.vocab_size=264", "data.max_docs=300", "data.eval_batches=0",
            "model.d_model=64", "model.d_ff=128", f"model.n_layers={n}", "data.tokens_per_batch=1024",
            f"data.buckets=[{','.join(map(str, BUCKETS))}]", "data.long_policy=split", "parallel.plan=auto",
            "parallel.memory_budget_gb=1", "parallel.profile_time=false", "train.progress=false",
            f"parallel.costmodel_dir={os.path.join(work, 'costmodel')}"])
        trainer = dysejax.Trainer(cfg, workdir=os.path.join(work, f"run{n}"), verbose=False)
        planner, half = trainer.planner, n // 2
        for s, b in BUCKETS.items():
            for a, c in PAIRS:
                for first, second in ((a, c), (c, a)):
                    runs = [[first[0], half, first[1]], [second[0], n - half, second[1]]]
                    plan = planner.parse(runs)
                    try:
                        planner.check(plan, s, b)
                    except PlanError:
                        continue  # a strategy that cannot split this batch (dp/fsdp: 4 rows on 8 devices)
                    pred = planner.predict(s, b, plan)[0]
                    xla = trainer.programs.get("train", s, b, plan).bytes_per_device
                    rows.append({"layers": n, "seq_len": s, "batch": b, "plan": runs, "pred": int(pred),
                                 "xla": int(xla), "err": (pred - xla) / xla})
                    label = ",".join(f"{r[0]}:{r[1]}@{r[2]}" for r in runs)
                    print(f"{n:>6} {s:>6}  {label:44s} {pred / 2**20:9.2f} {xla / 2**20:8.2f} "
                          f"{(pred - xla) / xla:+12.1%}", flush=True)
    summary = {}
    for n in args.layers:
        err = np.array([r["err"] for r in rows if r["layers"] == n])
        summary[str(n)] = {"plans": int(err.size), "median_abs_err": float(np.median(np.abs(err))),
                           "min_err": float(err.min()), "max_err": float(err.max())}
        print(f"{n} layers: {err.size} plans, median |err| {np.median(np.abs(err)):.1%}, "
              f"model vs XLA from {err.min():+.1%} to {err.max():+.1%}")
    if args.json:
        write_json(args.json, {"config": "tiny.yaml (d 64, byte tokens)", "devices": 8, "dtype": "float32",
                               "summary": summary, "results": rows, "wall_s": time.time() - t0})


if __name__ == "__main__":
    main()
