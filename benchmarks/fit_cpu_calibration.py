"""Fit the shipped CPU calibration (costmodel/calibrations/cpu.json) on 8 simulated devices.

`parallel.plan: auto` on CPU prices plans with the calibration fitted in `parallel.costmodel_dir` (default ~/.cache/dysejax/costmodel) when
there is one, else with this one: the time model's device rates fitted to real layer programs of
a small model (every strategy under every remat policy: 8 rows of 128..2,048 tokens, and the
sequence-sharded strategies on 4 x 2,048, 2 x 4,096 and 1 x 8,192, the same tokens in fewer,
longer rows) timed on this machine, and the shipped memory coefficients. The long rows matter:
at a fixed number of rows the attention kernel's tile-loop iterations and its FLOPs both grow as
the length squared, and a fit on such samples alone cannot tell them apart (one priced an
iteration at 175 us and over-predicted 1 x 16,384 by 77%). Terms the samples cannot determine
keep the previous calibration's rates and are listed in its meta. With `parallel.profile_time`
the trainer also measures its own model's layer per option, which corrects these rates per
option.
Usage: python benchmarks/fit_cpu_calibration.py [--out FILE] [--repeats N]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dysejax.runtime import simulate_host_devices  # noqa: E402  (imports no JAX)

simulate_host_devices(8)

from costmodel.calibration import DEFAULT_CALIBRATION  # noqa: E402
from costmodel.profile import profile  # noqa: E402
from sharding.mesh import build_mesh  # noqa: E402
from sharding.ops.blocks import BlockSpec  # noqa: E402
from sharding.remat import NAMES as REMATS  # noqa: E402
from sharding.strategies import STRATEGIES  # noqa: E402

SPEC = BlockSpec(n_heads=8, head_dim=16, d_model=128, d_ff=384, attention_block=128)
LENGTHS = (128, 256, 512, 1024, 2048)
LONG_ROWS = ((4, 2048), (2, 4096), (1, 8192))  # (rows, length): 8,192 tokens as 8 x 1,024


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DEFAULT_CALIBRATION)
    ap.add_argument("--repeats", type=int, default=4)
    args = ap.parse_args(argv)
    mesh = build_mesh({"data": 8})
    strategies = tuple(STRATEGIES)
    cal = profile(mesh, SPEC, LENGTHS, batch=8, strategies=strategies, remats=REMATS,
                  repeats=args.repeats, reuse=False, more_shapes=LONG_ROWS,
                  progress=lambda s: print(f"  s={s.shape.seq_len:5d} {s.strategy:8s} {s.remat:5s} "
                                           f"x {s.shape.batch} {s.seconds * 1e3:8.2f} ms", flush=True))
    cal.meta.pop("samples", None)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(cal.to_json(), fh, indent=1, sort_keys=True)
    fit = cal.meta["fit"]
    print(f"wrote {args.out}: fit median rel. error {fit['median_rel_err']:.3f}, max {fit['max_rel_err']:.3f} "
          f"({fit['n_samples']} programs); undetermined terms (kept from the previous calibration): "
          f"{fit['undetermined'] or 'none'}")


if __name__ == "__main__":
    main()
