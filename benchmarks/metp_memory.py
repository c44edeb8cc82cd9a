"""METP evidence: per-device memory and collective bytes of one layer's training step.

For `tp`, `tp_sp`, `ring`, `ulysses` and `metp` at p = 4 and 8 and lengths from 1K upwards,
compile one Transformer layer's forward + backward (GPT-like: h=1024, 16 heads, MLP 4h, f32,
batch 1, blockwise attention) with abstract inputs and report XLA's per-device figures:
argument + output + temp bytes (`memory_analysis()`), and bytes handled by each kind of
collective (from the compiled HLO, loop trip counts applied). A strategy stops at the first
length whose p devices would need more than this machine's RAM. Also prints the full-overlap
condition of METP's ring steps for the A100 and H200 profiles.

    python benchmarks/metp_memory.py [--max-len 131072] [--json OUT]

Figures are compiled, not run; remat-free (the default plan policy). XLA:CPU's
`cse_barrier_expander` pass is disabled (as dysejax does) so that memory figures behave as on
GPU/TPU.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from dysejax.runtime import simulate_host_devices  # noqa: E402  (imports no JAX)

simulate_host_devices(8)

STRATEGIES = ("tp", "tp_sp", "ring", "ulysses", "metp")
RAM_BYTES = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def overlap_condition(profile, dtype_bytes: int = 2) -> dict:
    """Smallest local tokens per ring step for compute to hide the next block's transfer.

    MLP step: 16·b·s·h²/p² flops vs 8·h²/p·bytes moved -> b·s/p >= (bytes/2)·F/B.
    Attention inner step: 4·b·(s/p)²·h/p flops vs 2·b·(s/p)·(h/p)·bytes -> s/p >= (bytes/2)·F/B.
    """
    tokens = dtype_bytes / 2 * profile.flops / profile.intra_node_bw
    return {"device": profile.name, "flops": profile.flops, "link_bytes_per_s": profile.intra_node_bw,
            "mlp_min_local_tokens": tokens, "attention_min_local_len": tokens,
            "min_seq_len_p8": 8 * tokens}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-len", type=int, default=131072)
    p.add_argument("--devices", type=int, nargs="+", default=[4, 8])
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)

    import jax

    from costmodel.hardware import get_profile
    from costmodel.probe import figures, layer_step
    from sharding.mesh import build_mesh
    from sharding.ops.blocks import BlockSpec

    spec = BlockSpec(n_heads=16, head_dim=64, d_model=1024, d_ff=4096, gated=False, activation="gelu",
                     attention="blockwise", attention_block=512)
    lengths = [1024 * 2**i for i in range(16) if 1024 * 2**i <= args.max_len]
    rows = []
    print(f"{'p':>2} {'seq':>6} " + " ".join(f"{s:>10}" for s in STRATEGIES) + "   (MiB per device)  "
          "metp vs tp / tp_sp")
    for n in args.devices:
        mesh = build_mesh({"data": n}, jax.devices()[:n])
        stopped: set[str] = set()
        for seq in lengths:
            cells = {}
            for name in STRATEGIES:
                if name in stopped:
                    continue
                t0 = time.perf_counter()
                fig = figures(layer_step(name, spec, mesh, batch=1, seq_len=seq, scan=False))
                fig["compile_s"] = time.perf_counter() - t0
                fits = fig["total"] * n <= RAM_BYTES
                rows.append({"devices": n, "seq_len": seq, "strategy": name, "fits_ram": fits, **fig})
                cells[name] = fig["total"]
                if not fits:
                    stopped.add(name)
            line = " ".join(f"{cells[s] / 2**20:10.1f}" if s in cells else f"{'-':>10}" for s in STRATEGIES)
            ratio = ""
            if all(s in cells for s in ("metp", "tp", "tp_sp")):
                ratio = (f"  -{100 * (1 - cells['metp'] / cells['tp']):.0f}% / "
                         f"-{100 * (1 - cells['metp'] / cells['tp_sp']):.0f}%")
            print(f"{n:>2} {seq:>6} {line}{ratio}", flush=True)
            if len(stopped) == len(STRATEGIES):
                break

    print("\ncollective bytes per device per layer step (MiB), p=8, longest common length:")
    common = max((r["seq_len"] for r in rows if r["devices"] == max(args.devices)
                  and all(any(q["strategy"] == s and q["seq_len"] == r["seq_len"] and q["devices"] == r["devices"]
                              for q in rows) for s in STRATEGIES)), default=None)
    for r in rows:
        if r["devices"] == max(args.devices) and r["seq_len"] == common:
            coll = ", ".join(f"{k} {v / 2**20:.1f}" for k, v in r["collectives"].items() if v)
            print(f"  {r['strategy']:8s} s={common}: {coll}")

    overlap = [overlap_condition(get_profile(name)) for name in ("a100-80gb", "h200")]
    print("\nMETP full-overlap condition (bf16; compute per ring step >= transfer of the next block):")
    for o in overlap:
        print(f"  {o['device']}: F/B = {o['mlp_min_local_tokens']:.0f} tokens -> MLP needs b*s/p >= "
              f"{o['mlp_min_local_tokens']:.0f}, attention needs s/p >= {o['attention_min_local_len']:.0f} "
              f"(s >= {o['min_seq_len_p8']:.0f} at p=8)")
    if args.json:
        from benchmarks.results_io import write_json
        write_json(args.json, {"model": {"d_model": 1024, "n_heads": 16, "d_ff": 4096, "dtype": "float32",
                                         "batch": 1}, "ram_bytes": RAM_BYTES, "rows": rows, "overlap": overlap})
    return 0


if __name__ == "__main__":
    sys.exit(main())
