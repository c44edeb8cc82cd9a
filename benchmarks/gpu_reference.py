"""The GPU time model against published GPU measurements: every point priced as `auto` prices plans.

MODEL PREDICTIONS against PUBLISHED FIGURES: nothing runs on a GPU here. Each published point is
priced with the same model shape, hardware profile (`costmodel.hardware`, sources quoted there
and in docs/cluster_predictions.md), parallel configuration, sequence length and batch, through
the cost table `parallel.plan: auto` searches (`costmodel.table.cost_table`: layer times, the
embedding / head / loss / optimizer base, switch costs), with gradient accumulation and the
cross-node gradient all-reduce of data parallelism priced as `costmodel.cluster.ilp` prices
them. Where a publisher does not state the remat policy, the fastest that fits the device is
taken (what `auto` would pick for that strategy). Error = predicted / published - 1 of the
step time (+: the model predicts slower); TFLOP/s figures are turned into step times with the
publisher's own FLOP formula.

Points:
  * MaxText Llama2-7B on GCP A3 (H100) nodes, FSDP 8 in a node, data parallel across 1-16 nodes,
    4 x 4,096 tokens per GPU, `minimal_flash` remat (configs/a3/llama_2_7b/*.sh, README);
  * JAX-Toolbox MaxText Llama2-7B, 8 x H100 (DGX), FSDP 8, 2 x 4,096 per GPU: 0.721 s / step;
  * NeMo 24.03 LLaMA2-7B FP8 on DGX-H100 (performance_long_sequence.md) rows dysejax can express
    (no pipeline or context parallelism); the others are listed as not priced, with the reason;
  * FlexSP's measured all-to-all bandwidths on its 64 x A100-40GB cluster (its solver.py);
  * FlexSP's fitted compute model (solver.py: ms per token and per token^2 of GPT-7B/13B/30B),
    a comparison of two models (theirs fitted to their measurements), kept out of the median.

One term is fitted: the all-to-all efficiency inside a node (fraction of NVLink an all-to-all
reaches), on FlexSP's 8-GPU point; its error is reported on the points it did not use.

    python benchmarks/gpu_reference.py --json benchmarks/results/gpu_reference.json
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_io import write_json  # noqa: E402

from costmodel import memory as M  # noqa: E402
from costmodel import time as T  # noqa: E402
from costmodel.calibration import Calibration  # noqa: E402
from costmodel.cluster.workload import Model, load_model  # noqa: E402
from costmodel.hardware import PROFILES, DeviceProfile  # noqa: E402
from costmodel.table import Choice, cost_table  # noqa: E402
from sharding.ops.blocks import BlockSpec  # noqa: E402
from sharding.remat import NAMES as REMATS  # noqa: E402

MEMORY_FRACTION = 0.9  # usable share of a device (costmodel.cluster.Cluster's default)
FIT_POINT = "flexsp-a2a-8"  # the one point the all-to-all efficiency is fitted on


def llama2_7b() -> Model:
    """Llama2-7B as configs/7b.yaml writes it (bf16 compute, f32 parameters and Adam moments)."""
    return load_model(os.path.join(ROOT, "configs", "7b.yaml"))


def gpt(h: int, layers: int, heads: int, name: str) -> Model:
    """FlexSP's GPT models (Megatron GPT: 4h GELU MLP, 50,257-token vocabulary)."""
    spec = BlockSpec(n_heads=heads, head_dim=h // heads, d_model=h, d_ff=4 * h, gated=False, activation="gelu",
                     attention="blockwise", attention_block=1024, compute_dtype="bfloat16")
    return Model(name, spec, layers, 50257)


def layer_weights(model: Model) -> int:
    """Elements of one layer's weight matrices."""
    return M.Shape(model.spec, {"data": 1}, 1, 1).layer.matrix_elems


def model_flops_per_token(model: Model, seq: int) -> float:
    """The FLOP count MaxText (before its July 2025 causal change) and NeMo's `llama2` formula use:
    6 x (layer weights x layers + head) + 12 x layers x seq x heads x head_dim (non-causal)."""
    s = model.spec
    return (6 * (layer_weights(model) * model.n_layers + s.d_model * model.vocab)
            + 12 * model.n_layers * seq * s.n_heads * s.head_dim)


@dataclass
class Priced:
    """A priced configuration: iteration seconds, the option (strategy@remat), bytes per device."""

    seconds: float
    option: str
    bytes: float
    fits: bool
    parts: dict = field(default_factory=dict)


def coefficients(profile: DeviceProfile, alltoall_efficiency: Optional[float] = None, fp8: bool = False):
    """The time model's rates for a profile (fp8: the matmuls at the fp8 peak, attention at bf16)."""
    kw = {} if alltoall_efficiency is None else {"alltoall_efficiency": alltoall_efficiency}
    c = T.TimeCoefficients.from_profile(profile, **kw)
    if fp8:
        c = replace(c, matmul_flops=c.matmul_flops * profile.fp8_flops / profile.flops)
    return c


def price(model: Model, profile: DeviceProfile, mesh: dict, rows: int, seq: int, strategy: str,
          remats=REMATS, micro_steps: int = 1, dp_nodes: int = 1, coeffs=None) -> Priced:
    """One training iteration: `micro_steps` micro-steps of `rows` x `seq` on `mesh` (a node or a
    group), the optimizer update once, and the gradients all-reduced across `dp_nodes` nodes that
    replicate the group (data parallelism across nodes, as `costmodel.cluster.ilp`'s `rep`).
    Of `remats`, the fastest that fits the device (all over the limit: the leanest)."""
    coeffs = coeffs or coefficients(profile)
    hardware = Calibration(f"gpu-{profile.name}", dict(mesh), coeffs)
    choices = [Choice(strategy, r) for r in remats]
    kw = dict(param_bytes=model.param_bytes, hardware=hardware, loss_chunk=model.loss_chunk)
    table = cost_table(model.spec, mesh, rows, seq, model.n_layers, model.vocab, choices=choices, **kw)
    ends = cost_table(model.spec, mesh, rows, seq, 0, model.vocab, choices=choices[:1], **kw)
    update = table.base_time_s - ends.base_time_s  # the optimizer update: once per iteration
    limit = MEMORY_FRACTION * profile.memory_bytes
    options = []
    for k, c in enumerate(choices):
        plan = table.uniform(k)
        t, b = table.plan_time(plan), table.plan_bytes(plan)
        options.append((b > limit, t if b <= limit else b, t, b, c.label))
    over, _, t, b, label = min(options)
    sync = 0.0
    if dp_nodes > 1:  # each device all-reduces its shard of the f32 gradients with its peers in the other nodes
        n = math.prod(mesh.values())
        grads = (layer_weights(model) * model.n_layers + model.vocab * model.spec.d_model) / n * model.param_bytes
        sync = T.collective_time(coeffs, "all-reduce", grads, dp_nodes, 1)
    seconds = micro_steps * (t - update) + update + sync
    return Priced(seconds, label, b, not over, {"micro_step_s": t, "update_s": update, "dp_sync_s": sync})


# ------------------------------------------------------------------------------------------------
# The published points
# ------------------------------------------------------------------------------------------------
MAXTEXT = ("AI-Hypercomputer/maxtext MaxText/configs/a3/llama_2_7b/README.md: Llama2-7B TFLOP/sec/chip "
           "1x A3 (h100-80gb-8) 492, 2x 422, 4x 407, 8x 409, 16x 375; {n}vm.sh: dcn_data_parallelism={n} "
           "ici_fsdp_parallelism=8 per_device_batch_size=4 max_target_length=4096 attention=cudnn_flash_te "
           "remat_policy=minimal_flash, XLA flags --xla_gpu_enable_pipelined_all_gather=true ... "
           "pipelined_reduce_scatter / pipelined_all_reduce=true")
JAXTOOLBOX = ("NVIDIA/JAX-Toolbox rosetta/rosetta/projects/maxtext/README.md (2024): '7B | H100 80G SXM | BF16 | "
              "4096 | 8 | 2 | 1 | 8 | 1 | 16 | Flash | minimal_flash | Off | 0.721 | 22.19' (#GPUs 8, BS/GPU 2, "
              "DP 1, FSDP 8, TP 1, GBS 16, step time 0.721 s); 'NVIDIA DGX H100 80G nodes'")
NEMO = ("NVIDIA/NeMo docs/source/performance/performance_long_sequence.md, 'LLAMA2-7B (FP8) - H100', "
        "NeMo24.03.01, DGX-H100: SeqLen (K) | # of GPUs | Batch Size | Without CP TFLOPS/GPU | TP | PP | DP | CP | "
        "With CP TFLOPS/GPU: {row}")
NEMO_ROWS = {  # seq K: (GPUs, global batch, TP, PP, DP, CP, TFLOPS/GPU with that configuration)
    4: (4, 1024, 1, 1, 4, 1, 768), 8: (8, 512, 1, 2, 4, 1, 730), 16: (16, 256, 2, 1, 8, 1, 660),
    32: (32, 128, 2, 1, 8, 2, 610), 64: (64, 64, 4, 1, 8, 2, 574), 128: (128, 32, 4, 1, 8, 4, 555),
    256: (256, 16, 4, 1, 8, 8, 549), 512: (512, 8, 8, 1, 4, 16, 549), 1024: (1024, 4, 8, 1, 4, 32, 536)}
FLEXSP_A2A = ("PKU-DAIR/Hetu-Galvatron branch flexsp, galvatron/flexsp_solver/solver.py: 'alltoall_bandwidth_dict_gbs "
              "= {1: 1e10, 2: 119.54, 4: 104.07, 8: 96.5, 16: 10.33, 32:5.94, 64:4.87} # 4k seq, 2 IB' (GB/s of the "
              "local array: time = size / sp / v); cluster: 64 x A100-40GB, NVLink, 400 Gb/s IB")
FLEXSP_A2A_GBS = {2: 119.54, 4: 104.07, 8: 96.5, 16: 10.33, 32: 5.94, 64: 4.87}
FLEXSP_FIT = ("PKU-DAIR/Hetu-Galvatron branch flexsp, galvatron/flexsp_solver/solver.py optimizer_param_dict: "
              "compute time (ms) = (cpt_alpha1 x seqlen^2 + cpt_alpha2 x seqlen) / sp_size + cpt_beta1; gpt-7b "
              "alpha1 5.128e-6, alpha2 183.9576e-3; gpt-13b 9.2852e-6, 306.0189e-3; gpt-30b 15.4262e-6, 803.5742e-3")
FLEXSP_CONSTANTS = {"gpt-7b": (4096, 32, 32, 5.128e-6, 183.9576e-3), "gpt-13b": (5120, 40, 40, 9.2852e-6, 306.0189e-3),
                    "gpt-30b": (6656, 60, 52, 15.4262e-6, 803.5742e-3)}
A2A_SIZE = 4096 * 4096 * 2  # the q-sized array of one 4,096-token sequence in bf16 ("4k seq")


def point(pid, source, config, unit, published, predicted, published_s=None, predicted_s=None, **extra) -> dict:
    """One row: the published figure, the prediction, the error (of the step time where there is one)."""
    if published_s is not None:
        err = predicted_s / published_s - 1
    else:  # a bandwidth: the time is size / bandwidth, so the time's error is published / predicted - 1
        err = published / predicted - 1 if unit.startswith("GB/s") else predicted / published - 1
    return dict(id=pid, source=source, config=config, unit=unit, published=published, predicted=predicted,
                published_s=published_s, predicted_s=predicted_s, error=err, **extra)


def maxtext_points(coeffs_for) -> list:
    model, prof = llama2_7b(), PROFILES["h100-a3"]
    out = []
    for nodes, tflops in ((1, 492), (2, 422), (4, 407), (8, 409), (16, 375)):
        p = price(model, prof, {"data": 8}, 32, 4096, "fsdp", ("selective",), dp_nodes=nodes, coeffs=coeffs_for(prof))
        flops = model_flops_per_token(model, 4096) * 32 * 4096  # one node's step
        out.append(point(f"maxtext-{nodes}node", MAXTEXT.format(n=nodes), f"{8 * nodes} x H100 (A3), fsdp 8 x DP {nodes} "
                         f"nodes, 4 x 4096 / GPU, {p.option}", "TFLOP/s/GPU", tflops, flops / p.seconds / 8 / 1e12,
                         published_s=flops / (tflops * 1e12 * 8), predicted_s=p.seconds, parts=p.parts, fits=p.fits))
    return out


def jaxtoolbox_point(coeffs_for) -> dict:
    model, prof = llama2_7b(), PROFILES["h100"]
    p = price(model, prof, {"data": 8}, 16, 4096, "fsdp", ("selective",), coeffs=coeffs_for(prof))
    return point("jaxtoolbox-1node", JAXTOOLBOX, "8 x H100 (DGX), fsdp 8, 2 x 4096 / GPU, " + p.option, "s/step",
                 0.721, p.seconds, published_s=0.721, predicted_s=p.seconds, parts=p.parts, fits=p.fits)


def nemo_points(coeffs_for) -> list:
    """NeMo's rows: TP x DP only (no PP, no CP) are dysejax configurations; micro-batch 1 per
    data-parallel rank (NeMo's table does not give it); the matmuls at the fp8 peak."""
    model, prof = llama2_7b(), PROFILES["h100"]
    out = []
    for k, (gpus, gbs, tp, pp, dp, cp, tflops) in NEMO_ROWS.items():
        seq = k * 1024
        row = f"{k} | {gpus} | {gbs} | TP {tp} PP {pp} DP {dp} CP {cp} | {tflops}"
        flops = model_flops_per_token(model, seq) * gbs * seq
        published_s = flops / (tflops * 1e12 * gpus)
        if pp > 1 or cp > 1:
            why = "pipeline parallelism" if pp > 1 else "tensor and context parallelism in one layer"
            out.append(dict(id=f"nemo-{k}k", source=NEMO.format(row=row), config=f"{gpus} x H100, TP {tp} PP {pp} "
                            f"DP {dp} CP {cp}", unit="TFLOP/s/GPU", published=tflops, predicted=None, error=None,
                            not_priced=f"dysejax has no {why} (no strategy of the same configuration)",
                            published_s=published_s))
            continue
        if tp == 1:  # data parallelism: dysejax's dp (weights gathered once a step) or fsdp (per layer)
            mesh, strategies = {"data": dp}, ("dp", "fsdp")
        else:
            mesh, strategies = {"data": dp, "model": tp}, ("tp_sp",)
        nodes = max(1, gpus // prof.devices_per_node)
        p = min((price(model, prof, mesh, dp, seq, st, micro_steps=gbs // dp, coeffs=coeffs_for(prof, fp8=True))
                 for st in strategies), key=lambda q: (not q.fits, q.seconds))
        out.append(point(f"nemo-{k}k", NEMO.format(row=row), f"{gpus} x H100 ({nodes} node(s)), {p.option} on {mesh}, "
                         f"micro-batch 1 / DP rank x {gbs // dp} micro-steps, fp8 matmuls", "TFLOP/s/GPU", tflops,
                         flops / p.seconds / gpus / 1e12, published_s=published_s, predicted_s=p.seconds, parts=p.parts,
                         fits=p.fits))
    return out


def alltoall_gbs(coeffs, p: int) -> float:
    """GB/s of the local array (FlexSP's measure) of one all-to-all over p GPUs, 8 to a node."""
    return A2A_SIZE / T.collective_time(coeffs, "all-to-all", A2A_SIZE, p, min(p, 8)) / 1e9


def fit_alltoall_efficiency() -> float:
    """The fraction of NVLink an all-to-all inside a node reaches, from FlexSP's 8-GPU point."""
    prof = PROFILES["a100-40gb"]
    lat = prof.link_latency_s
    seconds = A2A_SIZE / (FLEXSP_A2A_GBS[8] * 1e9) - 7 * lat
    return (7 / 8) * A2A_SIZE / seconds / prof.intra_node_bw


def flexsp_a2a_points(coeffs_for, fitted: bool) -> list:
    c = coeffs_for(PROFILES["a100-40gb"])
    where = lambda p: "one node" if p <= 8 else f"{p // 8} nodes"  # noqa: E731
    return [point(f"flexsp-a2a-{p}", FLEXSP_A2A, f"all-to-all over {p} x A100-40GB ({where(p)})", "GB/s (local array)",
                  gbs, alltoall_gbs(c, p), fitted=fitted and f"flexsp-a2a-{p}" == FIT_POINT)
            for p, gbs in FLEXSP_A2A_GBS.items()]


def flexsp_constant_points(coeffs_for, lengths=(4096, 8192, 16384, 32768, 65536)) -> list:
    """Our per-sequence compute time on one A100-40GB, a s^2 + b s + c by least squares over
    `lengths`, against FlexSP's fitted alpha1 (ms / token^2) and alpha2 (ms / token)."""
    import numpy as np
    prof = PROFILES["a100-40gb"]
    out = []
    for name, (h, layers, heads, alpha1, alpha2) in FLEXSP_CONSTANTS.items():
        model = gpt(h, layers, heads, name)
        ms = [price(model, prof, {"data": 1}, 1, s, "dp", ("none",), coeffs=coeffs_for(prof)) for s in lengths]
        ms = [1e3 * (p.parts["micro_step_s"] - p.parts["update_s"]) for p in ms]
        A = np.array([[s * s, s, 1.0] for s in lengths])
        a, b, _ = np.linalg.lstsq(A, np.array(ms), rcond=None)[0]
        out.append(point(f"flexsp-{name}-alpha1", FLEXSP_FIT, f"{name}, one A100-40GB, ms per token^2", "ms/token^2",
                         alpha1, float(a), comparison="fitted model"))
        out.append(point(f"flexsp-{name}-alpha2", FLEXSP_FIT, f"{name}, one A100-40GB, ms per token", "ms/token",
                         alpha2, float(b), comparison="fitted model"))
    return out


def run(alltoall_efficiency: Optional[float] = None, fitted: bool = True) -> list:
    """Every point priced (alltoall_efficiency None: the library's default, fitted on FIT_POINT)."""
    def coeffs_for(prof, fp8=False):
        return coefficients(prof, alltoall_efficiency, fp8)
    return (maxtext_points(coeffs_for) + [jaxtoolbox_point(coeffs_for)] + nemo_points(coeffs_for)
            + flexsp_a2a_points(coeffs_for, fitted) + flexsp_constant_points(coeffs_for))


def summary(points: list) -> dict:
    """Median / max |error| over the measured points no fit used (FlexSP's fitted constants apart)."""
    held = [abs(p["error"]) for p in points if p["error"] is not None and not p.get("fitted")
            and p.get("comparison") is None]
    model = [abs(p["error"]) for p in points if p.get("comparison")]
    return {"held_out_points": len(held), "median_abs_error": statistics.median(held), "max_abs_error": max(held),
            "not_priced": [p["id"] for p in points if p["error"] is None],
            "fitted_points": [p["id"] for p in points if p.get("fitted")],
            "flexsp_model_constants_median_abs_error": statistics.median(model) if model else None}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    t0 = time.time()
    eff = fit_alltoall_efficiency()
    if abs(eff - T.ALLTOALL_EFFICIENCY) > 0.0005:
        print(f"note: the fit gives {eff:.4f}, costmodel.time.ALLTOALL_EFFICIENCY is {T.ALLTOALL_EFFICIENCY}: update it")
    points = run()
    out = {"label": "model predictions (costmodel time model, GPU profiles) against published GPU measurements",
           "fit": {"alltoall_efficiency": eff, "fitted_on": FIT_POINT, "library_value": T.ALLTOALL_EFFICIENCY},
           "points": points, "summary": summary(points)}
    before = run(0.75, fitted=False)  # the all-to-all at the default link fraction, as before the fit
    out["without_fit"] = {"alltoall_efficiency": 0.75, "summary": summary(before),
                          "errors": {p["id"]: p["error"] for p in before}}
    out["wall_s"] = time.time() - t0
    print(out["label"])
    print(f"fitted: all-to-all efficiency inside a node {eff:.3f} of NVLink (on {FIT_POINT}); every other rate "
          "a vendor peak x the default fraction")
    print(f"{'point':<22} {'config':<70} {'unit':<18} {'published':>11} {'predicted':>11} {'error':>7}")
    for p in points:
        pred = "-" if p["predicted"] is None else f"{p['predicted']:.4g}"
        err = p.get("not_priced", "not priced") if p["error"] is None else f"{p['error']:+.1%}"
        tag = " (fit)" if p.get("fitted") else (" (model)" if p.get("comparison") else "")
        print(f"{p['id'] + tag:<22} {p['config'][:70]:<70} {p['unit']:<18} {p['published']:>11.4g} {pred:>11} {err:>7}")
    s = out["summary"]
    print(f"\nmedian |error| over {s['held_out_points']} measured points no fit used: {s['median_abs_error']:.1%} "
          f"(max {s['max_abs_error']:.1%}); without the all-to-all fit: {out['without_fit']['summary']['median_abs_error']:.1%}")
    print(f"FlexSP's fitted compute constants vs ours: median |error| {s['flexsp_model_constants_median_abs_error']:.1%}")
    print(f"not priced: {', '.join(s['not_priced'])}")
    if args.json:
        write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
