"""Data that streams: the data path's tokens/s next to the training step's, and peak host memory
for a corpus of a few GB (generated here).

Phases, each in its own process so that its peak RSS (ru_maxrss) is its own:
  generate  a Parquet corpus of --gb GB: documents are slices of the standard library at random
            offsets with log-normal lengths (mean ~4 KB), row groups of 4,096 documents;
  cache     stream it (pyarrow, one row group at a time) into the token cache (byte tokens);
  bpe       train the tiny config's 2048-token BPE on a --bpe-mb MB prefix and tokenise it (tokens/s);
  data      open the pipeline on the cache (split, epoch plan) and materialise --batches batches
            of the tiny config's buckets: the data path alone, tokens/s;
  train     the tiny config (bytes, 2 layers, d=128) on the same cache for --steps steps: step
            tokens/s and how long each step waited for its batch (prefetched on a thread).

Usage: python benchmarks/data_streaming.py [--gb 3] [--steps 30] [--batches 300] [--workdir DIR]
Prints a table; writes benchmarks/results/data_streaming.json.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
RESULTS = os.path.join(ROOT, "benchmarks", "results", "data_streaming.json")
BUCKETS = [64, 128, 256]


def _data_cfg(corpus: str, tokenizer: str = "bytes"):
    from dysejax.config import DataConfig
    return DataConfig(source="parquet", path=corpus, tokenizer=tokenizer, buckets=BUCKETS, tokens_per_batch=2048,
                      long_policy="truncate", eval_fraction=0.001, eval_batches=0)


def phase_generate(work: str, gb: float) -> dict:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dysejax.data.sources import stdlib_corpus

    text = stdlib_corpus().tobytes().decode("utf-8", errors="replace")
    rng = np.random.default_rng(0)
    folder = os.path.join(work, "corpus")
    os.makedirs(folder, exist_ok=True)
    target, written, docs, files = gb * 1e9, 0, 0, 0
    while written < target:
        writer = pq.ParquetWriter(os.path.join(folder, f"part{files:03d}.parquet"), pa.schema([("text", pa.string())]))
        for _ in range(64):  # 64 row groups per file
            n = rng.lognormal(7.9, 1.0, 4096).astype(np.int64).clip(16, 200_000)
            at = rng.integers(0, len(text) - 200_001, 4096)
            rows = [text[a:a + k] for a, k in zip(at.tolist(), n.tolist())]
            writer.write_table(pa.table({"text": rows}))
            written += int(n.sum())
            docs += len(rows)
            if written >= target:
                break
        writer.close()
        files += 1
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    return {"documents": docs, "text_bytes": written, "files": files, "parquet_bytes": size}


def phase_cache(work: str, _) -> dict:
    from dysejax.data.corpus import ArrowCorpus
    from dysejax.data.token_cache import TokenCache
    from dysejax.data.tokenizer import ByteTokenizer

    corpus = ArrowCorpus("parquet", os.path.join(work, "corpus"), "text", None)
    t0 = time.perf_counter()
    cache = TokenCache.open_or_build(os.path.join(work, "cache"), corpus, ByteTokenizer())
    dt = time.perf_counter() - t0
    return {"cache_s": dt, "tokens": int(cache.offsets[-1]), "cache_tokens_per_s": cache.offsets[-1] / dt,
            "cache_bytes": os.path.getsize(os.path.join(cache.path, "tokens.bin"))}


def phase_bpe(work: str, bpe_mb: float) -> dict:
    """The tiny config's 2048-token BPE trained on a prefix, then tokenising that prefix."""
    from dysejax.data.corpus import ArrowCorpus
    from dysejax.data.tokenizers import train_bpe

    limit = bpe_mb * 1e6

    def texts():
        total = 0
        for _, t in ArrowCorpus("parquet", os.path.join(work, "corpus"), "text", None).documents():
            yield t
            total += len(t)
            if total >= limit:
                return
    t0 = time.perf_counter()
    tok = train_bpe(texts(), 2048, os.path.join(work, "bpe.json"))
    out = {"bpe_train_s": time.perf_counter() - t0}
    batch, n_tok, n_bytes, t0 = [], 0, 0, time.perf_counter()
    for t in texts():
        batch.append(t)
        n_bytes += len(t)
        if len(batch) == 256:
            n_tok += sum(len(d) for d in tok.documents(batch))
            batch = []
    n_tok += sum(len(d) for d in tok.documents(batch)) if batch else 0
    dt = time.perf_counter() - t0
    out.update(bpe_prefix_bytes=n_bytes, bpe_tokens=n_tok, bpe_tokens_per_s=n_tok / dt, bpe_bytes_per_token=n_bytes / n_tok)
    return out


def phase_data(work: str, batches: int) -> dict:
    from dysejax.data import DataPipeline

    t0 = time.perf_counter()
    pipe = DataPipeline(_data_cfg(os.path.join(work, "corpus")), batch_multiple=8, cache_dir=os.path.join(work, "cache"))
    it = pipe.train_iterator()
    it.next_plan()  # plans epoch 0
    open_s = time.perf_counter() - t0
    tokens, t0 = 0, time.perf_counter()
    for _ in range(batches):
        b = next(it)
        tokens += b.real_tokens
    dt = time.perf_counter() - t0
    return {"open_s": open_s, "batches": batches, "tokens": tokens, "data_tokens_per_s": tokens / dt,
            "train_documents": len(pipe.train_docs), "epoch_batches": len(pipe.epoch_plans(0))}


def phase_train(work: str, steps: int) -> dict:
    import numpy as np

    import dysejax

    sets = ["data.source=parquet", f"data.path={os.path.join(work, 'corpus')}", "data.tokenizer=bytes",
            "model.vocab_size=264", "data.long_policy=truncate", "data.eval_fraction=0.001", "data.eval_batches=0",
            "train.progress=false", "train.checkpoint_every=1000000", f"train.steps={steps}"]
    config = dysejax.load_config(os.path.join(ROOT, "configs", "tiny.yaml"), sets)
    run = os.path.join(work, "run")
    os.makedirs(os.path.join(run, "data"), exist_ok=True)
    for name in os.listdir(os.path.join(work, "cache")):  # the cache built above, not a second one
        if not os.path.exists(os.path.join(run, "data", name)):
            os.symlink(os.path.join(work, "cache", name), os.path.join(run, "data", name))
    trainer = dysejax.Trainer(config, workdir=run, verbose=False)
    trainer.warmup()
    rows = trainer.fit()[3:]  # after the first steps (compile caches, page cache)
    tok = np.array([r["tokens"] for r in rows], float)
    step = np.array([r["step_time_s"] for r in rows])
    wait = np.array([r["data_wait_s"] for r in rows])
    return {"steps": len(rows), "step_tokens_per_s": float(tok.sum() / step.sum()), "mean_step_s": float(step.mean()),
            "mean_data_wait_s": float(wait.mean()), "max_data_wait_s": float(wait.max())}


PHASES = {"generate": phase_generate, "cache": phase_cache, "bpe": phase_bpe, "data": phase_data, "train": phase_train}


def _child(phase: str, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--phase", phase, "--workdir", args.workdir, "--gb", str(args.gb),
           "--steps", str(args.steps), "--batches", str(args.batches), "--bpe-mb", str(args.bpe_mb)]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"phase {phase} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["wall_s"] = time.perf_counter() - t0
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gb", type=float, default=3.0)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--bpe-mb", type=float, default=50.0)
    p.add_argument("--workdir")
    p.add_argument("--phase", choices=list(PHASES))
    args = p.parse_args()
    if args.phase:  # a child: run one phase, print its figures and peak RSS as one JSON line
        arg = {"generate": args.gb, "cache": None, "bpe": args.bpe_mb, "data": args.batches, "train": args.steps}[args.phase]
        out = PHASES[args.phase](args.workdir, arg)
        out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(out))
        return
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="dysejax-stream-")
    results = {"gb": args.gb, "workdir": args.workdir}
    for phase in PHASES:
        results[phase] = _child(phase, args)
        print(f"{phase}: {json.dumps(results[phase])}", flush=True)
    g, c, b, d, t = (results[k] for k in PHASES)
    rows = [
        ("generate", f"{g['text_bytes'] / 1e9:.2f} GB text, {g['documents']} docs, {g['files']} parquet files", g),
        ("cache (bytes)", f"{c['tokens'] / c['cache_s'] / 1e6:.2f} M tokens/s streamed into the cache "
                          f"({c['cache_bytes'] / 1e9:.2f} GB on disk, {c['cache_s']:.0f} s)", c),
        ("bpe", f"{b['bpe_tokens_per_s'] / 1e6:.2f} M tokens/s tokenising ({b['bpe_bytes_per_token']:.2f} "
                f"bytes/token; trained on {b['bpe_prefix_bytes'] / 1e6:.0f} MB in {b['bpe_train_s']:.0f} s)", b),
        ("data path", f"{d['data_tokens_per_s'] / 1e6:.2f} M tokens/s materialising batches (open + epoch plan "
                      f"{d['open_s']:.1f} s for {d['train_documents']} docs)", d),
        ("train step", f"{t['step_tokens_per_s'] / 1e3:.1f} K tokens/s; waited {t['mean_data_wait_s'] * 1e3:.2f} ms "
                       f"per step for data (max {t['max_data_wait_s'] * 1e3:.1f} ms)", t),
    ]
    print(f"\n{'phase':15s} {'peak RSS':>10s}  figures")
    for name, text, r in rows:
        rss = f"{r['peak_rss_mb']:.0f} MB" if r else ""
        print(f"{name:15s} {rss:>10s}  {text}")
    ratio = d["data_tokens_per_s"] / t["step_tokens_per_s"]
    print(f"\ndata path / training step: {ratio:.0f}x the tokens/s the tiny model consumes")
    results["data_over_step"] = ratio
    from benchmarks.results_io import write_json
    write_json(RESULTS, results)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
