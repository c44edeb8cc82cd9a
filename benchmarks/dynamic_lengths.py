"""Headline benchmark: `auto` vs every static strategy on the same dynamic-length batches.

For `auto` and each static strategy (dp, fsdp, tp, tp_sp, ring, ulysses, metp) one trainer is
built from the same config (same data, same seed), differing only in `parallel.plan`. Every
bucket's train program is compiled ahead of time; a program whose per-device bytes (XLA's own
figure) exceed the budget cannot run, which on CPU stands in for an out-of-memory failure.
Then the same N batches are fed to every trainer, interleaved step by step (so that load from
other processes on a shared machine falls on all of them alike), and each step that can run is
run and timed. Reported per strategy: steps run, steps over budget, tokens/s on the steps that
ran, total time, padding fraction, compilations after warmup, and the max trainable length (the
largest length whose program fits, bisected with XLA's figure at the pipeline's batch size).

On CPU all simulated devices share the cores: absolute speed means little, the ratios between
strategies in one run are the point. The script runs unchanged on a GPU. With --quick, or
--time-limit S, no new batch is fed once stepping has taken the limit (after at least four), so a
generous budget, under which every strategy runs every step, stays CI-sized; every contender
still gets the same batches. A max trainable length found at --max-len-cap is reported as ">=".

Usage: python benchmarks/dynamic_lengths.py [--config configs/dynamic.yaml] [--budget-gb X]
       [--data stdlib|githubcode|grch38] [--steps N] [--quick] [--time-limit S] [--json OUT] [--png OUT]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from results_io import write_json  # noqa: E402  (the script's folder is on sys.path)

STATIC = ("dp", "fsdp", "tp", "tp_sp", "ring", "ulysses", "metp")
QUICK_TIME_LIMIT_S = 600  # --quick stays CI-sized whatever the budget (every strategy may run every step)
MIN_ROUNDS = 4
CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "dynamic.yaml")


class Contender:
    """One trainer (one `parallel.plan`) with its compiled programs, state and tallies."""

    def __init__(self, name: str, config, workdir: str):
        import dysejax
        self.name = name
        self.trainer = dysejax.Trainer(config, workdir=workdir, verbose=False)
        self.programs: dict[int, object] = {}  # bucket -> program that fits (absent: over budget)
        self.bytes: dict[int, int] = {}
        self.plan_ids: dict[int, str] = {}
        self.compile_s = 0.0
        self.steps_run = self.over = self.compiles = 0
        self.tokens = self.slots = 0
        self.seconds = 0.0
        self.by_bucket: dict[int, dict] = {}

    def warmup(self) -> None:
        """Compile every bucket's program (auto: the first candidate within budget by XLA)."""
        from dysejax.errors import PlanError
        t = self.trainer
        t0 = time.perf_counter()
        for b in t.data.buckets:
            bs = t.data.batch_size(b)
            if self.name == "auto":
                try:
                    program = t.programs.select("train", b, bs, t.plans.candidates(b), t.budget)
                except PlanError:
                    program = t.programs.get("train", b, bs, t.plans.candidates(b)[-1])
            else:
                program = t.programs.get("train", b, bs, t.parse_plan(self.name))
            self.bytes[b], self.plan_ids[b] = program.bytes_per_device, program.plan.id
            if t.budget is None or program.bytes_per_device <= t.budget:
                self.programs[b] = program
        self.compile_s = time.perf_counter() - t0
        self.state = t.state_layout.init(t.config.train.seed)

    def dry_run(self, batches) -> None:
        """Run each program once on a throwaway copy of the state (first-run effects untimed)."""
        import jax
        import jax.numpy as jnp
        first = {}
        for plan_b in batches:
            first.setdefault(plan_b.bucket, plan_b)
        for b, program in self.programs.items():
            if b in first:
                scratch = jax.tree.map(jnp.copy, self.state)
                jax.block_until_ready(program(scratch, self.trainer.load_batch(first[b], program.plan)))

    def step(self, plan_b) -> None:
        """Run (and time) one batch, or count it as over budget."""
        import jax
        program = self.programs.get(plan_b.bucket)
        row = self.by_bucket.setdefault(plan_b.bucket, {"steps": 0, "tokens": 0, "seconds": 0.0})
        if program is None:
            self.over += 1
            return
        batch = self.trainer.load_batch(plan_b, program.plan)
        t0 = time.perf_counter()
        lowered = self.trainer.compiles.lowered
        self.state, out = program(self.state, batch)
        jax.block_until_ready(out["loss"])
        dt = time.perf_counter() - t0
        self.compiles += self.trainer.compiles.lowered - lowered  # (the counter is process-wide)
        self.steps_run += 1
        self.tokens += plan_b.real_tokens
        self.slots += plan_b.batch_size * plan_b.bucket
        self.seconds += dt
        row["steps"] += 1
        row["tokens"] += plan_b.real_tokens
        row["seconds"] += dt

    def result(self, max_len: int) -> dict:
        return {"steps_run": self.steps_run, "steps_over_budget": self.over,
                "tokens_per_s": self.tokens / self.seconds if self.seconds else 0.0,
                "total_time_s": self.seconds, "tokens": self.tokens,
                "padding_fraction": 1 - self.tokens / self.slots if self.slots else 0.0,
                "compiles_after_warmup": self.compiles,
                "compile_s": self.compile_s, "max_len": max_len,
                "buckets": {str(b): self._bucket(b) for b in sorted(self.bytes)}}

    def _bucket(self, b: int) -> dict:
        r = self.by_bucket.get(b, {"steps": 0, "tokens": 0, "seconds": 0.0})
        return {"bytes_per_device": self.bytes[b], "plan": self.plan_ids[b], "fits": b in self.programs,
                "steps": r["steps"], "tokens_per_s": r["tokens"] / r["seconds"] if r["seconds"] else None}


def fits_at(contender: Contender, s: int) -> bool:
    """Whether a program of length s (the pipeline's batch size for s) fits, by XLA's figure."""
    from dysejax.errors import PlanError
    t = contender.trainer
    bs = t.data.batch_size(s)
    try:
        if contender.name == "auto":
            t.programs.select("train", s, bs, list(t.planner.plan(s, bs).candidates), t.budget)
            return True
        t.check_plan(t.parse_plan(contender.name), s, bs)
        return t.programs.get("train", s, bs, t.parse_plan(contender.name)).bytes_per_device <= t.budget
    except PlanError:
        return False


def max_trainable_length(contender: Contender, unit: int, cap: int, quick: bool) -> tuple[int, bool]:
    """(largest multiple of `unit` up to `cap` that fits (powers of two only with --quick), whether
    the search stopped at the cap rather than at a length that does not fit: then a lower bound)."""
    if quick:
        best, s = 0, unit
        while s <= cap and fits_at(contender, s):
            best, s = s, 2 * s
        return best, s > cap
    lo, hi = 0, cap // unit  # in units; lo fits (0 = nothing), hi is the first candidate above
    top = hi
    k = 1
    while k <= hi and fits_at(contender, k * unit):
        lo, k = k, 2 * k
    hi = min(hi, k - 1) if k <= hi else hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits_at(contender, mid * unit):
            lo = mid
        else:
            hi = mid - 1
    return lo * unit, lo == top


def overrides(args) -> list[str]:
    out = [f"parallel.memory_budget_gb={args.budget_gb}"] if args.budget_gb is not None else []
    if args.data != "stdlib":
        out += ["data.source=synthetic", f"data.synthetic.distribution={args.data}",
                "data.synthetic.num_docs=400", "data.synthetic.max_len=32768"]
    if args.quick:
        out += ["data.max_docs=300"] if args.data == "stdlib" else []
    return out


def write_png(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(13, 4.8))
    for name, r in result["strategies"].items():
        bs = sorted(int(b) for b in r["buckets"])
        style = dict(lw=3, color="k") if name == "auto" else {}
        ax_t.plot(bs, [r["buckets"][str(b)]["tokens_per_s"] or float("nan") for b in bs], marker="o", label=name,
                  **style)
        ax_m.plot(bs, [r["buckets"][str(b)]["bytes_per_device"] / 2**20 for b in bs], marker="o", label=name, **style)
    auto = result["strategies"]["auto"]["buckets"]
    for b, row in auto.items():
        ax_m.annotate(row["plan"], (int(b), row["bytes_per_device"] / 2**20), fontsize=7, rotation=20)
    ax_m.axhline(result["budget_bytes"] / 2**20, color="r", ls="--", label="budget")
    for ax, label in ((ax_t, "tokens/s on the steps that ran"), (ax_m, "MiB per device (XLA)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bucket length")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    ax_m.set_yscale("log")
    ax_t.legend(fontsize=8)
    fig.suptitle(f"dynamic lengths ({result['data']}), {result['devices']} x {result['platform']}: auto's plan "
                 "per bucket annotated")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _supervise(argv: list, attempts: int) -> dict:
    """Run the benchmark in a child process, again if XLA:CPU aborts it.

    On a CPU whose few cores the 8 simulated devices share, XLA:CPU can still deadlock on a
    program with independent collectives (see `sharding.ops.ordering`) and aborts the process
    after 40 s. A rerun reuses the compile cache and almost always passes; the results are those
    of the run that completed."""
    import subprocess
    if "--workdir" not in argv:  # the attempts share compiled programs and calibrations
        import tempfile
        argv = argv + ["--workdir", tempfile.mkdtemp(prefix="dynamic_lengths_")]
    for attempt in range(1, attempts + 1):
        rc = subprocess.run([sys.executable, os.path.abspath(__file__), *argv, "--worker"]).returncode
        if rc == 0:
            return {}
        print(f"attempt {attempt}: the benchmark process exited with {rc}"
              + (" (XLA:CPU aborted it); retrying" if attempt < attempts else ""), flush=True)
    sys.exit(rc)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--budget-gb", type=float, help="per-device budget in GiB (default: the config's)")
    ap.add_argument("--data", default="stdlib", choices=("stdlib", "githubcode", "grch38"))
    ap.add_argument("--steps", type=int, help="batches fed to every strategy (default 40; 12 with --quick)")
    ap.add_argument("--quick", action="store_true", help="a CI-sized run: fewer steps and documents, "
                    "max lengths over powers of two")
    ap.add_argument("--time-limit", type=float, help="stop feeding batches once stepping took this many seconds "
                    f"(at least {MIN_ROUNDS} batches; default {QUICK_TIME_LIMIT_S} s with --quick, none without)")
    ap.add_argument("--max-len-cap", type=int, default=262144,
                    help="largest length the max-length search tries (a length found at the cap is reported as >= cap)")
    ap.add_argument("--workdir", help="trainers' workdirs, compile cache and cost-model calibration "
                    "(default: a fresh temporary folder); reuse one to skip compiles on a rerun")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--png", help="write the plot here (default: next to --json)")
    ap.add_argument("--attempts", type=int, default=3, help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not args.worker:
        return _supervise(sys.argv[1:] if argv is None else list(argv), args.attempts)
    import tempfile

    import dysejax
    from dysejax import runtime

    steps = args.steps or (12 if args.quick else 40)
    base = dysejax.load_config(args.config, overrides(args))
    runtime.configure_host_devices(base.parallel.cpu_devices)
    import jax
    t_start = time.time()
    work = os.path.abspath(args.workdir) if args.workdir else tempfile.mkdtemp(prefix="dynamic_lengths_")
    contenders = {}
    for name in ("auto",) + STATIC:
        cfg = dysejax.load_config(args.config, overrides(args) + [
            f"parallel.plan={name}", f"train.compile_cache_dir={os.path.join(work, 'jax_cache')}",
            f"parallel.costmodel_dir={os.path.join(work, 'costmodel')}"])
        contenders[name] = Contender(name, cfg, os.path.join(work, name))
    budget = contenders["auto"].trainer.budget
    if budget is None:
        sys.exit("error: the benchmark needs a per-device budget: pass --budget-gb or set parallel.memory_budget_gb")
    data = contenders["auto"].trainer.data
    it = data.train_iterator()
    batches = [it.next_plan() for _ in range(steps)]
    for c in contenders.values():
        c.warmup()
        if not args.quick:
            c.dry_run(batches)
        print(f"warmup {c.name:8s} {c.compile_s:6.1f} s: " + "  ".join(
            f"{b}:{c.plan_ids[b]}={c.bytes[b] / 2**20:.1f}M{'' if b in c.programs else '(over)'}" for b in c.bytes),
            flush=True)
    names = list(contenders)
    limit = args.time_limit if args.time_limit is not None else (QUICK_TIME_LIMIT_S if args.quick else None)
    t_steps, fed = time.perf_counter(), 0
    for i, plan_b in enumerate(batches):  # rotate the order so no strategy always runs first
        if limit is not None and i >= MIN_ROUNDS and time.perf_counter() - t_steps > limit:
            break  # every contender has had the same batches so far
        for name in names[i % len(names):] + names[:i % len(names)]:
            contenders[name].step(plan_b)
        fed = i + 1
        print(f"batch {fed}/{steps} (bucket {plan_b.bucket}) done, {time.perf_counter() - t_steps:.0f} s", flush=True)
    batches = batches[:fed]
    unit = 256
    result = {"budget_bytes": int(budget), "data": args.data, "steps": fed, "steps_planned": steps,
              "time_limit_s": limit, "quick": bool(args.quick),
              "devices": jax.device_count(), "platform": jax.devices()[0].platform,
              "config": os.path.relpath(args.config), "buckets": data.buckets,
              "bucket_steps": {str(b): sum(p.bucket == b for p in batches) for b in data.buckets},
              "strategies": {}}
    for name, c in contenders.items():
        max_len, capped = max_trainable_length(c, unit, args.max_len_cap, args.quick)
        result["strategies"][name] = {**c.result(max_len), "max_len_capped": capped}
    s = result["strategies"]
    complete = [n for n in STATIC if s[n]["steps_over_budget"] == 0]
    result["auto_vs_complete_static"] = {n: s["auto"]["tokens_per_s"] / s[n]["tokens_per_s"] for n in complete
                                         if s[n]["tokens_per_s"]}
    result["max_len_ratio_vs_tp_sp"] = s["auto"]["max_len"] / s["tp_sp"]["max_len"] if s["tp_sp"]["max_len"] else None
    result["wall_s"] = time.time() - t_start
    print(f"\n{result['devices']} x {result['platform']}, budget {budget / 2**20:.0f} MiB/device, data {args.data}, "
          f"{fed} batches (per bucket: {result['bucket_steps']})"
          + (f", stopped at the {limit:.0f} s time limit of {steps} planned" if fed < steps else ""))
    print(f"{'strategy':<9} {'run':>4} {'over':>5} {'tokens/s':>10} {'time (s)':>9} {'padding':>8} "
          f"{'compiles':>8} {'max len':>8}")
    for name, r in s.items():
        print(f"{name:<9} {r['steps_run']:>4} {r['steps_over_budget']:>5} {r['tokens_per_s']:>10.0f} "
              f"{r['total_time_s']:>9.2f} {r['padding_fraction']:>8.1%} {r['compiles_after_warmup']:>8} "
              f"{('>=' if r['max_len_capped'] else '') + str(r['max_len']):>8}")
    print("auto's plan per bucket: " + ", ".join(f"{b}: {r['plan']}" for b, r in s["auto"]["buckets"].items()))
    ratios = ", ".join(f"{n} {v:.2f}" for n, v in result["auto_vs_complete_static"].items())
    print(f"auto tokens/s / static strategies that ran every step: {ratios or 'none ran every step'}")
    if result["max_len_ratio_vs_tp_sp"] is not None:
        at_least = ">= " if s["auto"]["max_len_capped"] else ""
        print(f"max trainable length: auto / tp_sp = {at_least}{result['max_len_ratio_vs_tp_sp']:.2f}x"
              + (f" (auto reached the search cap, --max-len-cap {args.max_len_cap})" if at_least else ""))
    if args.json:
        write_json(args.json, result)
    png = args.png or (os.path.splitext(args.json)[0] + ".png" if args.json else None)
    if png:
        write_png(result, png)
        print(f"plot: {png}")
    return result


if __name__ == "__main__":
    main()
