"""The per-run picture, WORKDIR/run.png: loss vs step, tokens/s per bucket, and which plan ran
which step (bucket vs step, coloured by plan). Written at the end of a run and on demand
(`python train.py --config FILE --plot`, or `write_run_plot(workdir)` in a notebook)."""
from __future__ import annotations

import os
from typing import Optional

from dysejax.metrics import read_metrics
from dysejax.run_report import summarize

FILENAME = "run.png"


def write_run_plot(workdir: str, path: Optional[str] = None, title: Optional[str] = None) -> Optional[str]:
    """Draw the run in `workdir` from its metrics.jsonl to `path` (default WORKDIR/run.png); returns
    the path, or None when matplotlib is not installed or there are no rows yet."""
    try:
        import matplotlib
        import matplotlib.pyplot as plt
        from matplotlib.figure import Figure
    except ImportError:
        return None
    del matplotlib, plt  # Figure() draws without a GUI backend: safe in scripts and notebooks alike
    metrics = os.path.join(workdir, "metrics.jsonl")
    rows = read_metrics(workdir, "train") if os.path.exists(metrics) else []
    if not rows:
        return None
    path = path or os.path.join(workdir, FILENAME)
    fig = Figure(figsize=(15, 4.2))
    ax_loss, ax_rate, ax_plan = fig.subplots(1, 3)
    buckets = sorted({r["bucket"] for r in rows})
    colors = {b: f"C{i % 10}" for i, b in enumerate(buckets)}

    steps = [r["step"] for r in rows]
    ax_loss.plot(steps, [r["loss"] for r in rows], color="0.6", lw=1, zorder=1)
    for b in buckets:
        mine = [r for r in rows if r["bucket"] == b]
        ax_loss.scatter([r["step"] for r in mine], [r["loss"] for r in mine], s=12, color=colors[b],
                        label=f"bucket {b}", zorder=2)
    evals = [r for r in rows if "eval_loss" in r]
    if evals:
        ax_loss.plot([r["step"] for r in evals], [r["eval_loss"] for r in evals], "k--", marker="s", label="eval")
    ax_loss.set(xlabel="step", ylabel="loss", title="loss")
    ax_loss.legend(fontsize=7)

    summary = summarize(rows)
    per = summary["buckets"]
    xs = range(len(per))
    bars = ax_rate.bar(xs, [b["tokens_per_s"] for b in per], color=[colors[b["bucket"]] for b in per])
    for bar, b in zip(bars, per):
        ax_rate.annotate(f"{b['steps']} steps\nMFU {100 * b['mfu']:.1f}%", (bar.get_x() + bar.get_width() / 2,
                         bar.get_height()), ha="center", va="bottom", fontsize=7)
    ax_rate.set_xticks(list(xs), [str(b["bucket"]) for b in per])
    ax_rate.set(xlabel="bucket (tokens)", ylabel="tokens/s", title="throughput per bucket")
    ax_rate.margins(y=0.2)

    plans = list(dict.fromkeys(r["plan"] for r in rows))
    markers = "osD^v<>ph*"
    for i, plan in enumerate(plans):
        mine = [r for r in rows if r["plan"] == plan]
        ax_plan.scatter([r["step"] for r in mine], [r["bucket"] for r in mine], s=18, marker=markers[i % 10],
                        color=f"C{i % 10}", label=plan)
    ax_plan.set_yscale("log", base=2)
    ax_plan.set_yticks(buckets, [str(b) for b in buckets])
    ax_plan.minorticks_off()
    ax_plan.set(xlabel="step", ylabel="bucket (tokens)", title="plan per step")
    ax_plan.legend(fontsize=7, title="plan", title_fontsize=7)
    for ax in (ax_loss, ax_rate, ax_plan):
        ax.grid(True, alpha=0.3)
    fig.suptitle(title or f"{os.path.basename(os.path.abspath(workdir))}: {summary['steps']} steps, "
                 f"{summary['tokens']:,} tokens, {summary['tokens_per_s']:,.0f} tokens/s")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
