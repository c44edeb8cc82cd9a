"""Accuracy of the time model on held-out lengths and a held-out shape, per strategy and remat policy.

    python benchmarks/time_accuracy.py [--quick] [--json OUT] [--cache DIR] [--held-lengths N ...]

Every registered strategy under every remat policy (METP and `selective` included) has its 2-layer
step timed on this machine's devices (`costmodel.profile.measure_times`: interleaved rounds,
min of the runs) at lengths 256..16,384 with a fixed token budget per step (the headline
config's layer and batch sizes), and on a second layer shape at a few lengths. Three predictions
are checked against the measurements:

* per-model correction (what `auto` uses with `parallel.profile_time`): the shipped CPU rates
  (`costmodel/calibrations/cpu.json`, fitted by fit_cpu_calibration.py on another layer and other
  shapes) corrected per option by its times at two lengths (`costmodel.time_correction`),
  predicted at every other length: between the two (fitted at the shortest and longest length
  the option can run, as the trainer does with its buckets: `dp` and `fsdp` cannot split the
  batches of 4 and 1 rows, so they have no length between), and below and above them (fitted at
  two middle lengths);
* the shipped rates alone, at every length (what prices an option without `profile_time`);
* device rates fitted here (`costmodel.profile.fit_time`) on the middle lengths of the first
  shape, predicted at the shorter and longer lengths and on the second shape.

Errors are |predicted - measured| / measured of the per-layer time, reported per strategy
(median and max over its remat policies and held-out lengths). On CPU the simulated devices
share the cores; the step times are this machine's, not an accelerator's.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_io import write_json  # noqa: E402


def strategies() -> tuple[str, ...]:
    """Every registered strategy (imported late: the devices are set up first)."""
    from sharding.strategies import STRATEGIES
    return tuple(STRATEGIES)


def remats() -> tuple[str, ...]:
    """Every remat policy a plan can use."""
    from costmodel.table import REMATS
    return tuple(REMATS)


TOKENS = 16384  # tokens per step, as in configs/dynamic.yaml
LENGTHS = (256, 512, 1024, 2048, 4096, 8192, 16384)
QUICK_LENGTHS = (256, 1024, 4096, 16384)
HELD_LENGTHS = (512, 2048, 8192)


def specs():
    from sharding.ops.blocks import BlockSpec
    # the headline config's layer (configs/dynamic.yaml) and a held-out shape: wider heads, plain GELU MLP
    main = BlockSpec(n_heads=8, head_dim=16, d_model=128, d_ff=384, gated=True, activation="silu",
                     attention_block=512)
    held = BlockSpec(n_heads=8, head_dim=8, d_model=64, d_ff=256, gated=False, activation="gelu",
                     attention_block=256)
    return main, held


def batch_for(seq_len: int, devices: int) -> int:
    """The trainer's batch rule (dysejax.data.bucketing.batch_size) for TOKENS per step."""
    from dysejax.data.bucketing import batch_size
    return batch_size(seq_len, TOKENS, devices, 1)


def measure(cache: dict, path: str, mesh, spec, label: str, lengths, repeats: int, log) -> list:
    """TimeSamples of every option at every length (cached by label, length and option)."""
    from costmodel.profile import TimeSample, measure_times
    options = [(s, r) for s in strategies() for r in remats()]
    for n in lengths:
        b = batch_for(n, mesh.devices.size)
        todo = [o for o in options if f"{label}|{n}|{o[0]}@{o[1]}" not in cache]
        if not todo:
            continue
        t0 = time.time()
        got = measure_times(mesh, spec, b, [n], options=todo, n_layers=2, repeats=repeats)
        for o in todo:
            cache.setdefault(f"{label}|{n}|{o[0]}@{o[1]}", None)  # not servable at this shape
        for smp in got:
            cache[f"{label}|{n}|{smp.strategy}@{smp.remat}"] = smp.to_json()
        with open(path, "w") as fh:
            json.dump(cache, fh)
        log(f"  {label} s={n} b={b}: timed {len(got)} programs in {time.time() - t0:.0f} s")
    return [TimeSample.from_json(cache[f"{label}|{n}|{s}@{r}"]) for n in lengths for s in strategies()
            for r in remats() if cache.get(f"{label}|{n}|{s}@{r}")]


def correction_errors(cal, samples, fit_lengths=None) -> list[dict]:
    """Fit each option's correction at `fit_lengths`, or (None) at the shortest and longest
    length it was measured at, as the trainer does with its buckets; predict its other lengths."""
    from costmodel.time_correction import OptionTimes, label_of
    measured_at: dict = {}
    for smp in samples:
        measured_at.setdefault(label_of(smp.strategy, smp.remat), set()).add(smp.shape.seq_len)
    fit_at = {label: set(fit_lengths) if fit_lengths else {min(at), max(at)} for label, at in measured_at.items()}
    points = {}
    for smp in samples:
        label = label_of(smp.strategy, smp.remat)
        if smp.shape.seq_len in fit_at[label]:
            points.setdefault(label, []).append([smp.shape.batch, smp.shape.seq_len, smp.seconds / smp.n_layers])
    spec = samples[0].shape.spec
    fitted = cal.with_layer_times(OptionTimes(asdict(spec), points))
    rows = []
    for smp in samples:
        label = label_of(smp.strategy, smp.remat)
        if smp.shape.seq_len in fit_at[label] or label not in points:
            continue
        pred = fitted.layer_time(smp.shape, smp.strategy, smp.remat)
        meas = smp.seconds / smp.n_layers
        rows.append({"strategy": smp.strategy, "remat": smp.remat, "seq_len": smp.shape.seq_len,
                     "batch": smp.shape.batch, "measured_s": meas, "predicted_s": pred,
                     "err": abs(pred - meas) / meas, "how": fitted.option_scales(smp.shape)[label].how})
    return rows


def rate_errors(cal, samples, label: str) -> list[dict]:
    from costmodel.time import layer_time
    rows = []
    for smp in samples:
        pred = layer_time(smp.shape, smp.strategy, smp.remat, cal.time).total + cal.step_overhead_s / smp.n_layers
        meas = smp.seconds / smp.n_layers
        rows.append({"set": label, "strategy": smp.strategy, "remat": smp.remat, "seq_len": smp.shape.seq_len,
                     "measured_s": meas, "predicted_s": pred, "err": abs(pred - meas) / meas})
    return rows


def per_strategy(rows: list[dict]) -> dict:
    out = {}
    for s in strategies():
        errs = [r["err"] for r in rows if r["strategy"] == s]
        if errs:
            out[s] = {"median": float(np.median(errs)), "max": float(np.max(errs)), "n": len(errs)}
    errs = [r["err"] for r in rows]
    out["all"] = {"median": float(np.median(errs)), "max": float(np.max(errs)), "n": len(errs)} if errs else {}
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="lengths 256, 1024, 4096, 16384 only")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--cache", default=os.path.join("runs", "time_accuracy"), help="measured samples (reused)")
    ap.add_argument("--held-lengths", type=int, nargs="+", default=list(HELD_LENGTHS),
                    help="lengths of the held-out shape (XLA:CPU aborts some programs at 8,192 here)")
    ap.add_argument("--calibration", metavar="JSON", help="price with this calibration instead of the shipped one "
                    "(e.g. an earlier commit's costmodel/calibrations/cpu.json, with --cache: nothing is timed again)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    from dysejax import runtime
    runtime.configure_host_devices(8)
    from costmodel.calibration import Calibration, default_calibration, device_kind_of
    from costmodel.profile import fit_time
    from sharding.mesh import build_mesh

    t0 = time.time()
    mesh = build_mesh({"data": 8})
    os.makedirs(args.cache, exist_ok=True)
    path = os.path.join(args.cache, "samples.json")
    cache = json.load(open(path)) if os.path.exists(path) else {}
    main_spec, held_spec = specs()
    lengths = QUICK_LENGTHS if args.quick else LENGTHS
    log = lambda m: print(m, flush=True)  # noqa: E731
    log("timing every option (strategy x remat) on this machine")
    main_samples = measure(cache, path, mesh, main_spec, "main", lengths, args.repeats, log)
    held_samples = measure(cache, path, mesh, held_spec, "held", args.held_lengths, args.repeats, log)

    mid = lengths[1:-1]
    inner = (mid[0], mid[-1])
    kind = device_kind_of(mesh)
    coeffs, step, fit = fit_time([s for s in main_samples if s.shape.seq_len in mid], name=kind)
    cal = Calibration(kind, dict(mesh.shape), coeffs, step_overhead_s=step, meta={"fit": fit})
    if args.calibration:
        with open(args.calibration) as fh:
            shipped = Calibration.from_json(json.load(fh))
    else:
        shipped = default_calibration()
    between = correction_errors(shipped, main_samples)
    outside = correction_errors(shipped, main_samples, inner)
    shipped_rates = rate_errors(shipped, main_samples, "main, shipped rates")
    rates = rate_errors(cal, [s for s in main_samples if s.shape.seq_len not in mid], "main, held-out lengths")
    rates_shape = rate_errors(cal, held_samples, "held-out shape")
    result = {
        "devices": mesh.devices.size, "platform": mesh.devices.flat[0].platform, "tokens_per_step": TOKENS,
        "lengths": list(lengths), "held_shape_lengths": list(args.held_lengths),
        "calibration": args.calibration or "costmodel/calibrations/cpu.json",
        "main_spec": asdict(main_spec), "held_spec": asdict(held_spec),
        "correction_between": {"fit_lengths": "each option's shortest and longest",
                               "per_strategy": per_strategy(between), "rows": between},
        "correction_outside": {"fit_lengths": list(inner), "per_strategy": per_strategy(outside), "rows": outside},
        "shipped_rates": {"per_strategy": per_strategy(shipped_rates), "rows": shipped_rates},
        "rates_held_out_lengths": {"fit_lengths": list(mid), "per_strategy": per_strategy(rates), "rows": rates},
        "rates_held_out_shape": {"per_strategy": per_strategy(rates_shape), "rows": rates_shape},
        "rate_fit": fit, "wall_s": time.time() - t0}
    print(f"\nlayer-time error |pred - meas| / meas, median / max per strategy ({mesh.devices.size} x "
          f"{result['platform']}, {TOKENS} tokens per step)")
    cols = [("corrected, between", result["correction_between"]),
            ("corrected, outside", result["correction_outside"]),
            ("shipped rates", result["shipped_rates"]),
            ("rates, held-out len", result["rates_held_out_lengths"]),
            ("rates, held-out shape", result["rates_held_out_shape"])]
    print(f"{'strategy':<9}" + "".join(f"{name:>24}" for name, _ in cols))
    for s in (*strategies(), "all"):
        cells = []
        for _, block in cols:
            e = block["per_strategy"].get(s)
            cells.append(f"{e['median']:>11.1%} / {e['max']:<10.1%}" if e else f"{'—':>24}")
        print(f"{s:<9}" + "".join(cells))
    print(f"corrected: the rates of {result['calibration']} per option at its shortest and longest length (between) or "
          f"{list(inner)} (outside); rates fitted here at {list(mid)}; "
          f"rate fit undetermined terms: {fit['undetermined'] or 'none'}")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
