"""Accuracy of the memory model and of the FLOP counts: predicted vs XLA, held-out lengths and shapes.

    python benchmarks/costmodel_accuracy.py [--quick] [--json OUT] [--cache DIR] [--write-coefficients]

(The time model's accuracy, measured by running programs: benchmarks/time_accuracy.py.)

Memory (compiled only, nothing executed): per-strategy feature multipliers are fitted
(`costmodel.memory_fit.fit_coefficients`) on XLA's per-device figures for a layer stack compiled with
2 and 3 layers under `lax.scan` at a few lengths of two shapes; they are then checked on lengths
and shapes not used for fitting (other lengths, a larger length, a bf16 / gated / 16-head shape,
a {data: 2, model: 4} mesh): the per-device total (argument + output + temp) of a 3-layer step,
plus the per-layer stored bytes and transient where both stacks were compiled.

FLOPs: the time model's analytical matmul FLOPs of a 2-layer step vs the dots of the compiled
HLO times their loop trip counts (compile only).

`--cache DIR` keeps the measured samples so a rerun only compiles what is missing;
`--write-coefficients` replaces the shipped memory coefficients (costmodel/memory_coefficients.json)
with the ones fitted here.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dysejax.runtime import enable_compilation_cache, simulate_host_devices  # noqa: E402  (imports no JAX)

simulate_host_devices(8)
from results_io import write_json  # noqa: E402  (the script's folder is on sys.path)

import numpy as np  # noqa: E402

from costmodel import memory as M  # noqa: E402
from costmodel import memory_fit as F  # noqa: E402
from sharding.ops.blocks import BlockSpec  # noqa: E402

STRATEGIES = ("dp", "fsdp", "tp", "tp_sp", "ring", "ulysses", "metp")

# Memory: calibration shape (compiles in seconds, per-device figures in the 10-1000 MiB range).
SPEC_CAL = BlockSpec(n_heads=8, head_dim=64, d_model=512, d_ff=2048, gated=False, activation="gelu",
                     attention_block=512)
# Held-out shape: bf16 compute, gated SiLU MLP, 16 heads of 32.
SPEC_HELD = BlockSpec(n_heads=16, head_dim=32, d_model=512, d_ff=1536, gated=True, activation="silu",
                      attention_block=512, compute_dtype="bfloat16")
# Held-out shape: smaller, gated SiLU, f32, smaller attention block.
SPEC_SMALL = BlockSpec(n_heads=8, head_dim=32, d_model=256, d_ff=1024, gated=True, activation="silu",
                       attention_block=256)
# Time: tiny shape that runs in well under a second per step on 2 cores.
# FLOPs check: a tiny shape.
SPEC_FLOPS = BlockSpec(n_heads=8, head_dim=16, d_model=128, d_ff=384, attention_block=128)


def plans(quick: bool):
    """(memory fit jobs, memory held-out jobs).
    A job: (label, spec, mesh shape, batch, seq_len, remat, two_stacks)."""
    if quick:
        fit = [("cal", SPEC_CAL, {"data": 8}, 8, s, "none", True) for s in (512, 2048)]
        held = [("cal", SPEC_CAL, {"data": 8}, 8, 1024, "none", False),
                ("bf16-gated", SPEC_HELD, {"data": 8}, 8, 2048, "none", False)]
        return fit, held
    fit = [("cal", SPEC_CAL, {"data": 8}, 8, s, "none", True) for s in (256, 512, 1024, 4096)]
    fit += [("cal", SPEC_CAL, {"data": 8}, 8, s, r, True) for s in (512, 4096) for r in ("full", "dots")]
    fit += [("gated-256", SPEC_SMALL, {"data": 8}, 8, s, "none", True) for s in (512, 4096)]
    held = [("cal", SPEC_CAL, {"data": 8}, 8, s, "none", True) for s in (2048,)]
    held += [("cal", SPEC_CAL, {"data": 8}, 8, 8192, "none", False)]
    held += [("cal", SPEC_CAL, {"data": 8}, 8, 2048, r, False) for r in ("full", "dots")]
    held += [("bf16-gated", SPEC_HELD, {"data": 8}, 8, s, "none", False) for s in (1024, 4096)]
    held += [("gated-256", SPEC_SMALL, {"data": 8}, 8, s, "none", False) for s in (1024, 2048)]
    held += [("mesh 2x4", SPEC_CAL, {"data": 2, "model": 4}, 4, 2048, "none", False)]
    return fit, held


# ------------------------------------------------------------------------------------------------
# Memory
# ------------------------------------------------------------------------------------------------
def _key(label, mesh_shape, s, strategy, remat, two):
    return f"{label}|{json.dumps(mesh_shape, sort_keys=True)}|{s}|{strategy}|{remat}|{int(two)}"


def measure_memory(jobs, cache: dict, meshes: dict, log) -> list[tuple[str, F.Sample, bool]]:
    from costmodel.probe import figures, layer_step
    out = []
    for label, spec, mesh_shape, batch, s, remat, two in jobs:
        mk = tuple(mesh_shape.items())
        if mk not in meshes:
            from sharding.mesh import build_mesh
            meshes[mk] = build_mesh(mesh_shape)
        mesh = meshes[mk]
        ok = set(M.feasible_strategies(spec, mesh_shape, batch, s, STRATEGIES))
        for strategy in STRATEGIES:
            if strategy not in ok:
                continue
            key = _key(label, mesh_shape, s, strategy, remat, two)
            if key in cache:
                smp = F.Sample.from_json(cache[key])
            else:
                t0 = time.time()
                shape = M.Shape(spec, mesh_shape, batch, s, backend=mesh.devices.flat[0].platform)
                if two:
                    m = F.measure_layer(strategy, spec, mesh, batch, s, remat)
                    smp = F.Sample(shape, strategy, remat, m["stored"], m["peak"], m["total"])
                else:
                    c = layer_step(strategy, spec, mesh, batch, s, n_layers=3, remat=None if remat == "none" else remat)
                    smp = F.Sample(shape, strategy, remat, float("nan"), float("nan"), {3: figures(c)["total"]})
                cache[key] = smp.to_json()
                log(f"  compiled {label} s={s} {strategy}@{remat} in {time.time() - t0:.1f}s")
            out.append((label, smp, two))
    return out


def memory_rows(samples, coefficients) -> list[dict]:
    rows = []
    for label, smp, two in samples:
        shape = smp.shape
        pred_total = M.plan_layer_bytes(shape, smp.strategy, smp.remat, 3, coefficients)
        xla_total = smp.total[3]
        row = {"shape": label, "mesh": dict(shape.mesh_shape), "seq_len": shape.seq_len, "strategy": smp.strategy,
               "remat": smp.remat, "xla_total": xla_total, "pred_total": pred_total,
               "err_total": abs(pred_total - xla_total) / xla_total}
        if two:
            m = M.layer_memory(shape, smp.strategy, smp.remat, coefficients)
            row.update(xla_stored=smp.stored, pred_stored=m.activations, xla_peak=smp.peak, pred_peak=m.peak,
                       err_stored=abs(m.activations - smp.stored) / max(smp.stored, 1.0),
                       err_peak=abs(m.peak - smp.peak) / max(smp.peak, 1.0))
        rows.append(row)
    return rows


def summary(errs) -> dict:
    errs = [e for e in errs if e == e]
    if not errs:
        return {"median": None, "max": None, "n": 0}
    return {"median": float(np.median(errs)), "max": float(np.max(errs)), "n": len(errs)}


# ------------------------------------------------------------------------------------------------
# Time
# ------------------------------------------------------------------------------------------------
# ------------------------------------------------------------------------------------------------
# End to end: CostTable.plan_bytes vs the trainer's compiled train step
# ------------------------------------------------------------------------------------------------
E2E_OVERRIDES = ["model.d_model=256", "model.n_heads=8", "model.d_ff=768", "model.n_layers=4",
                 "model.attention_block=256", "data.source=synthetic", "data.tokenizer=bytes", "data.synthetic.num_docs=50",
                 "data.synthetic.max_len=2048", "data.buckets=[512,2048]", "data.tokens_per_batch=16384",
                 "data.eval_batches=0", "train.progress=false"]
E2E_PLANS = [[[s, 4]] for s in STRATEGIES] + [[["fsdp", 4, "full"]], [["tp_sp", 4, "dots"]], [["metp", 4, "full"]],
                                               [["tp_sp", 2], ["metp", 2]], [["dp", 1], ["tp", 1], ["fsdp", 2]],
                                               [["ring", 1], ["ulysses", 1], ["metp", 2, "full"]]]


def end_to_end(cache: dict, log, workdir: str) -> list[dict]:
    """Predicted per-device bytes of whole train steps (embedding, layers, loss, AdamW update)
    vs XLA's figure for the program the trainer compiles, per bucket and plan."""
    import dysejax
    from dysejax.model.transformer import block_spec

    from costmodel.table import Choice, cost_table
    cfg = dysejax.load_config(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                           "configs", "tiny.yaml"), E2E_OVERRIDES)
    trainer = None
    spec = block_spec(cfg.model)
    rows = []
    for bucket in cfg.data.buckets:
        for written in E2E_PLANS:
            key = f"e2e|{bucket}|{json.dumps(written)}"
            if key not in cache:
                if trainer is None:
                    trainer = dysejax.Trainer(cfg, workdir=workdir, verbose=False)
                plan = trainer.planner.parse(written)
                bs = trainer.data.batch_size(bucket)
                try:
                    trainer.planner.check(plan, bucket, bs)
                except Exception as e:  # a strategy that cannot serve the shape
                    log(f"  skip {bucket} {written}: {e}")
                    continue
                prog = trainer.programs.get("train", bucket, bs, plan)
                cache[key] = {"batch": bs, "xla": prog.bytes_per_device}
            got = cache[key]
            per_layer = [Choice(r[0], r[2] if len(r) > 2 else "none") for r in written for _ in range(r[1])]
            choices = tuple(dict.fromkeys(per_layer))
            table = cost_table(spec, dict(cfg.parallel.mesh) if -1 not in cfg.parallel.mesh.values() else {"data": 8},
                               got["batch"], bucket, cfg.model.n_layers, cfg.model.vocab_size, hardware="a100-80gb",
                               choices=choices)
            idx = [choices.index(c) for c in per_layer]
            pred, tight = table.plan_bytes(idx), table.plan_bytes_backward(idx)
            rows.append({"bucket": bucket, "batch": got["batch"], "plan": written, "xla": got["xla"], "pred": pred,
                         "err": abs(pred - got["xla"]) / got["xla"], "pred_backward": tight,
                         "err_backward": abs(tight - got["xla"]) / got["xla"]})
    return rows


# ------------------------------------------------------------------------------------------------
# FLOPs: analytical count vs dot FLOPs in the compiled HLO (loop trip counts applied)
# ------------------------------------------------------------------------------------------------
def flops_check(cache: dict, mesh, log, lengths=(128, 512)) -> list[dict]:
    from costmodel import time as T
    from costmodel.probe import layer_step
    rows = []
    for s in lengths:
        for strategy in STRATEGIES:
            key = f"flops|{s}|{strategy}"
            if key not in cache:
                c = layer_step(strategy, SPEC_FLOPS, mesh, 8, s, n_layers=2)
                cache[key] = {"hlo": T.hlo_dot_flops(c.as_text()), "cost_analysis": figures_flops(c)}
            shape = M.Shape(SPEC_FLOPS, {"data": 8}, 8, s, backend="cpu")
            w = T.layer_work(shape, strategy, skip_masked=False)
            analytic = 2 * (w.matmul_flops + w.attn_flops)
            hlo = cache[key]["hlo"]
            rows.append({"seq_len": s, "strategy": strategy, "analytic": analytic, "hlo": hlo,
                         "cost_analysis_once": cache[key]["cost_analysis"], "err": abs(analytic - hlo) / hlo})
    return rows


def figures_flops(compiled) -> float:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float((cost or {}).get("flops", 0.0))


# ------------------------------------------------------------------------------------------------
def fmt_mib(x):
    return "-" if x is None or x != x else f"{x / 2**20:9.1f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer lengths and shapes (a few minutes)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--cache", help="directory keeping measured samples between runs")
    ap.add_argument("--write-coefficients", action="store_true",
                    help="replace costmodel/memory_coefficients.json with the coefficients fitted here")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--skip-flops", action="store_true")
    args = ap.parse_args(argv)
    t_start = time.time()
    import jax

    from sharding.mesh import build_mesh
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    if args.cache:  # compiled programs too: a rerun skips XLA's compile
        refusal = enable_compilation_cache(os.path.join(args.cache, "jax_cache"))
        if refusal:
            log(f"compile cache: off ({refusal})")
    cache_file = os.path.join(args.cache, "costmodel_samples.json") if args.cache else None
    cache = {}
    if cache_file and os.path.exists(cache_file):
        with open(cache_file) as fh:
            cache = json.load(fh)

    def save_cache():
        if cache_file:
            os.makedirs(args.cache, exist_ok=True)
            with open(cache_file, "w") as fh:
                json.dump(cache, fh)

    fit_jobs, held_jobs = plans(args.quick)
    result = {"quick": args.quick, "devices": f"{len(jax.devices())} x {jax.devices()[0].device_kind}"}
    meshes = {}
    if not args.skip_memory:
        log("memory: fitting on XLA figures")
        fit = measure_memory(fit_jobs, cache, meshes, log)
        save_cache()
        coeffs = F.fit_coefficients([smp for _, smp, _ in fit])
        log("memory: held-out shapes and lengths")
        held = measure_memory(held_jobs, cache, meshes, log)
        save_cache()
        rows_fit = memory_rows(fit, coeffs)
        rows_held = memory_rows(held, coeffs)
        rows_analytical = memory_rows(held, M.ANALYTICAL)
        print("\nMemory, per device, held out (XLA vs predicted; total = 3-layer step args + output + temp)")
        print(f"{'shape':11s} {'mesh':18s} {'seq':>6s} {'strategy':8s} {'remat':5s} {'XLA MiB':>9s} {'pred':>9s} "
              f"{'err':>6s} | {'stored':>9s} {'pred':>9s} | {'peak':>9s} {'pred':>9s}")
        for r in rows_held:
            print(f"{r['shape']:11s} {json.dumps(r['mesh']):18s} {r['seq_len']:6d} {r['strategy']:8s} {r['remat']:5s} "
                  f"{fmt_mib(r['xla_total'])} {fmt_mib(r['pred_total'])} {100 * r['err_total']:5.1f}% | "
                  f"{fmt_mib(r.get('xla_stored'))} {fmt_mib(r.get('pred_stored'))} | "
                  f"{fmt_mib(r.get('xla_peak'))} {fmt_mib(r.get('pred_peak'))}")
        mem = {"fit": {k: summary([r.get(f"err_{k}", float("nan")) for r in rows_fit]) for k in ("total", "stored", "peak")},
               "held_out": {k: summary([r.get(f"err_{k}", float("nan")) for r in rows_held])
                            for k in ("total", "stored", "peak")},
               "held_out_analytical": {k: summary([r.get(f"err_{k}", float("nan")) for r in rows_analytical])
                                       for k in ("total", "stored", "peak")},
               "by_strategy": {s: summary([r["err_total"] for r in rows_held if r["strategy"] == s]) for s in STRATEGIES},
               "rows": rows_held, "coefficients": coeffs.to_json()}
        result["memory"] = mem
        print("\nmemory relative error (median / max):")
        for part in ("held_out", "held_out_analytical", "fit"):
            for k, v in mem[part].items():
                if v["n"]:
                    print(f"  {part:20s} {k:7s} {100 * v['median']:6.2f}% / {100 * v['max']:6.2f}%  (n={v['n']})")
        for s, v in mem["by_strategy"].items():
            if v["n"]:
                print(f"  held_out total {s:8s} {100 * v['median']:6.2f}% / {100 * v['max']:6.2f}%")
        if args.write_coefficients:
            path = M.write_default_coefficients(coeffs, meta={
                "fitted_on": [f"{label} {json.dumps(m)} s={s} {r}" for label, _, m, _, s, r, _ in fit_jobs],
                "held_out_total_median": mem["held_out"]["total"]["median"],
                "held_out_total_max": mem["held_out"]["total"]["max"], "created": time.strftime("%Y-%m-%d %H:%M")})
            log(f"wrote {path}")

    if not args.skip_memory:
        log("\nend to end: whole train steps compiled by the trainer (held-out shape, AdamW, 4 layers)")
        rows = end_to_end(cache, log, os.path.join(args.cache or "/tmp", "costmodel_e2e_run"))
        save_cache()
        print(f"{'bucket':>6s} {'batch':>5s} {'plan':50s} {'XLA MiB':>9s} {'plan_bytes':>10s} {'err':>6s} "
              f"{'backward':>9s} {'err':>6s}")
        for r in rows:
            print(f"{r['bucket']:6d} {r['batch']:5d} {json.dumps(r['plan']):50s} {fmt_mib(r['xla'])} "
                  f"{fmt_mib(r['pred'])}  {100 * r['err']:5.1f}% {fmt_mib(r['pred_backward'])} "
                  f"{100 * r['err_backward']:5.1f}%")
        uniform = [r for r in rows if len(r["plan"]) == 1]
        mixed = [r for r in rows if len(r["plan"]) > 1]
        e2e = {"uniform": summary([r["err"] for r in uniform]), "mixed": summary([r["err"] for r in mixed]),
               "mixed_backward": summary([r["err_backward"] for r in mixed]), "rows": rows}
        result["end_to_end"] = e2e
        for part in ("uniform", "mixed", "mixed_backward"):
            v = e2e[part]
            if v["n"]:
                print(f"end-to-end {part:15s} error (median / max): {100 * v['median']:.2f}% / "
                      f"{100 * v['max']:.2f}%  (n={v['n']})")

    if not args.skip_flops:
        mesh = meshes.get((("data", 8),)) or build_mesh({"data": 8})
        rows = flops_check(cache, mesh, log, (128,) if args.quick else (128, 512))
        save_cache()
        print("\nFLOPs of a 2-layer step per device: analytical (every tile counted) vs dots in the compiled HLO "
              "x loop trip counts (cost_analysis counts loop bodies once)")
        print(f"{'seq':>6s} {'strategy':8s} {'analytic GF':>12s} {'HLO GF':>9s} {'err':>6s} {'cost_analysis GF':>17s}")
        for r in rows:
            print(f"{r['seq_len']:6d} {r['strategy']:8s} {r['analytic'] / 1e9:12.3f} {r['hlo'] / 1e9:9.3f} "
                  f"{100 * r['err']:5.1f}% {r['cost_analysis_once'] / 1e9:17.3f}")
        result["flops"] = {"summary": summary([r["err"] for r in rows]), "rows": rows}
        v = result["flops"]["summary"]
        print(f"flops analytic vs HLO (median / max): {100 * v['median']:.2f}% / {100 * v['max']:.2f}%")

    result["wall_s"] = time.time() - t_start
    print(f"\ntotal {result['wall_s']:.0f} s")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
