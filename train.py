#!/usr/bin/env python
"""Command line: python train.py --config FILE [--workdir DIR] [--steps N] [--warmup-only] [--plot]
[--plan [--json] [--plan-png FILE]] [--set key=value ...]
[--coordinator HOST:PORT --num-processes N --process-id I]"""
from __future__ import annotations

import argparse
import os
import sys
import time


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit status 2, like every other usage error
        sys.stderr.write(f"error: {message} (see --help)\n")
        raise SystemExit(2)


def parse_args(argv):
    p = _Parser(description="Train a Transformer with per-bucket parallel plans.")
    p.add_argument("--config", required=True, help="YAML config file (see configs/)")
    p.add_argument("--workdir", help="run directory: checkpoints, metrics.jsonl (default runs/<config name>)")
    p.add_argument("--steps", type=int, help="total step target of the run (default train.steps)")
    p.add_argument("--warmup-only", action="store_true",
                   help="compile every bucket's program (filling the compile cache), report, and exit")
    p.add_argument("--plot", action="store_true",
                   help="draw WORKDIR/run.png (loss, tokens/s per bucket, plan per step) from the run so far, and exit")
    p.add_argument("--plan", action="store_true",
                   help="print the plan report (plan, predicted bytes and step time per bucket) and a PNG; no training")
    p.add_argument("--json", action="store_true", help="with --plan: print the report as JSON")
    p.add_argument("--plan-png", metavar="FILE", help="with --plan: where the PNG goes (default WORKDIR/plan.png)")
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[],
                   metavar="KEY=VALUE", help="override a config value, e.g. --set train.seed=1")
    p.add_argument("--coordinator", metavar="HOST:PORT",
                   help="multi-process run: the address process 0 listens on (one process per host)")
    p.add_argument("--num-processes", type=int, metavar="N", help="multi-process run: number of processes")
    p.add_argument("--process-id", type=int, metavar="I", help="multi-process run: this process, 0..N-1")
    args = p.parse_args(argv)
    for flag, given in (("--json", args.json), ("--plan-png", args.plan_png)):
        if given and not args.plan:
            p.error(f"{flag} only goes with --plan (python train.py --config FILE --plan {flag} ...)")
    return args


def _plan_report(config, workdir: str, args) -> int:
    import json

    from dysejax.build import build
    from dysejax.plan_report import format_report, plan_report, write_plot

    setup = build(config, workdir, verbose=False)
    report = plan_report(setup.planner, setup.programs)
    png = args.plan_png or os.path.join(setup.workdir, "plan.png")
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    written = write_plot(setup.planner, report, png)
    note = f"plot: {written}" if written else "plot: not written (pip install matplotlib)"
    if args.json:
        print(json.dumps(report, indent=1))
        sys.stderr.write(note + "\n")
    else:
        print(format_report(report))
        print(note)
    return 0


def _plot(workdir: str) -> int:
    from dysejax.errors import ConfigError
    from dysejax.run_plot import write_run_plot

    if not os.path.exists(os.path.join(workdir, "metrics.jsonl")):
        raise ConfigError(f"--plot: no run in {workdir!r} yet (no metrics.jsonl): train first, or pass its --workdir")
    path = write_run_plot(workdir)
    print(f"plot: {path}" if path else "plot: not written (pip install matplotlib)")
    return 0


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import dysejax
    from dysejax import runtime

    try:
        overrides = list(args.overrides)
        if args.steps is not None:
            if args.steps <= 0:
                raise dysejax.ConfigError(f"--steps must be positive, got {args.steps}")
            overrides.append(f"train.steps={args.steps}")
        config = dysejax.load_config(args.config, overrides)
        runtime.configure_host_devices(config.parallel.cpu_devices)
        runtime.initialize_distributed(args.coordinator, args.num_processes, args.process_id,
                                       config.train.peer_timeout_s)
        from dysejax.build import default_workdir

        workdir = args.workdir or config.workdir or default_workdir(args.config)
        if args.plot:
            return _plot(workdir)
        if args.plan:
            return _plan_report(config, workdir, args)
        from dysejax.trainer import Trainer

        trainer = Trainer(config, workdir=workdir)
        if args.warmup_only:
            t0 = time.perf_counter()
            report = trainer.warmup()
            print(trainer.format_plans())
            c = trainer.compiles
            print(f"warmup: {len(report)} programs in {time.perf_counter() - t0:.1f} s; XLA compiled "
                  f"{c.xla_compiled}, {c.cache_hits} from the compile cache ({trainer.compile_cache_dir or 'off'})"
                  + (f": {trainer.compile_cache_off}" if trainer.compile_cache_off else ""))
            return 0
        trainer.fit()
    except dysejax.UserError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    except dysejax.TrainingError as e:
        sys.stderr.write(f"error: {e}\n")
        return 1
    if trainer.interrupted is not None:
        return 128 + trainer.interrupted
    return 0


if __name__ == "__main__":
    sys.exit(main())
