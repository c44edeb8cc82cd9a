"""`python train.py` with `plan: auto` under a memory budget on every shipped config this CPU can
train, run as a user runs it: one subprocess per config, its own workdir, a fresh cost-model
calibration (so its seconds are part of the wall time), a budget under what the fastest plans
need, so that `auto` picks remat policies and mixed plans. Reports per config: exit status,
steps trained against steps asked, the plan each bucket trained with, the calibration's and the
whole run's seconds. The large configs (125m and up) are for GPUs and are only planned there.

Usage: python benchmarks/auto_on_configs.py [--only NAME ...] [--workdir DIR] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_io import ROOT, write_json  # noqa: E402

# name -> (config, steps, overrides): the budgets force remat at the longest bucket
RUNS = {
    "quickstart": ("quickstart.yaml", 6, ["parallel.memory_budget_gb=0.02"]),
    "tiny": ("tiny.yaml", 6, ["parallel.plan=auto", "parallel.memory_budget_gb=0.01"]),
    "pipeline_tiny": ("pipeline_tiny.yaml", 6, ["parallel.plan=auto", "parallel.memory_budget_gb=0.02"]),
    "dynamic_4k": ("dynamic_4k.yaml", 6, ["parallel.memory_budget_gb=0.02"]),
    # the run of issue 26: dynamic.yaml's model at buckets to 4,096 on GRCh38-like lengths
    "dynamic_grch38": ("dynamic.yaml", 8, ["data.buckets=[256,1024,4096]", "data.tokens_per_batch=4096",
                                           "parallel.memory_budget_gb=0.03", "data.source=synthetic",
                                           "data.synthetic.distribution=grch38", "data.synthetic.num_docs=400",
                                           "data.synthetic.max_len=65536"]),
}
CALIBRATION = re.compile(r"cost model: calibrating on these devices: \d+ programs in ([0-9.]+) s")


def run_one(name: str, work: str) -> dict:
    """Train one config to its last step; what happened, read from its output and metrics."""
    config, steps, sets = RUNS[name]
    wd = os.path.join(work, name)
    cmd = [sys.executable, "train.py", "--config", os.path.join("configs", config), "--steps", str(steps),
           "--workdir", wd, "--set", *sets, f"parallel.costmodel_dir={os.path.join(work, name + '_costmodel')}"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    rows = []
    if os.path.exists(os.path.join(wd, "metrics.jsonl")):
        with open(os.path.join(wd, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    trained = [r for r in rows if "loss" in r and "bucket" in r]
    plans = {}
    for r in trained:
        plans.setdefault(str(r["bucket"]), r["plan"])
    cal = CALIBRATION.search(out.stdout)
    return {"config": config, "overrides": sets, "steps_asked": steps, "returncode": out.returncode,
            "steps_trained": len(trained), "last_step": trained[-1]["step"] if trained else None,
            "plans_trained": plans, "calibration_s": float(cal.group(1)) if cal else None, "wall_s": wall,
            "compiles_after_warmup": max((r.get("compiles_after_warmup", 0) for r in trained), default=None),
            "stderr_tail": out.stderr.strip().splitlines()[-3:] if out.returncode else []}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=sorted(RUNS), help="these configs only (default: all)")
    ap.add_argument("--workdir", help="where the runs go (default: a temporary folder, removed after)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    work = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="auto_on_configs_"))
    results = {}
    print(f"{'config':<16} {'rc':>3} {'steps':>9} {'calibration s':>13} {'wall s':>7}  plans trained (bucket: plan)")
    for name in args.only or RUNS:
        r = results[name] = run_one(name, work)
        cal = f"{r['calibration_s']:.0f}" if r["calibration_s"] is not None else "cached"
        print(f"{name:<16} {r['returncode']:>3} {r['steps_trained']:>4}/{r['steps_asked']:<4} {cal:>13} "
              f"{r['wall_s']:7.0f}  " + ", ".join(f"{b}: {p}" for b, p in r["plans_trained"].items()), flush=True)
        for line in r["stderr_tail"]:
            print(f"    {line}")
    done = [n for n, r in results.items() if r["returncode"] == 0 and r["last_step"] == r["steps_asked"]]
    ok = len(done) == len(results)
    print(f"{len(done)} of {len(results)} configs trained to their last step")
    if args.json:
        write_json(args.json, {"runs": results, "all_trained_to_the_end": ok})
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
