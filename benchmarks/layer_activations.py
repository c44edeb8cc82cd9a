"""Per-layer stored activations of every strategy against Megatron-LM's figure adapted to this model.

    python benchmarks/layer_activations.py [--seq-len 4096] [--rows 8] [--remat none]
                                           [--json OUT]

For each strategy and both MLP kinds (gated SiLU with d_ff 3h, plain GELU with d_ff 4h) the
forward + backward of a stack of layers is compiled at two depths (`costmodel.probe.layer_step`,
weights in the storage layout, 8 simulated devices); XLA's temp bytes per device at the deeper
stack minus the shallower, per added layer, is what one layer keeps until its backward (with the
weight bytes it keeps, if any). The reference is `costmodel.memory.megatron_activation_bytes`
(Korthikanti et al. 2022 without dropout, flash-style attention, this MLP; float32 here, as
XLA:CPU computes). Compiled, not run.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from contenders import STATIC  # noqa: E402
from dysejax.runtime import simulate_host_devices  # noqa: E402  (imports no JAX)
from results_io import write_json  # noqa: E402

simulate_host_devices(8)

MLPS = {"gated": dict(gated=True, activation="silu", ff=3), "plain": dict(gated=False, activation="gelu", ff=4)}


def per_layer_bytes(strategy: str, spec, mesh, rows: int, seq_len: int, remat: str, depths=(2, 4)) -> float:
    """XLA's temp bytes per device added by one layer (difference between two depths)."""
    from costmodel.probe import figures, layer_step
    temp = [figures(layer_step(strategy, spec, mesh, rows, seq_len, n_layers=n, remat=remat))["temp"]
            for n in depths]
    return (temp[1] - temp[0]) / (depths[1] - depths[0])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--rows", type=int, default=8, help="batch rows (global)")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--remat", default="none")
    ap.add_argument("--strategies", nargs="*", default=list(STATIC))
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    import jax

    from costmodel.memory import Shape, megatron_activation_bytes
    from sharding.mesh import build_mesh
    from sharding.ops.blocks import BlockSpec
    from sharding.strategies import get_strategy
    from sharding.strategies.base import StrategyShapeError

    mesh = build_mesh({"data": 8}, jax.devices()[:8])
    t0, rows = time.time(), []
    print(f"{'strategy':8s} {'mlp':6s} {'XLA MiB':>8} {'Megatron MiB':>12} {'ratio':>6}")
    for kind, mlp in MLPS.items():
        spec = BlockSpec(n_heads=args.heads, head_dim=args.d_model // args.heads, d_model=args.d_model,
                         d_ff=mlp["ff"] * args.d_model, gated=mlp["gated"], activation=mlp["activation"])
        shape = Shape(spec, {"data": 8}, args.rows, args.seq_len, backend="cpu")
        for name in args.strategies:
            try:
                get_strategy(name).check(spec, mesh, args.rows, args.seq_len)
            except StrategyShapeError as err:
                print(f"{name:8s} {kind:6s} cannot serve this shape: {err}")
                continue
            got = per_layer_bytes(name, spec, mesh, args.rows, args.seq_len, args.remat)
            ref = megatron_activation_bytes(shape, name)
            rows.append({"strategy": name, "mlp": kind, "xla_bytes": got, "megatron_bytes": ref, "ratio": got / ref})
            print(f"{name:8s} {kind:6s} {got / 2**20:8.1f} {ref / 2**20:12.1f} {got / ref:6.2f}", flush=True)
    worst = max((r["ratio"] for r in rows), default=None)
    if worst is not None:
        print(f"worst ratio to the adapted Megatron figure: {worst:.2f}x")
    if args.json:
        write_json(args.json, {"seq_len": args.seq_len, "rows": args.rows, "d_model": args.d_model,
                               "n_heads": args.heads, "remat": args.remat, "devices": 8, "dtype": "float32",
                               "results": rows, "worst_ratio": worst, "wall_s": time.time() - t0})


if __name__ == "__main__":
    main()
