"""The loss transient's memory model against XLA: fit its multipliers per strategy, check them
on held-out shapes.

    python benchmarks/loss_fit.py [--config configs/dynamic.yaml] [--write] [--json OUT]

Compiles the loss alone (`costmodel.probe.loss_step`: final hidden states and the head in the
storage layout -> mean NLL, forward + backward) for every strategy on 8 devices and reads
XLA's transient bytes per device (temp + the hidden states' gradient). Fits the multipliers
of `costmodel.memory.loss_features` per strategy on a grid (two vocabularies x two chunks x
two shapes of the config's model) and reports the error on held-out cases no fit saw: another
length and batch, another vocabulary and chunk, and a model twice as wide. `--write` stores
the multipliers in costmodel/memory_coefficients.json (what `auto` and `--plan` price with).
Compiled, not run; float32, as XLA:CPU computes.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_io import write_json  # noqa: E402

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "dynamic.yaml")
FIT = dict(shapes=[(8, 2048), (16, 4096)], vocabs=[8192, 32768], chunks=[256, 1024])
HELD_OUT = [  # (what differs, width multiplier, (batch, seq_len), vocabulary, chunk)
    ("length", 1, (8, 8192), 32768, 1024),
    ("vocabulary, chunk", 1, (8, 2048), 16384, 512),
    ("width", 2, (8, 4096), 32768, 1024),
]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--write", action="store_true", help="store the fitted multipliers as the shipped ones")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    import dysejax
    from dysejax import runtime
    cfg = dysejax.load_config(args.config, [])
    runtime.configure_host_devices(8)
    import jax
    from costmodel import memory as M
    from costmodel.memory_fit import fit_loss_coefficients, measure_loss_samples
    from dysejax.model.transformer import block_spec
    from sharding.mesh import build_mesh
    from sharding.strategies import STRATEGIES

    t0 = time.time()
    mesh = build_mesh({"data": 8}, jax.devices()[:8])
    spec = dataclasses.replace(block_spec(cfg.model), compute_dtype="float32")
    names = list(STRATEGIES)
    fit = measure_loss_samples(names, spec, mesh, FIT["shapes"], FIT["vocabs"], FIT["chunks"])
    loss = fit_loss_coefficients(fit)
    fitted = M.MemoryCoefficients(loss=loss)

    rows = []
    print(f"{'strategy':8s} {'held out':18s} {'batch x length':>15} {'vocab':>6} {'chunk':>5} {'XLA MiB':>8} "
          f"{'model MiB':>9} {'err':>7} {'analytical':>10}")
    for what, widen, shape, vocab, chunk in HELD_OUT:
        wide = dataclasses.replace(spec, d_model=spec.d_model * widen, d_ff=spec.d_ff * widen)
        for smp in measure_loss_samples(names, wide, mesh, [shape], [vocab], [chunk]):
            pred = M.loss_memory(smp.shape, smp.strategy, vocab, chunk, fitted)
            plain = M.loss_memory(smp.shape, smp.strategy, vocab, chunk, M.ANALYTICAL)
            row = {"strategy": smp.strategy, "held_out": what, "d_model": wide.d_model, "batch": shape[0],
                   "seq_len": shape[1], "vocab": vocab, "chunk": chunk, "xla": smp.bytes, "pred": pred,
                   "err": pred / smp.bytes - 1, "analytical_err": plain / smp.bytes - 1}
            rows.append(row)
            print(f"{smp.strategy:8s} {what:18s} {shape[0]:>6} x {shape[1]:6d} {vocab:6d} {chunk:5d} "
                  f"{smp.bytes / 2**20:8.2f} {pred / 2**20:9.2f} {row['err']:+7.1%} {row['analytical_err']:+10.1%}",
                  flush=True)
    errs = sorted(abs(r["err"]) for r in rows)
    plain = sorted(abs(r["analytical_err"]) for r in rows)
    summary = {"median_abs_err": errs[len(errs) // 2], "max_abs_err": errs[-1],
               "analytical_median_abs_err": plain[len(plain) // 2], "analytical_max_abs_err": plain[-1]}
    print(f"held out, |error|: fitted median {summary['median_abs_err']:.1%}, max {summary['max_abs_err']:.1%}; "
          f"analytical median {summary['analytical_median_abs_err']:.1%}, max {summary['analytical_max_abs_err']:.1%} "
          f"over {len(rows)} loss programs")
    if args.write:
        shipped = M.default_coefficients()
        path = M.write_default_coefficients(M.MemoryCoefficients(shipped.stored, shipped.peak, loss),
                                            meta=_meta(_shipped_meta(M.DEFAULT_COEFFICIENTS_PATH), FIT))
        print(f"wrote the loss multipliers to {os.path.relpath(path)}")
    if args.json:
        write_json(args.json, {"config": os.path.relpath(args.config), "fit": FIT, "coefficients": loss,
                               "rows": rows, "summary": summary, "wall_s": time.time() - t0})


def _shipped_meta(path: str) -> dict:
    import json
    with open(path) as fh:
        return json.load(fh).get("meta", {})


def _meta(meta: dict, fit: dict) -> dict:
    return dict(meta, loss_fitted_on={k: [list(v) if isinstance(v, tuple) else v for v in vs] for k, vs in fit.items()},
                loss_fitted=time.strftime("%Y-%m-%d %H:%M"))


if __name__ == "__main__":
    main()
