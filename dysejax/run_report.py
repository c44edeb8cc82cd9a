"""What a training run prints: the plan of every bucket before it, a line per `train.log_every`
steps while it runs (when no progress bar shows), and a per-bucket summary after it.

Pure functions over plain rows (the warmup report, metrics rows), so the notebook and tests
read the same figures the CLI prints.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Callable, Optional, Sequence


def _gib(n: Optional[float]) -> str:
    return "-" if n is None else f"{n / 2**30:.4f}"


def remat_of(plan_id: str) -> str:
    """The remat policies of a plan id (`dp:1,fsdp:1@full` -> `none,full`)."""
    policies = [run.partition("@")[2] or "none" for run in plan_id.split(",")]
    return ",".join(dict.fromkeys(policies))


def plan_rows(warmup_report: Sequence[dict], predicted: Optional[Callable[[int, int, str], Optional[int]]] = None
              ) -> list[dict]:
    """One row per bucket: the train program selected at warmup (plan, remat, XLA bytes per
    device, compile s) and the cost model's predicted bytes for it when known
    (`predicted(seq_len, batch_size, plan_id)`, None when unknown)."""
    rows = []
    for r in warmup_report:
        if r["kind"] != "train" or not r["selected"]:
            continue
        rows.append({"seq_len": r["seq_len"], "batch_size": r["batch_size"], "plan": r["plan"],
                     "remat": remat_of(r["plan"]), "xla_bytes": r["bytes_per_device"],
                     "predicted_bytes": predicted(r["seq_len"], r["batch_size"], r["plan"]) if predicted else None,
                     "compile_s": r["compile_s"]})
    return sorted(rows, key=lambda r: r["seq_len"])


def format_plan_table(rows: Sequence[dict], budget: Optional[int], source: str) -> str:
    """The plan table printed before training."""
    limit = "unlimited" if budget is None else f"{budget / 2**30:.3f} GiB"
    wp = max([28] + [len(r["plan"]) for r in rows])  # columns as wide as the longest plan id
    wr = max([10] + [len(r["remat"]) for r in rows])
    lines = [f"plans ({source}; budget {limit} per device):",
             f"{'bucket':>7} {'batch':>6}  {'plan':<{wp}} {'remat':<{wr}} {'predicted GiB':>13} {'XLA GiB':>9} "
             f"{'compile s':>9}"]
    for r in rows:
        lines.append(f"{r['seq_len']:>7} {r['batch_size']:>6}  {r['plan']:<{wp}} {r['remat']:<{wr}} "
                     f"{_gib(r['predicted_bytes']):>13} {_gib(r['xla_bytes']):>9} {r['compile_s']:>9.2f}")
    return "\n".join(lines)


def format_step(row: dict, target: int) -> str:
    """One log line of a train step."""
    width = len(str(target))
    of = f" of {row['mfu_of']}" if row.get("mfu_of") else ""
    mfu = f"  MFU {100 * row['mfu']:.2f}%{of}" if row.get("mfu") is not None else ""
    ev = f"  eval {row['eval_loss']:.4f}" if "eval_loss" in row else ""
    return (f"step {row['step']:>{width}}/{target}  bucket {row['bucket']:>5} x {row['batch_size']:<4} "
            f"plan {row['plan']:<14} loss {row['loss']:.4f}{ev}  tok/s {row['tokens_per_s']:>9,.0f}  "
            f"step {row['step_time_s']:.3f} s{mfu}")


def eval_metrics(sums: dict[int, tuple[float, float]]) -> dict:
    """Held-out loss and perplexity from per-bucket (loss sum, tokens), overall and per bucket:
    {"eval_loss", "eval_ppl", "eval_tokens", "eval_loss_<L>", "eval_ppl_<L>", "eval_tokens_<L>", ...}."""
    out = {}
    for name, (total, count) in [("", [sum(v[i] for v in sums.values()) for i in (0, 1)])] + \
            sorted((f"_{b}", v) for b, v in sums.items()):
        if count:
            out[f"eval_loss{name}"] = total / count
            out[f"eval_ppl{name}"] = math.exp(min(total / count, 80.0))  # exp(80) ~ 5e34: not inf
            out[f"eval_tokens{name}"] = int(count)
    return out


class BucketRates:
    """Running tokens and step seconds per bucket (the per-bucket tokens/s of metrics rows)."""

    def __init__(self):
        self.tokens: dict[int, int] = defaultdict(int)
        self.seconds: dict[int, float] = defaultdict(float)

    def add(self, bucket: int, tokens: int, seconds: float) -> float:
        """Count a step; returns the bucket's tokens/s so far."""
        self.tokens[bucket] += tokens
        self.seconds[bucket] += seconds
        return self.tokens[bucket] / self.seconds[bucket] if self.seconds[bucket] > 0 else 0.0


def summarize(rows: Sequence[dict]) -> dict:
    """Per bucket: steps, tokens, step seconds, tokens/s, mean MFU, plans; and the run's totals."""
    buckets: dict[int, dict] = {}
    for r in rows:
        b = buckets.setdefault(r["bucket"], {"bucket": r["bucket"], "steps": 0, "tokens": 0, "seconds": 0.0,
                                             "mfu_sum": 0.0, "plans": []})
        b["steps"] += 1
        b["tokens"] += r["tokens"]
        b["seconds"] += r["step_time_s"]
        b["mfu_sum"] += r.get("mfu") or 0.0
        if r["plan"] not in b["plans"]:
            b["plans"].append(r["plan"])
    per_bucket = []
    for b in sorted(buckets.values(), key=lambda b: b["bucket"]):
        mfu = b.pop("mfu_sum") / b["steps"]
        per_bucket.append(dict(b, tokens_per_s=b["tokens"] / b["seconds"] if b["seconds"] else 0.0, mfu=mfu))
    tokens, seconds = sum(b["tokens"] for b in per_bucket), sum(b["seconds"] for b in per_bucket)
    evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
    return {"buckets": per_bucket, "steps": len(rows), "tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds if seconds else 0.0,
            "first_loss": rows[0]["loss"] if rows else None, "last_loss": rows[-1]["loss"] if rows else None,
            "eval_loss": evals[-1] if evals else None}


def format_summary(summary: dict, wall_s: Optional[float] = None) -> str:
    """The per-bucket table printed after training."""
    lines = [f"{'bucket':>7} {'steps':>6} {'tokens':>11} {'time s':>8} {'tok/s':>9} {'MFU':>7}  plan"]
    for b in summary["buckets"]:
        lines.append(f"{b['bucket']:>7} {b['steps']:>6} {b['tokens']:>11,} {b['seconds']:>8.1f} "
                     f"{b['tokens_per_s']:>9,.0f} {100 * b['mfu']:>6.2f}%  {', '.join(b['plans'])}")
    lines.append(f"{'all':>7} {summary['steps']:>6} {summary['tokens']:>11,} {summary['seconds']:>8.1f} "
                 f"{summary['tokens_per_s']:>9,.0f}")
    if summary["steps"]:
        loss = f"loss {summary['first_loss']:.3f} -> {summary['last_loss']:.3f}"
        if summary["eval_loss"] is not None:
            loss += f", eval loss {summary['eval_loss']:.3f}"
        wall = f"; {wall_s:.1f} s wall clock (warmup, eval and checkpoints included)" if wall_s is not None else ""
        lines.append(loss + wall)
    return "\n".join(lines)
