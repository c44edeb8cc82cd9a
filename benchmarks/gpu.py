"""MFU of the 125M and 1.3B models on one GPU, per attention kernel and length, and the time
model's compute rates fitted to the measured steps.

For each model (configs/125m.yaml, configs/1.3b.yaml), attention kernel (blockwise, pallas,
cudnn) and length (2K ... 32K tokens), one train program (plan dp on one device, bf16 compute,
~32K tokens per step, rows of one whole document so every kernel serves the case) is compiled
ahead of time: remat none, dots, then full, the first whose XLA figure fits the budget (what
JAX's allocator can use less parallel.memory_headroom). It runs `--steps` timed steps after one
warm step; MFU = model FLOPs (dysejax.flops) / (step time x the device's peak). Then, per
kernel, step time = F_matmul / matmul_rate + F_attention / attn_rate + overhead is fitted by
non-negative least squares over the measured cases: the rates `costmodel.time` divides by.

    python benchmarks/gpu.py --json benchmarks/results/gpu_h200.json     # one H200: < 8 min
    python benchmarks/gpu.py --cpu-smoke                                  # the same path, CPU-sized
    python benchmarks/gpu.py --vs-plain --json benchmarks/results/step_vs_plain_h200.json

`--vs-plain` runs `benchmarks/step_vs_plain.py` on the GPU instead: dysejax's step (the Pallas
kernel, and cuDNN on rows of one document) against the plain JAX step of the 125M model, bf16
compute, interleaved rounds, loss and gradients checked equal within bf16 rounding first.

`--time-limit` (default 420 s) stops starting new cases once spent, so the script stays inside
its slot whatever the compile times; cases not run are listed as skipped. A kernel that cannot
serve a case here (cuDNN needs a GPU; Pallas interprets on CPU) is reported with the reason,
and the case then runs the blockwise kernel.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

KERNELS = ("blockwise", "pallas", "cudnn")
MODELS = {"125m": os.path.join(ROOT, "configs", "125m.yaml"), "1.3b": os.path.join(ROOT, "configs", "1.3b.yaml")}
LENGTHS = (2048, 4096, 8192, 16384, 32768)
TOKENS_PER_STEP = 32768


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="125m,1.3b")
    p.add_argument("--kernels", default=",".join(KERNELS))
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    p.add_argument("--tokens", type=int, default=TOKENS_PER_STEP, help="tokens per step (batch = tokens / length)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per case (after one warm step)")
    p.add_argument("--time-limit", type=float, default=420.0, help="start no new case after this many seconds")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny model, short lengths: the same path on CPU")
    p.add_argument("--vs-plain", action="store_true", help="dysejax's step vs a plain JAX step (step_vs_plain.py)")
    p.add_argument("--rounds", type=int, default=5, help="--vs-plain: interleaved rounds per case")
    p.add_argument("--json", help="write the results here")
    return p.parse_args(argv)


def case_config(model_path: str, kernel: str, length: int, tokens: int, smoke: bool):
    import dysejax

    overrides = ["parallel.plan=dp", "parallel.mesh={data: 1}", "parallel.cpu_devices=1",
                 f"model.attention={kernel}", "model.compute_dtype=bfloat16", "data.source=synthetic",
                 f"data.buckets=[{length}]", f"data.tokens_per_batch={max(tokens, length)}",
                 "data.eval_batches=0", "data.pack=false", "data.synthetic.num_docs=16",
                 f"data.synthetic.min_len={length}", f"data.synthetic.max_len={length}",
                 "train.progress=false", "train.compile_cache=false"]
    if smoke:
        overrides += ["model.n_layers=2", "model.d_model=128", "model.n_heads=4", "model.d_ff=256",
                      "model.vocab_size=512", "model.attention_block=128"]
    return dysejax.load_config(model_path, overrides)


def served(kernel: str, config, length: int, platform: str) -> tuple[bool, str]:
    """Whether `kernel` itself runs this case here (else the blockwise kernel does), and why not."""
    import jax
    import jax.numpy as jnp

    from sharding.ops.fused_attention import cudnn_unserved, pallas_unserved
    if kernel == "blockwise":
        return True, ""
    m = config.model
    q = jax.ShapeDtypeStruct((1, length, m.n_heads, m.resolved_head_dim), jnp.dtype(m.compute_dtype))
    why = cudnn_unserved(q, platform) if kernel == "cudnn" else pallas_unserved(q.shape[-1], platform)
    return why is None, why or ""


def synthetic_batch(trainer, batch: int, length: int, plan):
    """Rows of one whole document each: random tokens, segment id 1, positions 0..length-1."""
    import jax
    import numpy as np

    from dysejax.batches import batch_sharding
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, trainer.config.model.vocab_size, (batch, length + 1), dtype=np.int32)
    arrays = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "segment_ids": np.ones((batch, length), np.int32),
              "positions": np.broadcast_to(np.arange(length, dtype=np.int32), (batch, length)).copy(),
              "loss_mask": np.ones((batch, length), np.float32)}
    return jax.device_put(arrays, batch_sharding(plan, trainer.mesh))


def run_case(model: str, kernel: str, length: int, args) -> dict:
    import jax

    import dysejax
    from dysejax.errors import PlanError
    from dysejax.flops import train_flops_split
    from sharding.plan import Plan, Run

    config = case_config(MODELS[model], kernel, length, args.tokens, args.cpu_smoke)
    trainer = dysejax.Trainer(config, workdir=os.path.join("/tmp", "dysejax-gpu-bench"), verbose=False)
    platform = trainer.mesh.devices.flat[0].platform
    ok, why = served(kernel, config, length, platform)
    batch = trainer.data.batch_size(length)
    candidates = [Plan((Run("dp", config.model.n_layers, r),)) for r in ("none", "dots", "full")]
    row = {"model": model, "kernel": kernel, "kernel_served": ok, "not_served_because": why, "seq_len": length,
           "batch_size": batch, "tokens": batch * length, "budget_bytes": trainer.budget}
    t0 = time.perf_counter()
    try:
        program = trainer.programs.select("train", length, batch, candidates, trainer.budget)
    except PlanError as e:
        return dict(row, error=f"over budget: {e}")
    row.update(compile_s=time.perf_counter() - t0, plan=program.plan.id, xla_bytes=program.bytes_per_device,
               remat=program.plan.runs[0].remat or "none")
    state = trainer.state_layout.init(0)
    data = synthetic_batch(trainer, batch, length, program.plan)
    state, out = program(state, data)  # warm step
    jax.block_until_ready(out)
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        state, out = program(state, data)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - t)
    step_s = sorted(times)[len(times) // 2]
    peak = trainer.peak_flops
    matmul, attn = train_flops_split(config.model, batch, length)
    flops = matmul + attn
    recompute = {"none": 1.0, "dots": 1.0, "full": 4.0 / 3.0}[row["remat"]]  # full remat reruns the forward
    row.update(step_s=step_s, tokens_per_s=batch * length / step_s, model_flops=flops,
               mfu=flops / (step_s * peak.flops), peak_flops=peak.flops, peak_source=peak.source, loss=float(out["loss"]),
               matmul_flops_run=matmul * recompute, attention_flops_run=attn * recompute)
    return row


def fit_rates(rows: list[dict]) -> dict:
    """Per kernel: step_s = F_mm / matmul_rate + F_attn / attn_rate + overhead (NNLS)."""
    import numpy as np
    from scipy.optimize import nnls

    fits = {}
    for kernel in sorted({r["kernel"] for r in rows if "step_s" in r}):
        mine = [r for r in rows if r["kernel"] == kernel and "step_s" in r and r["kernel_served"]]
        if len(mine) < 3:
            continue
        A = np.array([[r["matmul_flops_run"], r["attention_flops_run"], 1.0] for r in mine])
        y = np.array([r["step_s"] for r in mine])
        scale = A.max(axis=0)
        coef, _ = nnls(A / scale, y)
        coef = coef / scale
        pred = A @ coef
        fits[kernel] = {"matmul_flops": 1 / coef[0] if coef[0] > 0 else None,
                        "attn_flops": 1 / coef[1] if coef[1] > 0 else None, "overhead_s": float(coef[2]),
                        "cases": len(mine), "max_rel_err": float(np.max(np.abs(pred - y) / y))}
    return fits


VS_PLAIN = {  # (config, cases, overrides, tolerance): bf16 on a GPU; the CPU smoke float32 and small
    "gpu": (MODELS["125m"], "base:8x2048:none,base:8x2048:selective,base:2x8192:selective,base:2x8192:4:selective",
            ["model.attention=pallas", "model.compute_dtype=bfloat16"], 3e-2),
    "smoke": (os.path.join(ROOT, "configs", "dynamic.yaml"), "small:4x256:none,small:1x512:2:selective",
              ["model.attention=pallas", "model.attention_block=128"], 1e-5),
}


def vs_plain(args) -> int:
    """benchmarks/step_vs_plain.py with this machine's cases (the Pallas kernel in dysejax's step)."""
    from benchmarks import step_vs_plain
    config, cases, overrides, tol = VS_PLAIN["smoke" if args.cpu_smoke else "gpu"]
    argv = ["--config", config, "--cases", cases, "--tol", str(tol), "--rounds", str(args.rounds), "--max-gib", "100"]
    argv += [a for o in overrides for a in ("--set", o)] + (["--json", args.json] if args.json else [])
    return step_vs_plain.main(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.vs_plain:
        return vs_plain(args)
    from dysejax import runtime
    runtime.configure_host_devices(1)
    import jax

    from benchmarks.results_io import write_json
    models = ["tiny"] if args.cpu_smoke else args.models.split(",")
    lengths = [64, 128, 256] if args.cpu_smoke else [int(x) for x in args.lengths.split(",")]
    if args.cpu_smoke:  # the 125M config shrunk to a 2-layer d=128 model, 512 tokens a step
        MODELS["tiny"], args.tokens = MODELS["125m"], 512
    kernels = args.kernels.split(",")
    t_start, rows, skipped = time.perf_counter(), [], []
    print(f"device: {jax.devices()[0].device_kind} ({jax.device_count()} device(s))", flush=True)
    for model in models:
        for length in lengths:
            for kernel in kernels:
                if time.perf_counter() - t_start > args.time_limit:
                    skipped.append({"model": model, "kernel": kernel, "seq_len": length})
                    continue
                row = run_case(model, kernel, length, args)
                rows.append(row)
                _print_row(row)
    fits = fit_rates(rows)
    print(f"\n{'kernel':<10} {'matmul TFLOP/s':>15} {'attention TFLOP/s':>18} {'overhead ms':>12} {'cases':>6}")
    for k, f in fits.items():
        mm = f"{f['matmul_flops'] / 1e12:.1f}" if f["matmul_flops"] else "-"
        at = f"{f['attn_flops'] / 1e12:.1f}" if f["attn_flops"] else "-"
        print(f"{k:<10} {mm:>15} {at:>18} {f['overhead_s'] * 1e3:>12.2f} {f['cases']:>6}")
    if skipped:
        print(f"skipped after --time-limit {args.time_limit:g} s: {len(skipped)} cases")
    result = {"device": jax.devices()[0].device_kind, "cases": rows, "fits": fits, "skipped": skipped,
              "seconds": time.perf_counter() - t_start, "cpu_smoke": args.cpu_smoke}
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}")
    return 0


def _print_row(r: dict) -> None:
    head = f"{r['model']:<5} {r['kernel']:<9} s={r['seq_len']:>6} b={r['batch_size']:<3}"
    if "error" in r:
        print(f"{head} {r['error']}", flush=True)
        return
    note = "" if r["kernel_served"] else f"  (ran blockwise: {r['not_served_because']})"
    print(f"{head} remat {r['remat']:<4} {r['step_s'] * 1e3:9.1f} ms  {r['tokens_per_s']:>10,.0f} tok/s  "
          f"MFU {100 * r['mfu']:5.1f}%  {r['xla_bytes'] / 2**30:6.2f} GiB  compile {r['compile_s']:.0f} s{note}",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
