"""Data for dysejax: byte tokens, document sources, buckets, packing and batch plans.

    from dysejax.data import DataPipeline, Batch, BatchPlan, PAD_ID, EOS_ID
    pipe = DataPipeline(cfg.data, seed=cfg.train.seed, batch_multiple=8)
    it = pipe.train_iterator(); batch = next(it); it.state()

Modules: `tokenizer` (the Tokenizer interface, byte ids), `tokenizers` (tokenizers JSON,
sentencepiece, model folders, a BPE trained on the corpus), `sources` (byte tokens of stdlib /
text files), `corpus` (documents as text, streamed: files, JSONL, Parquet, Arrow),
`token_cache` (a corpus tokenised once, memory-mapped), `prepare` (config -> tokenizer and
token source), `synthetic` (`sample_lengths`, SyntheticSource), `split` (train/eval),
`bucketing` (bucket choice, batch sizes, long-document policy), `packing` (BatchPlan, packing),
`batch` (Batch, materialize), `pipeline` (DataPipeline, DataIterator).
"""
from dysejax.data.batch import Batch
from dysejax.data.bucketing import batch_size, bucket_for
from dysejax.data.packing import BatchPlan
from dysejax.data.pipeline import DataIterator, DataPipeline, open_source
from dysejax.data.synthetic import sample_lengths
from dysejax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, ByteTokenizer, Tokenizer, decode, encode
from dysejax.data.tokenizers import open_tokenizer

__all__ = ["Batch", "BatchPlan", "DataIterator", "DataPipeline", "open_source", "sample_lengths",
           "batch_size", "bucket_for", "PAD_ID", "BOS_ID", "EOS_ID", "encode", "decode", "Tokenizer",
           "ByteTokenizer", "open_tokenizer"]
