"""Stress XLA:CPU's collectives: every strategy and every ordered pair of strategies as a 2-run
mixed plan, under remat `selective` and `full`, at three shapes, all compiled into one process
and each run for several steps; reports programs, steps and aborts.

    python benchmarks/stress_collectives.py [--config configs/dynamic.yaml] [--steps 3]
                                            [--shapes 32x128,4x1024,1x4096] [--static-only] [--json OUT]

The plans: `S` (every layer) for each strategy S, and `A:n,B:n` (half the layers each) for each
ordered pair A != B. A plan that cannot serve a shape (e.g. `dp` on one row) is skipped. Every
program is compiled first (the process holds them all, as the headline benchmark's does), and
its compiled HLO is searched for pairs of collectives that no data dependence orders and that
XLA:CPU keys alike (one kind, one channel id: `costmodel.hlo.shared_channel_collectives`), the
static exposure to the fault `sharding.ops.ordering.unique_collective_channels` fixes. Then the
steps run in rounds, one step of every program per round in an order rotated from round to
round, each waited for and its loss checked finite.

A worker process runs the programs; this process watches it. When XLA:CPU aborts the worker
(a failed check in a collective's rendezvous, or a collective that times out: the runtime
aborts after `--xla_cpu_collective_call_terminate_timeout_seconds`), the abort is recorded with
the program that was running and the last lines the runtime printed, and a new worker goes on
without that program, so one run counts every program that aborts. Nothing is retried.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_io import write_json  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "dynamic.yaml")
STRATEGIES = ("dp", "fsdp", "tp", "tp_sp", "ring", "ulysses", "metp")
REMATS = ("selective", "full")


def plan_ids(strategies, n_layers: int, remat: str) -> list[str]:
    """Every strategy alone, then every ordered pair as two runs of half the layers each."""
    half = n_layers // 2
    uniform = [f"{s}:{n_layers}@{remat}" for s in strategies]
    pairs = [f"{a}:{half}@{remat},{b}:{n_layers - half}@{remat}" for a in strategies for b in strategies if a != b]
    return uniform + pairs


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """'32x128,4x1024' -> [(32, 128), (4, 1024)] (rows x length)."""
    out = []
    for part in text.split(","):
        rows, _, length = part.partition("x")
        out.append((int(rows), int(length)))
    return out


def worker(args) -> None:
    """Compile every (shape, plan) program not excluded, then run them in rounds, each step
    waited for; print `ran I` after each step of job I (the watcher pins an abort on the job
    after the last one printed)."""
    import dysejax
    from dysejax import runtime
    from dysejax.batches import load_batch
    from dysejax.build import build
    from costmodel.hlo import shared_channel_collectives
    from dysejax.errors import PlanError

    shapes = parse_shapes(args.shapes)
    tokens = max(r * s for r, s in shapes)
    if any(r * s != tokens for r, s in shapes):
        sys.exit(f"error: --shapes {args.shapes}: every shape needs the same rows x length (tokens per batch)")
    buckets = sorted(s for _, s in shapes)
    cfg = dysejax.load_config(args.config, [
        "data.source=synthetic", "data.synthetic.distribution=githubcode", "data.synthetic.num_docs=300",
        f"data.synthetic.max_len={4 * max(buckets)}", f"data.buckets=[{','.join(map(str, buckets))}]",
        f"data.tokens_per_batch={tokens}", "data.long_policy=split", "data.eval_batches=0",
        "parallel.plan=ring", "parallel.memory_budget_gb=null", "parallel.profile_time=false",
        "train.progress=false", f"train.compile_cache_dir={os.path.join(args.workdir, 'jax_cache')}"])
    runtime.configure_host_devices(cfg.parallel.cpu_devices)
    import jax
    import numpy as np
    setup = build(cfg, os.path.join(args.workdir, "run"), verbose=False)
    first = {}
    for e in range(16):
        for pb in setup.data.epoch_plans(e):
            first.setdefault(pb.bucket, pb)
    jobs = []
    for rows, length in shapes:
        pb = first[length]
        for remat in REMATS:
            for pid in plan_ids(args.strategies, cfg.model.n_layers, remat):
                plan = setup.planner.parse(pid)
                try:
                    setup.planner.check(plan, length, pb.batch_size)
                except PlanError:
                    continue
                jobs.append((f"{pb.batch_size}x{length}", pid, plan, pb))
    print(f"jobs {json.dumps([[shape, pid] for shape, pid, _, _ in jobs])}", flush=True)
    excluded = {int(i) for i in args.exclude.split(",") if i}
    live = [i for i in range(len(jobs)) if i not in excluded]
    t0 = time.perf_counter()
    programs = {i: setup.programs.get("train", jobs[i][3].bucket, jobs[i][3].batch_size, jobs[i][2]) for i in live}
    print(f"compiled {len(programs)} {time.perf_counter() - t0:.0f}", flush=True)
    # pairs of collectives no data orders that XLA:CPU would key alike (they may overlap): the
    # static exposure to the channel-id bug, whatever the run's timing shows
    shared = {i: len(shared_channel_collectives(programs[i].compiled.as_text())) for i in live}
    print(f"shared {json.dumps(shared)}", flush=True)
    if args.static_only:
        print("finished", flush=True)
        return
    batches = {i: load_batch(setup.data, jobs[i][3], jobs[i][2], setup.mesh) for i in live}
    state = setup.state_layout.init(cfg.train.seed)
    for step in range(args.steps):
        k = step % max(1, len(live))
        for i in live[k:] + live[:k]:
            state, out = programs[i](state, batches[i])
            loss = float(jax.block_until_ready(out["loss"]))
            if not np.isfinite(loss):
                sys.exit(f"error: {jobs[i][1]} at {jobs[i][0]}: loss {loss} at step {step}")
            print(f"ran {i}", flush=True)
    print("finished", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--strategies", nargs="*", default=list(STRATEGIES))
    ap.add_argument("--shapes", default="32x128,4x1024,1x4096", help="rows x length, same tokens each")
    ap.add_argument("--steps", type=int, default=3, help="steps of every program")
    ap.add_argument("--workdir", help="compile cache (default: a fresh temporary folder)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--static-only", action="store_true",
                    help="compile and count collectives that share a rendezvous key, run nothing")
    ap.add_argument("--exclude", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="stress_collectives_"))
    if args.worker:
        return worker(args)
    raise SystemExit(watch(args, argv))


def watch(args, argv) -> int:
    """Run workers until every program has run its steps; record each abort with the job it
    happened in, and go on without that job. Returns 0 when none aborted, else 1."""
    argv = list(sys.argv[1:] if argv is None else argv)
    base = [sys.executable, os.path.abspath(__file__), *argv, "--workdir", args.workdir, "--worker"]
    aborts, excluded, jobs, steps, shared, t_start = [], [], [], 0, {}, time.time()
    while True:
        with tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen(base + ["--exclude", ",".join(map(str, excluded))], stdout=subprocess.PIPE,
                                    stderr=err, text=True)
            out = []
            for line in proc.stdout:
                out.append(line.rstrip("\n"))
                if line.startswith("compiled ") or (line.startswith("ran ") and len(out) % 50 == 0):
                    print(f"  worker: {line.strip()} ({time.time() - t_start:.0f} s)", flush=True)
            proc.wait()
            err.seek(0)
            stderr = err.read()
        jobs = next((json.loads(line[5:]) for line in out if line.startswith("jobs ")), jobs)
        ran = [int(line.split()[1]) for line in out if line.startswith("ran ")]
        for line in out:
            if line.startswith("shared "):
                shared.update({int(i): n for i, n in json.loads(line[7:]).items()})
        steps += len(ran)
        if proc.returncode == 0 and "finished" in out:
            break
        # the runtime's own last lines, without the stack frames an abort prints after them
        tail = [line for line in stderr.splitlines() if line.strip() and not line.lstrip().startswith("@ 0x")][-6:]
        live = [i for i in range(len(jobs)) if i not in excluded]
        if proc.returncode > 0 or not any(line.startswith("compiled ") for line in out):
            print("\n".join(tail), file=sys.stderr)  # a user error or a crash before running: not an abort
            return 2
        step, position = divmod(len(ran), len(live))  # the worker's round and its place in it
        k = step % len(live)
        culprit = (live[k:] + live[:k])[position]
        aborts.append({"returncode": proc.returncode, "job": jobs[culprit], "steps_before": len(ran),
                       "stderr_tail": tail})
        print(f"abort ({proc.returncode}) in {jobs[culprit][1]} at {jobs[culprit][0]}:\n  " + "\n  ".join(tail),
              flush=True)
        excluded.append(culprit)
    result = {"config": os.path.relpath(args.config, ROOT), "strategies": list(args.strategies),
              "shapes": args.shapes, "remats": list(REMATS), "steps_per_program": args.steps,
              "programs": len(jobs), "static_only": args.static_only, "steps_run": steps, "aborts": len(aborts),
              "abort_details": aborts,
              "programs_with_shared_channel_pairs": sum(1 for n in shared.values() if n),
              "shared_channel_pairs": sum(shared.values()),
              "jobs": [[*job, shared.get(i)] for i, job in enumerate(jobs)], "wall_s": time.time() - t_start}
    print(f"\n{len(jobs)} programs (every plan that serves each shape, {args.shapes}); pairs of unordered "
          f"collectives sharing a rendezvous key (kind, channel): {result['shared_channel_pairs']} in "
          f"{result['programs_with_shared_channel_pairs']} programs")
    if not args.static_only:
        print(f"{args.steps} steps each: {steps} steps run, {len(aborts)} aborts, {result['wall_s']:.0f} s")
    if args.json:
        write_json(args.json, result)
    return 1 if aborts else 0


if __name__ == "__main__":
    main()
