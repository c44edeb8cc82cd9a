"""ParaDySe's setting simulated with the cost model: 8 devices (A100-80GB by default), GitHubCode / GRCh38 lengths.

MODEL PREDICTIONS, not measurements: every figure comes from `costmodel` (the calibrated memory
model and the alpha-beta time model with the device's profile), nothing runs on a GPU.

For each static strategy (its remat policy chosen per bucket: the fastest that fits) and for
`auto` (per-layer strategy and remat from the exact search):
  * max trainable length: the largest length (multiple of 1024, batch 1 - or the smallest
    batch the strategy accepts) whose plan fits the budget per device, by bisection;
  * time per epoch of a sample of the length distribution: sequences bucketed (powers of two),
    each bucket's steps x its predicted step time; sequences longer than a strategy's max
    length cannot be trained by it (reported as a share, and left out of its time).

The budget is the memory the trainer would plan with there: JAX's allocator's share of the
device (XLA_PYTHON_CLIENT_MEM_FRACTION, default 0.75) less `parallel.memory_headroom`.

Usage: python benchmarks/plan_gpu_sim.py [--config configs/1.3b.yaml] [--hardware a100-80gb]
                                         [--docs N] [--json OUT]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from results_io import write_json  # noqa: E402  (the script's folder is on sys.path)

from costmodel.hardware import get_profile  # noqa: E402
from costmodel.memory import feasible_strategies  # noqa: E402
from costmodel.search import exact_plan  # noqa: E402
from costmodel.table import REMATS, Choice, cost_table  # noqa: E402

MESH = {"data": 8}
STATIC = ("dp", "fsdp", "tp", "tp_sp", "ring", "ulysses", "metp")
TOKENS_PER_STEP = 65536


def batch_options(s: int, strategies) -> list[int]:
    """Rows of a step at length s: TOKENS_PER_STEP tokens, at least one row; batch-parallel
    strategies (dp, fsdp) need a multiple of 8 rows, so a set with both kinds tries both."""
    b = max(1, TOKENS_PER_STEP // s)
    options = set()
    if any(st in ("dp", "fsdp") for st in strategies):
        options.add(max(8, b // 8 * 8))
    if any(st not in ("dp", "fsdp") for st in strategies):
        options.add(b)
    return sorted(options)


def fitting_plans(spec, n_layers, vocab, s, strategies, hardware, budget) -> list:
    """[(result, batch)] of the fastest plan over `strategies` x remat that fits, per batch option."""
    out = []
    for b in batch_options(s, strategies):
        names = [st for st in feasible_strategies(spec, MESH, b, s) if st in strategies]
        if not names:
            continue
        table = cost_table(spec, MESH, b, s, n_layers, vocab, param_bytes=4, hardware=hardware,
                           choices=[Choice(st, r) for st in names for r in REMATS])
        res = exact_plan(table, budget)
        if res.fits:
            out.append((res, b))
    return out


def max_length(spec, n_layers, vocab, strategies, hardware, budget, hi=4 * 2**20) -> int:
    """Largest multiple of 1024 with a plan that fits (bisection; memory grows with s)."""
    def fits(s):
        return bool(fitting_plans(spec, n_layers, vocab, s, strategies, hardware, budget))
    lo_k, hi_k = 0, hi // 1024
    if not fits(1024):
        return 0
    lo_k = 1
    while lo_k < hi_k:
        mid = (lo_k + hi_k + 1) // 2
        if fits(mid * 1024):
            lo_k = mid
        else:
            hi_k = mid - 1
    return lo_k * 1024


def epoch(spec, n_layers, vocab, lengths, strategies, hardware, budget, plan_cache) -> dict:
    """Predicted time of one epoch over the sequences this choice set can train."""
    buckets = 2 ** np.ceil(np.log2(np.maximum(lengths, 1024))).astype(int)
    total, trained, plans = 0.0, 0, {}
    for s in sorted(set(buckets.tolist())):
        count = int((buckets == s).sum())
        key = (tuple(strategies), s)
        if key not in plan_cache:
            plan_cache[key] = fitting_plans(spec, n_layers, vocab, s, strategies, hardware, budget)
        if not plan_cache[key]:  # longer than this choice set can train
            continue
        res, b = min(plan_cache[key], key=lambda rb: math.ceil(count / rb[1]) * rb[0].time_s)
        total += math.ceil(count / b) * res.time_s
        trained += count
        plans[s] = res.plan_id
    return {"epoch_s": total, "trained_fraction": trained / len(lengths), "plans": plans}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "..", "configs", "1.3b.yaml"))
    ap.add_argument("--docs", type=int, default=20000, help="sequences sampled per distribution")
    ap.add_argument("--hardware", default="a100-80gb", help="device profile (costmodel.hardware)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    import dysejax
    from dysejax.data.synthetic import sample_lengths
    from dysejax.model.transformer import block_spec

    t0 = time.time()
    cfg = dysejax.load_config(args.config)
    spec, L, V = block_spec(cfg.model), cfg.model.n_layers, cfg.model.vocab_size
    from dysejax.runtime import usable_bytes
    hardware = args.hardware
    # what the trainer would plan with on that device: JAX's allocator's share less the headroom
    budget = float(usable_bytes(get_profile(hardware).memory_bytes, cfg.parallel.memory_headroom))
    sets = {name: (name,) for name in STATIC}
    sets["auto"] = STATIC
    out = {"label": f"model predictions (costmodel, {get_profile(hardware).name} profile), not measurements",
           "hardware": hardware, "device_bytes": get_profile(hardware).memory_bytes,
           "config": os.path.basename(args.config), "devices": 8, "budget_bytes": int(budget),
           "tokens_per_step": TOKENS_PER_STEP, "strategies": {}}
    max_lens = {name: max_length(spec, L, V, st, hardware, budget) for name, st in sets.items()}
    cache: dict = {}
    # every static strategy trains the sequences of the buckets (powers of two) up to this
    # (strategies that cannot train any length at this budget are left out of that figure)
    common = 2 ** int(math.log2(min(max_lens[name] for name in STATIC if max_lens[name]) or 1))
    out["common_max_len"] = common
    for dist in ("githubcode", "grch38"):
        lengths = sample_lengths(dist, args.docs, np.random.default_rng(0), max_len=max(max_lens.values()) * 2)
        for name, st in sets.items():
            e = epoch(spec, L, V, lengths, st, hardware, budget, cache)
            e["common_epoch_s"] = epoch(spec, L, V, lengths[lengths <= common], st, hardware, budget, cache)["epoch_s"]
            out["strategies"].setdefault(name, {"max_len": max_lens[name]})[dist] = e
    out["wall_s"] = time.time() - t0
    print(f"{out['label']}\n{cfg.model.n_layers}-layer d_model {cfg.model.d_model} ({out['config']}), 8 devices, "
          f"{budget / 2**30:.0f} GiB/device, {TOKENS_PER_STEP} tokens/step")
    print(f"epoch times: over the sequences each can train / over those every static strategy can "
          f"train (<= {common} tokens)")
    print(f"{'strategy':<9} {'max len':>9} | {'GitHubCode epoch (s)':>22} {'trained':>8} | "
          f"{'GRCh38 epoch (s)':>22} {'trained':>8}")
    for name, r in out["strategies"].items():
        cells = [f"{r[d]['epoch_s']:>10.1f} / {r[d]['common_epoch_s']:>9.1f} {r[d]['trained_fraction']:>8.1%}"
                 for d in ("githubcode", "grch38")]
        print(f"{name:<9} {r['max_len']:>9} | {cells[0]} | {cells[1]}")
    if args.json:
        write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
