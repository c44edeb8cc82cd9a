"""The loss's memory: XLA's per-device bytes of whole training steps with a real vocabulary,
against the memory model, and the loss transient against the sequence length.

    python benchmarks/loss_memory.py [--config configs/dynamic.yaml] [--vocab 32768]
                                     [--lengths 4096 16384] [--chunks 0 1024] [--json OUT]

For every strategy as one plan under remat `full` (where the loss weighs most), at each length
(the data's batch size there) and loss chunk: XLA's bytes per device of the trainer's compiled
step (`memory_analysis()`), the cost model's prediction for the same plan (`cost_table`), and
the loss transient: the step's bytes at `--vocab` minus those at the byte vocabulary (264), so
that only what the vocabulary adds is left. Compiled, not run; float32, as XLA:CPU computes.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_io import write_json  # noqa: E402

from contenders import STATIC  # noqa: E402
CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "dynamic.yaml")
SMALL_VOCAB = 264


def step_bytes(trainer, strategy: str, remat: str, seq_len: int) -> tuple[int, int, float]:
    """(batch size, XLA's bytes per device, predicted bytes) of one uniform plan's train step, or
    None where the strategy cannot serve the shape."""
    from dysejax.errors import PlanError
    from sharding.plan import Plan, Run
    plan = Plan((Run(strategy, trainer.config.model.n_layers, remat),))
    bs = trainer.data.batch_size(seq_len)
    try:
        trainer.planner.check(plan, seq_len, bs)
    except PlanError:
        return None
    xla = trainer.programs.get("train", seq_len, bs, plan).bytes_per_device
    return bs, xla, float(trainer.planner.predict(seq_len, bs, plan)[0])


def summarise(errs) -> dict:
    """Median and max |relative error| (None when there are none)."""
    errs = sorted(abs(e) for e in errs)
    return {"median_abs_err": errs[len(errs) // 2] if errs else None, "max_abs_err": errs[-1] if errs else None}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--chunks", type=int, nargs="+", default=[0, 1024])
    ap.add_argument("--remat", default="full")
    ap.add_argument("--strategies", nargs="*", default=list(STATIC))
    ap.add_argument("--calibrated", action="store_true",
                    help="first fit this model's layers to XLA as `auto` does under a budget (each strategy at "
                         "its shortest and longest bucket); rows at other lengths are held out")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    import dysejax
    from dysejax import runtime

    work = tempfile.mkdtemp(prefix="loss_memory_")
    t0 = time.time()
    trainers = {}

    def trainer(vocab: int, chunk: int):
        if (vocab, chunk) not in trainers:
            cfg = dysejax.load_config(args.config, [
                f"model.vocab_size={vocab}", f"model.loss_chunk={chunk}", "parallel.plan=auto",
                "parallel.profile_time=false",
                # any budget makes the planner fit the layers to XLA; 1 TiB fits every plan
                "parallel.memory_budget_gb=1024" if args.calibrated else "parallel.memory_budget_gb=null",
                f"parallel.costmodel_dir={os.path.join(work, 'costmodel')}",
                f"train.compile_cache_dir={os.path.join(work, 'jax_cache')}"])
            runtime.configure_host_devices(cfg.parallel.cpu_devices)
            trainers[vocab, chunk] = dysejax.Trainer(cfg, workdir=os.path.join(work, f"t{vocab}_{chunk}"))
        return trainers[vocab, chunk]

    rows = []
    fitted = set()  # (strategy, length) the calibration measured
    if args.calibrated:
        from costmodel.profile import calibration_jobs
        t = trainer(args.vocab, args.chunks[0])
        shapes = [(t.data.batch_size(b), b) for b in t.data.buckets]
        for (_, length), names in calibration_jobs(t.planner.spec, dict(t.mesh.shape), shapes).items():
            fitted.update((name, length) for name in names)
    print(f"{'strategy':8s} {'length':>7} {'chunk':>6} {'batch':>5} {'XLA MiB':>8} {'model MiB':>9} {'err':>7} "
          f"{'loss MiB':>8}")
    for s in args.strategies:
        for n in args.lengths:
            for chunk in args.chunks:
                got = step_bytes(trainer(args.vocab, chunk), s, args.remat, n)
                if got is None:
                    continue
                bs, xla, pred = got
                small = step_bytes(trainer(SMALL_VOCAB, chunk), s, args.remat, n)[1]
                row = {"strategy": s, "seq_len": n, "loss_chunk": chunk, "batch": bs, "xla": xla, "pred": pred,
                       "err": pred / xla - 1, "loss_transient": xla - small,
                       "held_out": args.calibrated and (s, n) not in fitted}
                rows.append(row)
                print(f"{s:8s} {n:7d} {chunk:6d} {bs:5d} {xla / 2**20:8.1f} {pred / 2**20:9.1f} {row['err']:+7.1%} "
                      f"{row['loss_transient'] / 2**20:8.1f}{'  held out' if row['held_out'] else ''}", flush=True)
    summary = summarise([r["err"] for r in rows])
    print(f"model vs XLA, |error|: median {summary['median_abs_err']:.1%}, max {summary['max_abs_err']:.1%} "
          f"over {len(rows)} steps")
    if args.calibrated:
        summary["held_out"] = summarise([r["err"] for r in rows if r["held_out"]])
        print(f"  held out (lengths the calibration did not measure): median "
              f"{summary['held_out']['median_abs_err']:.1%}, max {summary['held_out']['max_abs_err']:.1%} over "
              f"{sum(r['held_out'] for r in rows)} steps")
    if args.json:
        write_json(args.json, {"config": os.path.relpath(args.config), "vocab_size": args.vocab, "remat": args.remat,
                               "calibrated": args.calibrated,
                               "rows": rows, "summary": summary, "wall_s": time.time() - t0})


if __name__ == "__main__":
    main()
