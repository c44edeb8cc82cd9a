"""The plan report (`train.py --plan`): per bucket, the plan that runs it and what the cost model
predicts for it, without training; and a PNG of predicted time and memory vs length for every
strategy, with the chosen plans and the budget line.

All figures are model predictions for `parallel.hardware`, per device; with a program cache
and the devices planned for here, each bucket's plan is also compiled and checked against XLA.
"""
from __future__ import annotations

import math
import sys
from typing import Optional

from costmodel.memory import feasible_strategies

JSON_KEYS = ("devices", "memory_budget_bytes", "buckets")


def plan_report(planner, programs=None) -> dict:
    """`{"devices", "memory_budget_bytes", "hardware", "buckets": [...]}` of a `Planner`.

    Buckets whose entry is `auto` report the search's choice (fits: the prediction is within the
    budget; when nothing fits, the closest plan with fits false); the others report their
    written plan's predictions; a bucket that does not fit says why (`reason`). Given the
    `programs` (a ProgramCache), when the devices are here and there is a budget, each bucket's
    plan is also verified as training would: its candidates are compiled in order (abstract
    inputs, nothing runs) and the first within the budget by XLA's figure is reported, with
    `xla_bytes`, and fits by that figure."""
    from dysejax.progress import Phase

    budget = planner.cost_model.budget  # planning a GPU from here: what JAX could use there
    verify = programs is not None and budget is not None and not isinstance(planner.hardware, str)
    buckets = planner.data.buckets
    rows = []
    phase = Phase("plan: compiling each bucket's plan to check it against XLA", total=len(buckets),
                  unit="bucket", log=lambda m: print(m, file=sys.stderr, flush=True), enabled=verify)
    with phase:
        for bucket in buckets:
            rows.append(_bucket_row(planner, programs if verify else None, bucket, budget))
            if verify:
                phase.update(1, f"bucket {bucket}")
    return {"devices": int(planner.mesh.devices.size), "memory_budget_bytes": None if budget is None else int(budget),
            "hardware": _hardware_name(planner.hardware), "verified_by_xla": verify, "buckets": rows}


def _bucket_row(planner, programs, bucket: int, budget: Optional[int]) -> dict:
    from dysejax.errors import PlanError

    batch = planner.data.batch_size(bucket)
    auto = bucket in planner.auto_buckets
    candidates = planner.candidates(bucket)
    plan, xla = candidates[0], None
    if programs is not None:
        try:
            program = programs.select("train", bucket, batch, candidates, budget)
        except PlanError:
            program = programs.get("train", bucket, batch, candidates[-1])
        plan, xla = program.plan, program.bytes_per_device
    nbytes, seconds = planner.predict(bucket, batch, plan)
    if xla is not None:
        fits = xla <= budget
    elif auto:  # the search's verdict (its byte bound is the conservative forward one)
        fits = planner.plan(bucket, batch).fits
    else:
        fits = budget is None or nbytes <= budget
    row = {"seq_len": bucket, "batch_size": batch, "plan": plan.as_data(), "predicted_bytes": int(nbytes),
           "predicted_step_s": float(seconds), "fits": bool(fits), "plan_id": plan.id, "auto": auto}
    if xla is not None:
        row["xla_bytes"] = int(xla)
    if not fits:
        row["reason"] = why_not(planner.state_bytes, budget, xla if xla is not None else nbytes, plan.id)
    return row


def state_over_budget(state_bytes: int, budget: Optional[int]) -> Optional[str]:
    """'parameters, ... alone need X GiB per device, over the budget of Y GiB', or None."""
    if budget is None or state_bytes <= budget:
        return None
    return (f"parameters, gradients and optimizer state alone need {state_bytes / 2**30:.4f} GiB per device, "
            f"over the budget of {budget / 2**30:.4f} GiB")


def why_not(state_bytes: int, budget: Optional[int], needs: float, plan_id: str) -> str:
    """Why a bucket's plan needing `needs` bytes does not fit: the state alone, or the batch on top of it."""
    over = state_over_budget(state_bytes, budget)
    if over:
        return f"{over}: raise parallel.memory_budget_gb or use more devices"
    return (f"{plan_id} needs {needs / 2**30:.4f} GiB per device: {state_bytes / 2**30:.4f} GiB of parameters, "
            f"gradients and optimizer state and the rest for this bucket's batch: lower data.tokens_per_batch, "
            f"raise parallel.memory_budget_gb or drop the bucket")


def why_nothing_fits(state_bytes: int, budget: Optional[int]) -> str:
    """'; <reason>' for a warmup failure when the state alone is over the budget (no batch fix helps)."""
    over = state_over_budget(state_bytes, budget)
    return f"; {over}, so no bucket can fit" if over else ""


def _hardware_name(hardware) -> str:
    return hardware if isinstance(hardware, str) else f"calibration {hardware.device_kind}"


def format_report(report: dict) -> str:
    """The report as a table (one line per bucket)."""
    budget = report["memory_budget_bytes"]
    lines = [f"plan report: {report['devices']} devices, budget "
             f"{'unlimited' if budget is None else f'{budget / 2**30:.3f} GiB'}/device, predictions for "
             f"{report['hardware']}",
             f"{'length':>8} {'batch':>6}  {'plan':<34} {'GiB/device':>11} {'XLA GiB':>9} {'step (ms)':>10}  fits"]
    for r in report["buckets"]:
        plan = r["plan_id"] + (" (auto)" if r["auto"] else "")
        xla = f"{r['xla_bytes'] / 2**30:>9.4f}" if "xla_bytes" in r else f"{'-':>9}"
        lines.append(f"{r['seq_len']:>8} {r['batch_size']:>6}  {plan:<34} {r['predicted_bytes'] / 2**30:>11.4f} "
                     f"{xla} {r['predicted_step_s'] * 1e3:>10.3f}  {'yes' if r['fits'] else 'NO'}")
        if "reason" in r:
            lines.append(f"{'':>16}NO: {r['reason']}")
    return "\n".join(lines)


def strategy_curves(planner, lengths) -> dict:
    """{strategy: [(length, bytes, seconds) ...]} of every strategy's uniform plan (model default
    remat) at `lengths`, with the batch the data pipeline gives each length."""
    from sharding.plan import Plan, Run

    curves: dict[str, list] = {}
    mesh_shape = dict(planner.mesh.shape)
    for s in lengths:
        batch = planner.data.batch_size(s)
        for name in feasible_strategies(planner.spec, mesh_shape, batch, s):
            nbytes, seconds = planner.predict(s, batch, Plan((Run(name, planner.config.model.n_layers),)))
            curves.setdefault(name, []).append((s, nbytes, seconds))
    return curves


def write_plot(planner, report: dict, path: str) -> Optional[str]:
    """Write the PNG; returns None (and writes nothing) when matplotlib is not installed."""
    try:
        from matplotlib.figure import Figure  # no GUI backend: safe in scripts and notebooks alike
    except ImportError:
        return None
    buckets = [r["seq_len"] for r in report["buckets"]]
    lo, hi = min(buckets), max(buckets)
    n = max(2, int(round(4 * math.log2(hi / lo))) + 1) if hi > lo else 1
    lengths = sorted({int(round(lo * (hi / lo) ** (i / max(1, n - 1)))) for i in range(n)} | set(buckets))
    curves = strategy_curves(planner, lengths)
    fig = Figure(figsize=(12, 4.5))
    ax_t, ax_m = fig.subplots(1, 2)
    for name, pts in sorted(curves.items()):
        xs, bs, ts = zip(*pts)
        ax_t.plot(xs, [t * 1e3 for t in ts], marker=".", label=name)
        ax_m.plot(xs, [b / 2**30 for b in bs], marker=".", label=name)
    xs = buckets
    ax_t.plot(xs, [r["predicted_step_s"] * 1e3 for r in report["buckets"]], "k*", ms=12, label="chosen plan")
    ax_m.plot(xs, [r["predicted_bytes"] / 2**30 for r in report["buckets"]], "k*", ms=12, label="chosen plan")
    if report["memory_budget_bytes"] is not None:
        ax_m.axhline(report["memory_budget_bytes"] / 2**30, color="r", ls="--", label="budget")
    for ax, label in ((ax_t, "predicted step time (ms)"), (ax_m, "predicted GiB per device")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length (bucket)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    ax_m.legend(fontsize=8)
    fig.suptitle(f"model predictions for {report['hardware']}, {report['devices']} devices")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path
