"""The flash kernel's tile size against the plain block loop, attention alone, on one CPU device.

`sharding/ops/flash.py` cuts the requested tile to `MAX_TILE` a side, then halves it while one
tile's scores over batch and heads (B·H·bq·bk float32) exceed `TILE_ELEMENTS`, down to
`MIN_TILE`. This sweeps those bounds at given shapes, forward + backward of one layer's causal
attention, against the plain block loop of `plain_step.py` (query block i attends to keys
[0, (i+1)·512)); gradients of every setting are asserted equal to the plain loop's first.
Rounds are interleaved (the order reversed every round); medians and ranges, and plain /
setting (> 1: the kernel faster).

    python benchmarks/attention_tiles.py --cases 8x512x8x64,1x4096x8x64,8x512x8x16 \
        --tile-elements 262144 1048576 4194304 --json benchmarks/results/attention_tiles.json

Cases are BATCHxLENGTHxHEADSxHEAD_DIM[:docs] (`docs` equal documents packed per row).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")


def parse_case(text: str) -> dict:
    head, _, docs = text.partition(":")
    try:
        batch, seq, heads, head_dim = (int(x) for x in head.split("x"))
    except ValueError:
        raise SystemExit(f"error: bad case {text!r}: want BATCHxLENGTHxHEADSxHEAD_DIM[:docs], e.g. 8x512x8x64")
    return {"name": text, "batch": batch, "seq": seq, "heads": heads, "head_dim": head_dim, "docs": int(docs or 1)}


def run_case(case: dict, settings: list[tuple[int, int, int]], rounds: int, block: int, tol: float) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import plain_step
    from sharding.ops import flash
    from sharding.ops.blocks import BlockSpec, local_attention
    from step_vs_plain import interleaved, make_batch, relative_error, summary, timed

    B, S, H, D = case["batch"], case["seq"], case["heads"], case["head_dim"]
    spec = BlockSpec(n_heads=H, head_dim=D, d_model=H * D, d_ff=4 * H * D, attention="blockwise",
                     attention_block=block)
    rng = np.random.default_rng(1)
    q, k, v, ct = (jnp.asarray(rng.standard_normal((B, S, H, D)), jnp.float32) for _ in range(4))
    seg = jnp.asarray(make_batch(B, S, case["docs"], 256)["segment_ids"])

    def grads_of(attend):
        return jax.jit(jax.grad(lambda q, k, v: jnp.sum(attend(q, k, v) * ct), argnums=(0, 1, 2)))

    plain = grads_of(lambda q, k, v: plain_step.attention(q, k, v, seg, block=block))
    want = plain(q, k, v)
    runners, tiles, errors = {"plain": lambda: timed(plain, q, k, v)}, {}, {}
    saved = flash.TILE_ELEMENTS, flash.MIN_TILE, flash.MAX_TILE
    try:
        for elements, floor, cap in settings:
            flash.TILE_ELEMENTS, flash.MIN_TILE, flash.MAX_TILE = elements, floor, cap  # read when traced
            name = f"{elements}/{floor}/{cap}"
            fn = grads_of(lambda q, k, v: local_attention(q, k, v, spec, q_segment_ids=seg, kv_segment_ids=seg))
            errors[name] = max(relative_error(a, b) for a, b in zip(fn(q, k, v), want))  # traces and compiles here
            assert errors[name] <= tol, f"{case['name']} {name}: gradients differ by {errors[name]:.2e}"
            tiles[name] = flash.tile_sizes(block, block, S, S, B * H)
            runners[name] = (lambda fn: lambda: timed(fn, q, k, v))(fn)
    finally:
        flash.TILE_ELEMENTS, flash.MIN_TILE, flash.MAX_TILE = saved
    times = interleaved(runners, rounds)
    return {**case, "tiles": tiles, "grad_rel_err": errors, "seconds": {n: summary(t) for n, t in times.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="8x512x8x64,1x4096x8x64,8x512x8x16,1x4096x8x16")
    p.add_argument("--tile-elements", type=int, nargs="+", default=[1 << 18, 1 << 20, 1 << 22])
    p.add_argument("--min-tiles", type=int, nargs="+", default=[64])
    p.add_argument("--max-tiles", type=int, nargs="+", default=[128, 512])
    p.add_argument("--block", type=int, default=512, help="the requested tile (the model's attention_block)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tol", type=float, default=1e-5)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    cases = [parse_case(c) for c in args.cases.split(",")]
    settings = [(e, m, c) for e in args.tile_elements for m in args.min_tiles for c in args.max_tiles]
    import time

    import jax
    t0, results = time.perf_counter(), []
    print(f"device: {jax.devices()[0].platform}; attention forward + backward, {args.rounds} interleaved rounds; "
          "setting = TILE_ELEMENTS/MIN_TILE/MAX_TILE, tile = (bq, bk); ratio = plain median / setting median")
    for case in cases:
        r = run_case(case, settings, args.rounds, args.block, args.tol)
        results.append(r)
        plain = r["seconds"]["plain"]
        print(f"{case['name']:<16} plain {plain['median_s']:.3f} s ({plain['min_s']:.3f}-{plain['max_s']:.3f})")
        for name, tile in r["tiles"].items():
            s = r["seconds"][name]
            print(f"  {name:<14} tile {str(tile):<11} {s['median_s']:.3f} s ({s['min_s']:.3f}-{s['max_s']:.3f})  "
                  f"ratio {plain['median_s'] / s['median_s']:.2f}")
    if args.json:
        from results_io import write_json
        write_json(args.json, {"rounds": args.rounds, "block": args.block, "settings": settings, "cases": results,
                               "wall_s": time.perf_counter() - t0})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
