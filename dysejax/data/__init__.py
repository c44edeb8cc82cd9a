"""Data for dysejax: byte tokens, document sources, buckets, packing and batch plans.

    from dysejax.data import DataPipeline, Batch, BatchPlan, PAD_ID, EOS_ID
    pipe = DataPipeline(cfg.data, seed=cfg.train.seed, batch_multiple=8)
    it = pipe.train_iterator(); batch = next(it); it.state()

Modules: `tokenizer` (ids, encode/decode), `sources` (stdlib, text, jsonl), `synthetic`
(`sample_lengths`, SyntheticSource), `split` (train/eval), `bucketing` (bucket choice, batch
sizes, long-document policy), `packing` (BatchPlan, packing), `batch` (Batch, materialize),
`pipeline` (DataPipeline, DataIterator).
"""
from dysejax.data.batch import Batch
from dysejax.data.bucketing import batch_size, bucket_for
from dysejax.data.packing import BatchPlan
from dysejax.data.pipeline import DataIterator, DataPipeline, open_source
from dysejax.data.synthetic import sample_lengths
from dysejax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, decode, encode

__all__ = ["Batch", "BatchPlan", "DataIterator", "DataPipeline", "open_source", "sample_lengths",
           "batch_size", "bucket_for", "PAD_ID", "BOS_ID", "EOS_ID", "encode", "decode"]
