"""Headline benchmark: `auto` against every static strategy at every remat policy, on one mixed-length batch sequence.

Contenders (benchmarks/contenders.py): `auto`; `S@R` for every strategy S and remat policy R
(one fixed plan for all buckets); `S@best` (per bucket the fastest measured remat policy of S,
an oracle). All share one trainer (config, data, seed, budget, compile cache); every program is
compiled ahead of time, a program over the per-device budget by XLA's figure cannot run (on CPU
this stands in for out-of-memory), and so cannot a strategy that cannot serve a bucket's shape.

The batches: the first --per-bucket (at least 3) batches of every bucket, in the epoch's order
(later epochs when an epoch holds fewer), timed in rounds: round k holds the k-th batch of
every bucket. Every distinct program runs --repeats times on each batch (its sample there is
the median: one step varies by ~10% from run to run), in rounds whose order rotates
(interleaved), after one untimed run each. Totals are projected on the whole epoch: epoch
sample k = sum over buckets of the epoch's batches x the step time of round k, so every
contender's k-th epoch sample comes from the same batches and minutes; figures are the median
with the min-max over the samples. A ratio whose ranges overlap is reported as a tie; ratios
are also given paired by round.

Overheads are reported per contender: programs compiled and their compile seconds per bucket;
for `auto` also the cost model's calibration on these devices (memory fit to XLA, layer times)
and the plan search, as seconds and amortised over the epoch (epoch + overheads).

--plans adds written plans as fixed contenders (one plan for every bucket), timed in the same
rounds and predicted by the same time model: e.g. two picks of `auto` from two calibrations,
side by side. They are not `S@R` contenders: the best-fixed-plan ratio and the regret ignore them.

--unbounded adds written plans timed whatever their memory (the budget does not apply to them):
with every contender's programs they give the ceiling, per bucket the fastest program timed at
any budget, so a speed-up that falls short can be told apart from one the budget rules out.

--negative runs the case where every batch needs the longest bucket's plan (the data packed
into the largest bucket only): `auto` should then tie the best fixed plan.

On CPU the simulated devices share the cores: absolute speed means little; the ratios of one
run are the point. The script runs unchanged on a GPU.

Usage: python benchmarks/dynamic_lengths.py [--config configs/dynamic.yaml] [--budget-gb X]
       [--data stdlib|githubcode|grch38] [--negative] [--per-bucket K] [--no-max-len] [--plans ID ...]
       [--unbounded ID ...] [--workdir DIR] [--json OUT] [--png OUT]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from contenders import (REMATS, STATIC, auto_fits_at, build_auto, build_fixed, build_static, max_length, measure,  # noqa: E402
                        oracle_over_remat, strategy_max_lengths, tally)
from results_io import write_json  # noqa: E402

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "dynamic.yaml")


MIN_SAMPLES = 3
NO_BUDGET = " (no budget)"  # the name suffix of an --unbounded plan


def overrides(args, buckets) -> list[str]:
    out = [f"parallel.memory_budget_gb={args.budget_gb}"] if args.budget_gb is not None else []
    if args.data != "stdlib":
        out += ["data.source=synthetic", f"data.synthetic.distribution={args.data}",
                f"data.synthetic.num_docs={args.num_docs}", "data.synthetic.max_len=65536"]
    if args.negative:  # every document packed into (or split to) the longest bucket
        out += [f"data.buckets=[{max(buckets)}]"]
    return out


def choose_batches(data, per_bucket: int) -> tuple[list, dict[int, int]]:
    """The first `per_bucket` batches of every bucket, in the order of epoch 0 (then of epoch 1,
    ... for a bucket with fewer batches in an epoch), and epoch 0's batch count per bucket (what
    the epoch figures weight the measured step times with). They are returned in rounds, the
    k-th batch of every bucket in round k, so that the k-th epoch sample is measured in one
    stretch of time: a change in the machine's speed moves whole epoch samples, not one bucket's
    step times (measured bucket after bucket, a slow minute made one bucket 24% slower)."""
    epoch = {b: sum(p.bucket == b for p in data.epoch_plans(0)) for b in data.buckets}
    taken: dict[int, list] = {b: [] for b in data.buckets}
    for e in range(64):
        for p in data.epoch_plans(e):
            if len(taken[p.bucket]) < per_bucket:
                taken[p.bucket].append(p)
        if all(len(ps) >= per_bucket for b, ps in taken.items() if epoch[b]):
            break
    rounds = [[ps[k] for ps in taken.values() if k < len(ps)] for k in range(per_bucket)]
    return [p for r in rounds for p in r], epoch


def ratio(slow: dict, fast: dict) -> dict:
    """slow / fast epoch time: the median ratio, its range over the samples (slowest of one
    against fastest of the other, both ways), and whether the ranges are apart (else a tie).
    "paired": the ratios of the k-th samples (the same batches, timed in the same round, so
    a drift in the machine's speed between rounds cancels), median and range."""
    (s_med, s_lo, s_hi), (f_med, f_lo, f_hi) = ((r["epoch_s"], *r["epoch_s_range"]) for r in (slow, fast))
    out = {"median": s_med / f_med, "range": [s_lo / f_hi, s_hi / f_lo], "apart": s_lo > f_hi or f_lo > s_hi}
    pairs = [s / f for s, f in zip(slow.get("epoch_samples_s") or [], fast.get("epoch_samples_s") or [])]
    if pairs:
        out["paired"] = {"median": statistics.median(pairs), "range": [min(pairs), max(pairs)]}
    return out


def with_overheads(row: dict, seconds: float) -> dict:
    """A contender's epoch figures with `seconds` of overheads added to every sample."""
    return dict(row, epoch_s=row["epoch_s"] + seconds, epoch_s_range=[x + seconds for x in row["epoch_s_range"]],
                epoch_samples_s=[x + seconds for x in row.get("epoch_samples_s") or []])


def summarise(result: dict, statics: list[str]) -> None:
    """Best complete static, auto's speed-up over it (median, range, tie or not; with and without
    overheads: compiles for both, auto's calibration and search for auto), and per-bucket regret
    on medians (in place).

    A contender is complete when it can run every batch of the epoch; the best complete static
    is the complete `S@R` with the least median epoch time."""
    c = result["contenders"]

    def best_of(names):
        complete = [n for n in names if c[n]["epoch_s"] is not None]
        return min(complete, key=lambda n: c[n]["epoch_s"]) if complete else None, complete

    auto = c["auto"]
    best, complete = best_of(statics)
    result["best_complete_static"] = best
    result["complete_statics"] = sorted(complete, key=lambda n: c[n]["epoch_s"])
    result["auto_vs_best_complete_static"] = ratio(c[best], auto) if best and auto["epoch_s"] else None
    if best and auto["epoch_s"]:
        planning = sum(result["auto_overheads"].values())
        result["auto_vs_best_complete_static_with_overheads"] = ratio(
            with_overheads(c[best], c[best]["compile_s"]), with_overheads(auto, auto["compile_s"] + planning))
    best_oracle, _ = best_of([n for n in c if n.endswith("@best")])
    result["best_complete_strategy_at_best_remat"] = best_oracle
    result["auto_vs_best_strategy_at_best_remat"] = ratio(c[best_oracle], auto) if best_oracle and auto["epoch_s"] \
        else None
    regret = {}
    for b, n in result["bucket_steps"].items():
        if not n:
            continue
        rows = {name: r["per_bucket"][b] for name, r in c.items() if name in statics or name == "auto"}
        ran = {name: row["step_s"] for name, row in rows.items() if row.get("step_s")}
        if "auto" not in ran:
            regret[b] = {"auto_plan": rows["auto"]["plan"], "auto_step_s": None, "fastest": None, "regret": None}
            continue
        fastest = min((nm for nm in ran if nm != "auto"), key=ran.get, default="auto")
        ref = min(ran[fastest], ran["auto"])
        regret[b] = {"auto_plan": rows["auto"]["plan"], "auto_step_s": ran["auto"], "fastest": fastest,
                     "fastest_step_s": ran[fastest], "regret": ran["auto"] / ref - 1}
    result["regret"] = regret
    ceiling(result)


def ceiling(result: dict) -> None:
    """The ceiling (in place): per bucket the program with the least median step among every
    program timed there, the --unbounded ones over the budget included; its epoch samples (round
    k: sum over buckets of the epoch's batches x that program's k-th sample), the best complete
    fixed plan's epoch against it, and the share of that gap `auto` closed. Absent without
    --unbounded plans or a best complete fixed plan."""
    c = result["contenders"]
    best, auto = result.get("best_complete_static"), c["auto"]
    if not result.get("unbounded_plans") or not best or not auto["epoch_s"]:
        return
    fastest, samples = {}, []
    for b, n in result["epoch_bucket_steps"].items():
        if not n:
            continue
        # never empty: the best complete fixed plan ran in every bucket of the epoch
        timed = {name: r["per_bucket"][b] for name, r in c.items()
                 if not name.endswith("@best") and r["per_bucket"].get(b, {}).get("step_s")}
        name = min(timed, key=lambda nm: timed[nm]["step_s"])
        fastest[b] = {"program": name, "plan": timed[name]["plan"], "step_s": timed[name]["step_s"],
                      "bytes_per_device": timed[name]["bytes_per_device"]}
        samples.append((n, timed[name]["seconds"]))
    k = min(len(secs) for _, secs in samples)
    epochs = [sum(n * secs[i] for n, secs in samples) for i in range(k)]
    row = {"per_bucket": fastest, "epoch_samples_s": epochs, "epoch_s": statistics.median(epochs),
           "epoch_s_range": [min(epochs), max(epochs)]}
    gap = c[best]["epoch_s"] - row["epoch_s"]
    result["ceiling"] = dict(row, vs_best_complete_static=ratio(c[best], row),
                             auto_share_of_gap=(c[best]["epoch_s"] - auto["epoch_s"]) / gap if gap > 0 else None)


def time_model(trainer, result: dict) -> None:
    """The time model against the measured step times (in place): every distinct program run
    (bucket, plan) gets the planner's predicted step time, and whether the bucket is held out
    for it (no option of its plan was timed at that length by the calibration auto used).
    Summary per strategy (uniform plans) over held-out programs: median / max |error|, and per
    bucket whether the predicted-fastest program among those run there is the measured-fastest."""
    import numpy as np
    planner = trainer.planner
    times = getattr(planner.hardware, "layer_times", None)
    timed_at = {label: {int(s) for _, s, _ in pts} for label, pts in (times.points.items() if times else [])}
    default = trainer.config.model.remat
    programs = {}
    for name, r in result["contenders"].items():
        if name in result.get("unbounded_plans", ()):  # over the budget: no plan auto could pick
            continue
        for b, row in r["per_bucket"].items():
            if row.get("step_s") and row.get("plan"):
                programs.setdefault((b, row["plan"]), row["step_s"])
    rows, per_strategy = [], {}
    for (b, pid), measured in sorted(programs.items(), key=lambda kv: (int(kv[0][0]), kv[0][1])):
        plan = planner.parse(pid)
        s = int(b)
        _, predicted = planner.predict(s, trainer.data.batch_size(s), plan)
        fitted = any(s in timed_at.get(f"{run.strategy}@{run.remat or default}", ()) for run in plan.runs)
        rows.append({"bucket": s, "plan": pid, "measured_s": measured, "predicted_s": predicted,
                     "error": predicted / measured - 1, "held_out": not fitted})
        if not fitted and len(plan.strategies()) == 1:
            per_strategy.setdefault(plan.strategies()[0], []).append(abs(predicted / measured - 1))
    ranking = {}
    for b in sorted({row["bucket"] for row in rows}):
        here = [row for row in rows if row["bucket"] == b]
        pick, best = min(here, key=lambda x: x["predicted_s"]), min(here, key=lambda x: x["measured_s"])
        ranking[str(b)] = {"predicted_fastest": pick["plan"], "measured_fastest": best["plan"],
                           "loss": pick["measured_s"] / best["measured_s"] - 1}
    result["time_model"] = {
        "programs": rows, "ranking": ranking,
        "held_out_error": {k: {"median": float(np.median(v)), "max": float(np.max(v)), "n": len(v)}
                           for k, v in sorted(per_strategy.items())}}


def max_lengths(trainer, result: dict, cap: int) -> None:
    """Max trainable length of every strategy at its best remat, and of auto (in place)."""
    start = trainer.data.buckets[-1]
    c = result["contenders"]
    for s in STATIC:
        for r, (length, at_cap) in strategy_max_lengths(trainer, s, start, cap).items():
            c[f"{s}@{r}"]["max_len"], c[f"{s}@{r}"]["max_len_capped"] = length, at_cap
    length, capped = max_length(lambda n: auto_fits_at(trainer, n), start, cap)
    c["auto"]["max_len"], c["auto"]["max_len_capped"] = length, capped
    tp_sp = c["tp_sp@best"]["max_len"]
    result["metp_vs_tp_sp_max_len"] = c["metp@best"]["max_len"] / tp_sp if tp_sp else None
    result["auto_vs_tp_sp_max_len"] = length / tp_sp if tp_sp else None


def print_compiled(c, buckets) -> None:
    """One line: a contender's XLA bytes per device at each bucket, marked where over budget."""
    print(f"compiled {c.name:13s} " + "  ".join(
        f"{b}:{c.bytes[b] / 2**20:.0f}M{'' if b in c.programs else '(over)'}" if b in c.bytes else f"{b}:—"
        for b in buckets), flush=True)


def step_cell(row: dict) -> str:
    """A bucket's step time: median [min-max] over its batches, or a dash where it did not run."""
    if not row.get("step_s"):
        return "—"
    lo, hi = row["step_s_range"]
    return f"{row['step_s']:.2f} [{lo:.2f}-{hi:.2f}]"


def _ratio_text(r: Optional[dict]) -> str:
    if not r:
        return "n/a"
    lo, hi = r["range"]
    paired = r.get("paired")
    return (f"{r['median']:.3f}x (range {lo:.3f}-{hi:.3f}{'' if r['apart'] else ', ranges overlap: a tie'})"
            + (f", paired by round {paired['median']:.3f}x ({paired['range'][0]:.3f}-{paired['range'][1]:.3f})"
               if paired else ""))


def print_table(result: dict) -> None:
    c = result["contenders"]
    buckets = [b for b, n in result["bucket_steps"].items() if n]
    print(f"\n{result['devices']} x {result['platform']}, budget {result['budget_bytes'] / 2**20:.0f} MiB/device, "
          f"data {result['data']}{' (negative case: every batch in the longest bucket)' if result['negative'] else ''}"
          f"; measured {result['bucket_steps']} batches per bucket, each the median of "
          f"{result.get('repeats_per_batch', 1)} runs; epoch {result['epoch_bucket_steps']}; "
          "seconds per step: median [min-max] over batches; epoch = sum of epoch batches x step")
    width = max(22, *(len(step_cell(r["per_bucket"][b])) for r in c.values() for b in buckets))
    nw = max(17, *(len(n) for n in c))
    print(f"{'contender':<{nw}} {'epoch s median [min-max]':>27} {'compile s':>9} " + " ".join(f"{b:>{width}}" for b in buckets)
          + f" {'max len':>8}")
    key = lambda n: (c[n]["epoch_s"] is None, c[n]["epoch_s"] or 0, c[n]["epoch_steps_cannot_run"])  # noqa: E731
    for name in ["auto"] + sorted((n for n in c if n != "auto"), key=key):
        r = c[name]
        ml = r.get("max_len")
        ml = "" if ml is None else ((">=" if r.get("max_len_capped") else "") + str(ml))
        epoch = (f"{r['epoch_s']:.0f} [{r['epoch_s_range'][0]:.0f}-{r['epoch_s_range'][1]:.0f}]"
                 if r["epoch_s"] is not None else f"— ({r['epoch_steps_cannot_run']} batches cannot run)")
        print(f"{name:<{nw}} {epoch:>27} {r['compile_s']:9.0f} "
              + " ".join(f"{step_cell(r['per_bucket'][b]):>{width}}" for b in buckets) + f" {ml:>8}")
    print("auto's plan per bucket: " + ", ".join(f"{b}: {c['auto']['per_bucket'][b]['plan']}" for b in buckets))
    o = result["auto_overheads"]
    print(f"auto's overheads: calibration {o['calibrate_memory_s']:.0f} s (memory) + {o['calibrate_time_s']:.0f} s "
          f"(layer times), search {o['search_s']:.2f} s; programs compiled: auto {c['auto']['programs_compiled']} "
          f"({c['auto']['compile_s']:.0f} s)")
    best = result["best_complete_static"]
    print(f"best complete static: {best or 'none runs every batch'}"
          + (f"; its epoch time / auto's = {_ratio_text(result['auto_vs_best_complete_static'])}; with overheads "
             f"(compiles; auto's calibration and search) {_ratio_text(result['auto_vs_best_complete_static_with_overheads'])}"
             if result.get("auto_vs_best_complete_static") else ""))
    ceil = result.get("ceiling")
    if ceil:
        share = ceil["auto_share_of_gap"]
        print("ceiling (per bucket the fastest program timed, at any budget: "
              + ", ".join(f"{b}: {r['plan']} {r['bytes_per_device'] / 2**20:.1f} MiB" for b, r in ceil["per_bucket"].items())
              + f"): epoch {ceil['epoch_s']:.0f} [{ceil['epoch_s_range'][0]:.0f}-{ceil['epoch_s_range'][1]:.0f}]; "
              f"{best}'s epoch / the ceiling's = {_ratio_text(ceil['vs_best_complete_static'])}"
              + (f"; auto closed {share:.0%} of that gap" if share is not None else ""))
    bo = result["best_complete_strategy_at_best_remat"]
    if bo and result.get("auto_vs_best_strategy_at_best_remat"):
        print(f"best complete strategy at its best remat per bucket (an oracle): {bo}; its epoch time / auto's = "
              f"{_ratio_text(result['auto_vs_best_strategy_at_best_remat'])}")
    print("per-bucket regret (auto's median step / the fastest static's median there - 1): " + ", ".join(
        f"{b}: {r['regret']:+.1%} ({r['fastest']})" if r["regret"] is not None else f"{b}: auto cannot run"
        for b, r in result["regret"].items()))
    if result.get("metp_vs_tp_sp_max_len"):
        print(f"max trainable length at best remat: metp / tp_sp = {result['metp_vs_tp_sp_max_len']:.2f}x, "
              f"auto / tp_sp = {result['auto_vs_tp_sp_max_len']:.2f}x")
    tm = result.get("time_model")
    if tm:
        print("time model, held-out buckets, |predicted / measured step - 1| per strategy (median / max, n): "
              + ", ".join(f"{k} {v['median']:.1%} / {v['max']:.1%} ({v['n']})" for k, v in tm["held_out_error"].items()))
        print("predicted-fastest vs measured-fastest program per bucket: " + ", ".join(
            f"{b}: {r['predicted_fastest']} vs {r['measured_fastest']} ({r['loss']:+.1%})" for b, r in tm["ranking"].items()))


def write_png(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = result["contenders"]
    buckets = [b for b, n in result["bucket_steps"].items() if n]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(13, 4.8))
    shown = ["auto"] + [n for n in c if n.endswith("@best")]
    for name in shown:
        r = c[name]
        style = dict(lw=3, color="k") if name == "auto" else {}
        xs = [int(b) for b in buckets]
        ax_t.plot(xs, [r["per_bucket"][b].get("step_s") or float("nan") for b in buckets], marker="o",
                  label=name, **style)
        ax_m.plot(xs, [(r["per_bucket"][b]["bytes_per_device"] or float("nan")) / 2**20 for b in buckets],
                  marker="o", label=name, **style)
    for b in buckets:
        row = c["auto"]["per_bucket"][b]
        if row["bytes_per_device"]:
            ax_m.annotate(row["plan"], (int(b), row["bytes_per_device"] / 2**20), fontsize=7, rotation=20)
    ax_m.axhline(result["budget_bytes"] / 2**20, color="r", ls="--", label="budget")
    for ax, label in ((ax_t, "seconds per step (where it runs)"), (ax_m, "MiB per device (XLA)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bucket length")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    ax_t.legend(fontsize=7)
    fig.suptitle(f"auto vs each strategy at its best remat ({result['data']}, {result['devices']} x "
                 f"{result['platform']}); auto's plan per bucket annotated")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


MIN_MAP_COUNT = 262144


def _check_map_count() -> None:
    """XLA:CPU maps memory sections for every compiled program and one process here holds ~100;
    Linux's default limit on mappings (65,530) ran out at the end of a run ("LLVM ERROR: Unable
    to allocate section memory")."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read())
    except (OSError, ValueError):
        return
    if limit < MIN_MAP_COUNT:
        sys.exit(f"error: vm.max_map_count is {limit}; this benchmark holds ~100 compiled programs and needs "
                 f"{MIN_MAP_COUNT}: run `sudo sysctl -w vm.max_map_count={MIN_MAP_COUNT}` and start it again")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="config overrides, as train.py's (e.g. data.buckets=[512,2048,8192] data.tokens_per_batch=8192)")
    ap.add_argument("--budget-gb", type=float, help="per-device budget in GiB (default: the config's)")
    ap.add_argument("--data", default="stdlib", choices=("stdlib", "githubcode", "grch38"))
    ap.add_argument("--num-docs", type=int, default=400, help="synthetic documents (--data githubcode/grch38)")
    ap.add_argument("--negative", action="store_true", help="every batch in the longest bucket (auto should tie)")
    ap.add_argument("--per-bucket", type=int, default=None,
                    help=f"batches timed per bucket (at least {MIN_SAMPLES}; default {MIN_SAMPLES})")
    ap.add_argument("--repeats", type=int, default=3,
                    help="runs of every program on each batch; its sample there is their median (default 3)")
    ap.add_argument("--max-len-cap", type=int, default=262144,
                    help="largest length the max-length search tries (found at the cap: reported as >=)")
    ap.add_argument("--no-max-len", action="store_true", help="skip the max-length search")
    ap.add_argument("--quick", action="store_true",
                    help="no max-length search (with --per-bucket: that many batches per bucket)")
    ap.add_argument("--workdir", help="compile cache and cost-model calibration (default: a fresh temporary "
                    "folder, so calibration and compiles are measured; reuse one to skip them on a rerun)")
    ap.add_argument("--plans", nargs="*", default=[], metavar="PLAN_ID",
                    help="also time these written plans, each one fixed plan for every bucket (e.g. a mix "
                         "`auto` picked in another run: ring:2@selective,metp:2@selective); reported beside "
                         "the others, not counted among the S@R contenders")
    ap.add_argument("--unbounded", nargs="*", default=[], metavar="PLAN_ID",
                    help="also time these written plans at any memory, over the budget too (e.g. "
                         "ulysses@selective ulysses@none): the ceiling, the fastest program timed per bucket "
                         "at any budget, against the best fixed plan; not contenders")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--png", help="write the plot here (default: next to --json)")
    ap.add_argument("--time-model-of", metavar="JSON", help="add the time-model check to this result file of "
                    "an earlier run (same --config/--budget-gb/--data/--workdir; nothing is measured again)")
    args = ap.parse_args(argv)
    if args.quick:
        args.no_max_len = True
    if args.per_bucket is None:
        args.per_bucket = MIN_SAMPLES
    if args.repeats < 1:
        sys.exit(f"error: --repeats {args.repeats}: every program runs at least once on each batch")
    if args.per_bucket < MIN_SAMPLES:
        sys.exit(f"error: --per-bucket {args.per_bucket}: a figure needs at least {MIN_SAMPLES} samples per bucket")
    _check_map_count()

    import tempfile

    import dysejax
    from dysejax import runtime
    from sharding.plan import PlanSyntaxError, parse_plan
    from sharding.strategies import STRATEGIES

    work = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="dynamic_lengths_"))
    fresh = not os.path.exists(os.path.join(work, "costmodel"))
    try:
        buckets = dysejax.load_config(args.config, args.set).data.buckets
        cfg = dysejax.load_config(args.config, args.set + overrides(args, buckets) + [
            "parallel.plan=auto", f"train.compile_cache_dir={os.path.join(work, 'jax_cache')}",
            f"parallel.costmodel_dir={os.path.join(work, 'costmodel')}"])
        written = [parse_plan(pid, cfg.model.n_layers, list(STRATEGIES), where="--plans") for pid in args.plans]
        unbounded = [parse_plan(pid, cfg.model.n_layers, list(STRATEGIES), where="--unbounded")
                     for pid in args.unbounded]
    except (dysejax.ConfigError, PlanSyntaxError) as e:
        sys.exit(f"error: {e}")
    runtime.configure_host_devices(cfg.parallel.cpu_devices)
    import jax
    t_start = time.time()
    trainer = dysejax.Trainer(cfg, workdir=os.path.join(work, "trainer"), verbose=True)
    if trainer.budget is None:
        sys.exit("error: the benchmark needs a per-device budget: pass --budget-gb or set parallel.memory_budget_gb")
    if args.time_model_of:
        import json
        with open(args.time_model_of) as f:
            result = json.load(f)
        time_model(trainer, result)
        print_table(result)
        write_json(args.time_model_of, result)
        return
    auto = build_auto(trainer)  # the planner calibrated and searched inside Trainer(); this compiles
    statics = {}
    for s in STATIC:
        for r in REMATS:
            c = build_static(trainer, s, r)
            statics[c.name] = c
            print_compiled(c, trainer.data.buckets)
    fixed = {plan.id: build_fixed(trainer, plan.id, plan) for plan in written}
    fixed.update({plan.id + NO_BUDGET: build_fixed(trainer, plan.id + NO_BUDGET, plan, bounded=False)
                  for plan in unbounded})
    for c in fixed.values():
        print_compiled(c, trainer.data.buckets)
    print("auto: " + "  ".join(f"{b}:{auto.plan_ids[b]}={auto.bytes[b] / 2**20:.0f}M" for b in trainer.data.buckets))
    batches, epoch_steps = choose_batches(trainer.data, args.per_bucket)
    bucket_steps = {b: sum(p.bucket == b for p in batches) for b in trainer.data.buckets}
    print(f"{len(batches)} batches, per bucket {bucket_steps}; the epoch has {epoch_steps}", flush=True)
    timings = measure(trainer, [auto, *statics.values(), *fixed.values()], batches, repeats=args.repeats)
    oracles = {f"{s}@best": oracle_over_remat(s, statics, timings, trainer.data.buckets) for s in STATIC}
    every = {"auto": auto, **statics, **oracles, **fixed}
    result = {"budget_bytes": int(trainer.budget), "data": args.data, "negative": args.negative,
              "config": os.path.relpath(args.config), "devices": jax.device_count(),
              "platform": jax.devices()[0].platform, "buckets": trainer.data.buckets,
              "batch_sizes": trainer.data.batch_sizes, "bucket_steps": {str(b): n for b, n in bucket_steps.items()}, "repeats_per_batch": args.repeats,
              "written_plans": [n for n in fixed if not n.endswith(NO_BUDGET)],
              "unbounded_plans": [n for n in fixed if n.endswith(NO_BUDGET)],
              "epoch_bucket_steps": {str(b): n for b, n in epoch_steps.items()},
              "fresh_workdir": fresh, "auto_overheads": dict(trainer.planner.overheads),
              "compiles_after_warmup": timings.compiles_after_warmup,
              "contenders": {name: tally(c, timings, bucket_steps, epoch_steps) for name, c in every.items()}}
    if args.json:  # the measurements are safe before anything is derived from them
        write_json(args.json, result)
    summarise(result, list(statics))
    time_model(trainer, result)
    if not args.no_max_len:
        max_lengths(trainer, result, args.max_len_cap)
    result["wall_s"] = time.time() - t_start
    print_table(result)
    if args.json:
        write_json(args.json, result)
    png = args.png or (os.path.splitext(args.json)[0] + ".png" if args.json else None)
    if png:
        write_png(result, png)
        print(f"plot: {png}")


if __name__ == "__main__":
    main()
