"""The cluster-scale headline, predicted: `auto` against fixed plans on long-tailed epochs, 8 x H100 and 64 x A100-40GB.

MODEL PREDICTIONS, not measurements: every time comes from the cost model `parallel.plan: auto`
uses (`costmodel.table.cost_table` with the GPU profiles of `costmodel.hardware`), whose error
against published GPU measurements benchmarks/gpu_reference.py reports; that error is printed
next to every ratio (as a range: each side off by the median error, in opposite directions).

Setting: Llama2-7B (configs/7b.yaml: bf16 compute, f32 parameters and Adam moments), one epoch of
documents bucketed by length (powers of two from 1K; a document goes to the smallest bucket that
holds it, documents packed into rows of the bucket's length), 16K tokens per GPU per step (rows
= tokens / bucket length, rounded to what a strategy can split: a multiple of the batch axes for
model-parallel strategies, of all devices for dp / fsdp; at least that many), or micro-steps of
a half or a quarter of that (gradient accumulation), whichever is fastest per contender and
bucket. The per-device
budget is what the trainer plans with there (`dysejax.runtime.usable_bytes`: JAX's allocator
share less parallel.memory_headroom 0.05).

Contenders, each on the mesh (of those listed per cluster) where its epoch is fastest:
  * `auto`: per bucket the exact search's per-layer plan (`costmodel.search.exact_plan`) within
    the budget, the row count that makes the bucket fastest; its planning measured here (CPU
    seconds of the cost tables and searches of every mesh, row count and bucket of the epoch)
    and added to its epoch;
  * `S@R`: strategy S under remat R on every layer of every bucket (one fixed plan);
  * Megatron-style tuned static: the fastest of TP + SP (`tp_sp`) and CP (`ring`, over the
    model group) under any remat policy, one configuration for the epoch, that fits every batch
    (dysejax has no layer that combines TP and CP, so "TP 8 + CP" is priced as either alone).
A contender that cannot fit or serve some bucket cannot train that epoch (listed, no time).

Epochs: GitHubCode-like (dysejax's `githubcode` histogram, ParaDySe's), CommonCrawl-like (97% of
documents under 8K: shares assumed, see COMMONCRAWL), Wikipedia (the length histogram of
FlexSP's sampled Wikipedia lengths, its repo's datasets/wikipedia.txt: 98.4% under 8K), and the
negative case: every document in the longest bucket.

    python benchmarks/cluster_headline.py --json benchmarks/results/cluster_headline.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Optional

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_io import write_json  # noqa: E402

from costmodel.cluster.workload import load_model  # noqa: E402
from costmodel.hardware import get_profile  # noqa: E402
from costmodel.memory import feasible_strategies  # noqa: E402
from costmodel.search import exact_plan  # noqa: E402
from costmodel.table import cost_table  # noqa: E402
from sharding.mesh import BATCH_AXES  # noqa: E402
from sharding.remat import NAMES as REMATS  # noqa: E402

K = 1024
STATIC = ("dp", "fsdp", "tp", "tp_sp", "ring", "ulysses", "metp")
MEGATRON = ("tp_sp", "ring")  # TP + SP, or CP (ring attention over the model group)
TOKENS_PER_GPU = 16 * K
CLUSTERS = {
    "8xH100": {"profile": "h100", "devices": 8, "max_len": 256 * K, "meshes": ({"data": 8},)},
    "64xA100-40GB": {"profile": "a100-40gb", "devices": 64, "max_len": 384 * K,
                     "meshes": ({"data": 64}, {"data": 8, "model": 8}, {"data": 4, "model": 16}, {"data": 2, "model": 32})},
}
BIN_EDGES = (0, 4 * K, 8 * K, 16 * K, 32 * K, 64 * K, 128 * K)  # lower edges; the last bin runs to max_len
COMMONCRAWL = (0.90, 0.07, 0.017, 0.008, 0.003, 0.0014, 0.0006)  # assumed: 97% under 8K, a long tail
WIKIPEDIA = (0.95604, 0.02797, 0.01122, 0.00347, 0.00103, 0.00023, 0.00005)  # FlexSP's sample (1,000,000 lengths)


def binned_lengths(shares, n: int, rng, max_len: int) -> np.ndarray:
    """n lengths: a bin by its share, log-uniform inside it (the last bin up to max_len)."""
    p = np.asarray(shares, dtype=float)
    bins = rng.choice(len(p), size=n, p=p / p.sum())
    lo = np.maximum(np.asarray(BIN_EDGES, dtype=float)[bins], 16.0)
    hi = np.append(np.asarray(BIN_EDGES[1:], dtype=float), max_len + 1.0)[bins]
    return np.floor(np.exp(rng.uniform(np.log(lo), np.log(hi)))).astype(np.int64)


def epochs(max_len: int, n_docs: int, seed: int = 0) -> dict:
    """{name: document lengths} of the long-tailed epochs and the negative case."""
    from dysejax.data.synthetic import sample_lengths
    rng = np.random.default_rng(seed)
    return {"githubcode": sample_lengths("githubcode", n_docs, rng, min_len=16, max_len=max_len),
            "commoncrawl-like": binned_lengths(COMMONCRAWL, n_docs, rng, max_len),
            "wikipedia (FlexSP sample)": binned_lengths(WIKIPEDIA, n_docs, rng, max_len),
            "every batch long": rng.integers(max_len // 2 + 1, max_len + 1, size=max(1, n_docs // 100))}


def bucket_rows(lengths: np.ndarray) -> dict:
    """{bucket length: rows of packed documents}."""
    buckets = 2 ** np.ceil(np.log2(np.maximum(lengths, K))).astype(np.int64)
    return {int(b): int(math.ceil(lengths[buckets == b].sum() / b)) for b in np.unique(buckets)}


def row_options(mesh: dict, bucket: int, devices: int) -> list:
    """Rows per micro-step at this bucket: the tokens per step, a half or a quarter of them
    (gradient accumulation keeps the global batch) in rows, each rounded down to a multiple of
    the batch axes (model-parallel strategies) and of all devices (dp / fsdp), at least one such."""
    d = math.prod(n for a, n in mesh.items() if a in BATCH_AXES) if any(a not in BATCH_AXES for a in mesh) else 1
    out = set()
    for share in (1, 2, 4):
        want = TOKENS_PER_GPU * devices // bucket // share
        out |= {max(q, want // q * q) for q in (d, devices)}
    return sorted(out)


class Pricer:
    """Cost tables and auto's searches per (mesh, rows, bucket), built once, timed."""

    def __init__(self, model, profile: str, budget: float):
        self.model, self.profile, self.budget = model, profile, budget
        self.tables, self.auto, self.seconds = {}, {}, {}

    def planning_s(self, meshes, buckets, devices: int) -> float:
        """CPU seconds (process time: other tenants' load does not inflate it) of what `auto`
        plans for these buckets: the table and search of every mesh and row count."""
        return sum(self.seconds[(tuple(m.items()), r, b)] for m in meshes for b in buckets
                   for r in row_options(m, b, devices))

    def table(self, mesh: dict, rows: int, bucket: int):
        key = (tuple(mesh.items()), rows, bucket)
        if key not in self.tables:
            t0 = time.process_time()
            m = self.model
            names = feasible_strategies(m.spec, mesh, rows, bucket)
            table = None
            if names:
                table = cost_table(m.spec, mesh, rows, bucket, m.n_layers, m.vocab, param_bytes=m.param_bytes,
                                   hardware=self.profile, loss_chunk=m.loss_chunk)
            self.tables[key] = table
            if table is not None:
                self.auto[key] = exact_plan(table, self.budget)
            self.seconds[key] = time.process_time() - t0
        return self.tables[key], self.auto.get(key)

    def step(self, mesh: dict, rows: int, bucket: int, option: Optional[str]) -> Optional[tuple]:
        """(step seconds, plan id) of `option` (a label S@R; None: auto) there, None if it cannot run."""
        table, res = self.table(mesh, rows, bucket)
        if table is None:
            return None
        if option is None:
            return (res.time_s, res.plan_id) if res.fits else None
        labels = [c.label for c in table.choices]
        if option not in labels:
            return None
        plan = table.uniform(labels.index(option))
        return (table.plan_time(plan), option) if table.plan_bytes(plan) <= self.budget else None


def label(strategy: str, remat: str) -> str:
    return strategy if remat == "none" else f"{strategy}@{remat}"


def epoch_on(pricer: Pricer, mesh: dict, rows_by_bucket: dict, devices: int, option: Optional[str]) -> dict:
    """Epoch seconds of a contender on one mesh: per bucket the row count that makes it fastest."""
    total, per_bucket, missing = 0.0, {}, []
    for bucket, rows in sorted(rows_by_bucket.items()):
        best = None
        for r in row_options(mesh, bucket, devices):
            got = pricer.step(mesh, r, bucket, option)
            if got is not None:
                t = math.ceil(rows / r) * got[0]
                if best is None or t < best[0]:
                    best = (t, got[0], got[1], r, math.ceil(rows / r))
        if best is None:
            missing.append(bucket)
            continue
        total += best[0]
        per_bucket[bucket] = {"seconds": best[0], "step_s": best[1], "plan": best[2], "rows": best[3], "steps": best[4]}
    return {"epoch_s": None if missing else total, "cannot_train": missing, "buckets": per_bucket, "mesh": mesh}


def best_mesh(pricer: Pricer, meshes, rows_by_bucket: dict, devices: int, option: Optional[str]) -> dict:
    runs = [epoch_on(pricer, mesh, rows_by_bucket, devices, option) for mesh in meshes]
    done = [r for r in runs if r["epoch_s"] is not None]
    return min(done, key=lambda r: r["epoch_s"]) if done else min(runs, key=lambda r: len(r["cannot_train"]))


def error_band(reference: Optional[dict], cluster: str) -> dict:
    """The time model's error on the published points of this cluster's hardware (gpu_reference)."""
    if not reference:
        return {"median_abs_error": None, "points": []}
    prefix = ("maxtext", "jaxtoolbox", "nemo") if "H100" in cluster else ("flexsp-a2a",)
    pts = [p for p in reference["points"] if p["error"] is not None and not p.get("fitted")
           and p["id"].startswith(prefix)]
    errs = sorted(abs(p["error"]) for p in pts)
    band = {"median_abs_error": errs[len(errs) // 2] if errs else None, "points": [p["id"] for p in pts]}
    if "A100" in cluster:  # A100 compute is checked only against FlexSP's fitted model
        model = [abs(p["error"]) for p in reference["points"] if p.get("comparison")]
        band["compute_vs_flexsp_fit_median"] = sorted(model)[len(model) // 2] if model else None
    return band


def ratio_range(ratio: float, err: Optional[float]) -> Optional[list]:
    """The ratio with each side off by `err` in opposite directions."""
    return None if err is None else [ratio * (1 - err) / (1 + err), ratio * (1 + err) / (1 - err)]


def run_cluster(name: str, spec: dict, model, n_docs: int, reference: Optional[dict]) -> dict:
    from dysejax.runtime import usable_bytes
    profile = get_profile(spec["profile"])
    budget = float(usable_bytes(profile.memory_bytes, 0.05))
    pricer = Pricer(model, spec["profile"], budget)
    band = error_band(reference, name)
    err = band["median_abs_error"]
    out = {"profile": profile.name, "devices": spec["devices"], "budget_bytes": budget, "meshes": spec["meshes"],
           "tokens_per_step": TOKENS_PER_GPU * spec["devices"], "time_model_error": band, "epochs": {}}
    for dist, lengths in epochs(spec["max_len"], n_docs).items():
        rows = bucket_rows(lengths)
        auto = best_mesh(pricer, spec["meshes"], rows, spec["devices"], None)
        fixed = {label(s, r): best_mesh(pricer, spec["meshes"], rows, spec["devices"], label(s, r))
                 for s in STATIC for r in REMATS}
        complete = {k: v for k, v in fixed.items() if v["epoch_s"] is not None}
        best = min(complete, key=lambda k: complete[k]["epoch_s"]) if complete else None
        mega = {k: v for k, v in complete.items() if k.split("@")[0] in MEGATRON}
        mega_best = min(mega, key=lambda k: mega[k]["epoch_s"]) if mega else None
        planning = pricer.planning_s(spec["meshes"], rows, spec["devices"])
        auto_total = auto["epoch_s"] + planning if auto["epoch_s"] is not None else None
        e = {"docs": int(len(lengths)), "tokens": int(lengths.sum()), "max_len": int(lengths.max()),
             "share_under_8k": float((lengths < 8 * K).mean()), "rows_by_bucket": rows, "auto": auto,
             "auto_planning_cpu_s": planning, "auto_epoch_with_planning_s": auto_total, "fixed": fixed, "best_fixed": best, "megatron_style": mega_best}
        if auto_total and best:
            r = complete[best]["epoch_s"] / auto_total
            e["speedup_vs_best_fixed"], e["speedup_vs_best_fixed_range"] = r, ratio_range(r, err)
        if auto_total and mega_best:
            r = mega[mega_best]["epoch_s"] / auto_total
            e["speedup_vs_megatron_style"], e["speedup_vs_megatron_style_range"] = r, ratio_range(r, err)
        # TP + SP alone (Megatron's layout inside a node) on the buckets it can train, auto on the same buckets
        tps = [k for k in fixed if k.split("@")[0] == "tp_sp" and fixed[k]["buckets"]]
        if tps and auto["epoch_s"] is not None:
            def on(k):
                served = set(fixed[k]["buckets"])
                return sum(x["seconds"] for b, x in fixed[k]["buckets"].items()), served
            k = min(tps, key=lambda k: (-len(on(k)[1]), on(k)[0]))
            t, served = on(k)
            mine = sum(x["seconds"] for b, x in auto["buckets"].items() if b in served)
            e["tp_sp_on_its_buckets"] = {"plan": k, "mesh": fixed[k]["mesh"], "buckets": sorted(served),
                                         "cannot_train": fixed[k]["cannot_train"], "epoch_s": t, "auto_s": mine,
                                         "speedup": t / mine, "speedup_range": ratio_range(t / mine, err)}
        for k, v in fixed.items():  # per-bucket detail kept for auto's two references only
            if k not in (best, mega_best):
                v.pop("buckets")
        out["epochs"][dist] = e
    out["planning_cpu_s_all_tables"] = sum(pricer.seconds.values())
    out["tables"] = len(pricer.tables)
    return out


def print_cluster(name: str, c: dict) -> None:
    band = c["time_model_error"]
    err = band["median_abs_error"]
    print(f"\n== {name}: {c['devices']} x {c['profile']}, {c['budget_bytes'] / 2**30:.1f} GiB budget/device, "
          f"{c['tokens_per_step']} tokens/step; meshes {', '.join(str(m) for m in c['meshes'])}")
    print(f"   time-model error on this hardware's published points (gpu_reference, held out): median "
          f"{'-' if err is None else f'{err:.1%}'} over {', '.join(band['points']) or 'none'}"
          + (f"; compute vs FlexSP's fitted model {band['compute_vs_flexsp_fit_median']:.0%} slower"
             if band.get("compute_vs_flexsp_fit_median") else ""))
    for dist, e in c["epochs"].items():
        print(f"\n  {dist}: {e['docs']} docs, {e['tokens'] / 1e6:.1f}M tokens, {e['share_under_8k']:.1%} under 8K, "
              f"max {e['max_len']}")
        a = e["auto"]
        print(f"  {'contender':<22} {'mesh':<26} {'epoch (s)':>12}  cannot train")
        rows = [("auto (+planning)", a, e["auto_epoch_with_planning_s"])]
        order = sorted(e["fixed"].items(), key=lambda kv: (kv[1]["epoch_s"] is None, kv[1]["epoch_s"] or 0))
        rows += [(k, v, v["epoch_s"]) for k, v in order]
        for k, v, t in rows[:8]:
            tag = " (best fixed)" if k == e["best_fixed"] else (" (Megatron-style)" if k == e["megatron_style"] else "")
            print(f"  {k + tag:<22} {str(v['mesh']):<26} {'-' if t is None else f'{t:12.1f}':>12}  "
                  f"{', '.join(str(b) for b in v['cannot_train'])}")
        if e["megatron_style"] and all(k != e["megatron_style"] for k, _, _ in rows[:8]):
            v = e["fixed"][e["megatron_style"]]
            print(f"  {e['megatron_style'] + ' (Megatron-style)':<22} {str(v['mesh']):<26} {v['epoch_s']:12.1f}")
        print(f"  ... {len(rows) - 8} more fixed plans in the JSON")
        for key, what in (("speedup_vs_best_fixed", f"best fixed {e['best_fixed']}"),
                          ("speedup_vs_megatron_style", f"Megatron-style {e['megatron_style']}")):
            if key in e:
                lo, hi = e[key + "_range"] or (None, None)
                rng = "" if lo is None else f" (with the time model's median error on either side: {lo:.2f}x-{hi:.2f}x)"
                print(f"  auto vs {what}: {e[key]:.2f}x{rng}")
        if "tp_sp_on_its_buckets" in e:
            x = e["tp_sp_on_its_buckets"]
            lo, hi = x["speedup_range"] or (0, 0)
            print(f"  auto vs {x['plan']} (TP + SP, Megatron's layer) on the buckets it trains (not "
                  f"{', '.join(map(str, x['cannot_train'])) or '-'}): {x['speedup']:.2f}x ({lo:.2f}x-{hi:.2f}x)")
        print(f"  per bucket: auto's plan, and seconds in the bucket (steps x rows per micro-step) of auto / best fixed "
              f"(auto's planning {e['auto_planning_cpu_s']:.1f} CPU s, counted in its epoch):")
        best = e["fixed"].get(e["best_fixed"], {"buckets": {}})
        for b, x in a["buckets"].items():
            f = best["buckets"].get(b)
            other = "-" if f is None else f"{f['seconds']:8.1f} s ({f['steps']} x {f['rows']})"
            print(f"    {b:>7}: {x['plan']:<42} {x['seconds']:8.1f} s ({x['steps']} x {x['rows']})  /  {other}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=20000, help="documents per long-tailed epoch")
    ap.add_argument("--clusters", default=",".join(CLUSTERS))
    ap.add_argument("--reference", default=os.path.join(ROOT, "benchmarks", "results", "gpu_reference.json"),
                    help="gpu_reference.py's JSON (the time model's error)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    t0 = time.time()
    reference = json.load(open(args.reference)) if os.path.exists(args.reference) else None
    model = load_model(os.path.join(ROOT, "configs", "7b.yaml"))
    out = {"label": "model predictions (costmodel, GPU profiles), not measurements", "model": "configs/7b.yaml",
           "tokens_per_gpu_per_step": TOKENS_PER_GPU, "clusters": {}}
    for name in args.clusters.split(","):
        out["clusters"][name] = run_cluster(name, CLUSTERS[name], model, args.docs, reference)
        print_cluster(name, out["clusters"][name])
    out["wall_s"] = time.time() - t0
    if args.json:
        write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
