"""GPipe vs 1F1B memory: XLA's per-device bytes of the pipelined train step, by micro-batches.

    python benchmarks/pipeline_memory.py [--config configs/pipeline_tiny.yaml]
                                         [--microbatches 2 4 8 16] [--json OUT]

For each micro-batch count m: the train step of one bucket-256 batch of 64 rows under `gpipe`,
`1f1b`, each with and without remat `full` (2 stages x data 4 on 8 simulated CPU devices), and, for
comparison, `dp` without a pipeline on the same 8 devices. Compiled, not run; float32; byte
tokens (vocabulary 264), so that only the layers and the schedule weigh.
Figures: `memory_analysis()` temp bytes and argument + output + temp - alias per device.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from results_io import write_json  # noqa: E402  (the script's folder is on sys.path)

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "pipeline_tiny.yaml")
SEQ_LEN, ROWS = 256, 64
COMMON = ["data.tokenizer=bytes", "model.vocab_size=264", f"data.buckets=[{SEQ_LEN}]",
          f"data.tokens_per_batch={SEQ_LEN * ROWS}", "data.eval_batches=0", "data.max_docs=300",
          "train.progress=false"]
VARIANTS = {"gpipe": ["parallel.pipeline.schedule=gpipe"],
            "gpipe_remat_full": ["parallel.pipeline.schedule=gpipe", "model.remat=full"],
            "1f1b": ["parallel.pipeline.schedule=1f1b"],
            "1f1b_remat_full": ["parallel.pipeline.schedule=1f1b", "model.remat=full"]}


def step_figures(config: str, overrides: list[str], workdir: str) -> dict:
    """{temp, total} bytes per device of the compiled train step of this configuration."""
    import dysejax
    cfg = dysejax.load_config(config, COMMON + overrides)
    trainer = dysejax.Trainer(cfg, workdir=workdir, verbose=False)
    plan, batch = trainer.planner.candidates(SEQ_LEN)[0], trainer.data.batch_size(SEQ_LEN)
    trainer.planner.check(plan, SEQ_LEN, batch)
    program = trainer.programs.get("train", SEQ_LEN, batch, plan)
    return {"temp": program.memory["temp"], "total": program.bytes_per_device}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--microbatches", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    from dysejax import runtime
    runtime.configure_host_devices(8)
    work = tempfile.mkdtemp(prefix="pipeline_memory_")
    t0 = time.time()
    mib = 2 ** 20
    no_pipeline = ["parallel.pipeline.stages=1", "parallel.pipeline.microbatches=1", "parallel.plan=dp"]
    dp = step_figures(args.config, no_pipeline, os.path.join(work, "dp"))
    rows = []
    print(f"{'m':>3} | {'gpipe':>9} | {'1f1b':>9} | {'gpipe+full':>10} | {'1f1b+full':>9} | "
          f"1f1b vs gpipe, both without / with remat full  (temp MiB)")
    for m in args.microbatches:
        row = {"microbatches": m}
        for name, extra in VARIANTS.items():
            row[name] = step_figures(args.config, extra + [f"parallel.pipeline.microbatches={m}"],
                                     os.path.join(work, f"{name}_{m}"))
        t = {k: row[k]["temp"] for k in VARIANTS}
        print(f"{m:>3} | {t['gpipe'] / mib:9.1f} | {t['1f1b'] / mib:9.1f} | {t['gpipe_remat_full'] / mib:10.1f} | "
              f"{t['1f1b_remat_full'] / mib:9.1f} | {t['1f1b'] / t['gpipe'] - 1:+.0%} / "
              f"{t['1f1b_remat_full'] / t['gpipe_remat_full'] - 1:+.0%}", flush=True)
        rows.append(row)
    print(f"dp without a pipeline (mesh data 8, {ROWS // 8} rows per device): temp {dp['temp'] / mib:.1f} MiB")
    out = {"config": os.path.basename(args.config), "seq_len": SEQ_LEN, "rows": ROWS, "devices": 8,
           "dtype": "float32", "vocab": 264, "dp": dp, "results": rows, "wall_s": time.time() - t0}
    if args.json:
        write_json(args.json, out)


if __name__ == "__main__":
    main()
