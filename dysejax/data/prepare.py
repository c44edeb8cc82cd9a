"""From a data config to a token source: pick (or train) the tokenizer, build or reuse the cache.

Byte tokens of whole files (stdlib, a text folder) are read straight from the files; every other
combination — another tokenizer, or a streamed format (JSONL, Parquet, Arrow) — is tokenised
once into the token cache under `cache_dir` (`dysejax.data.token_cache`).
"""
from __future__ import annotations

import os
from typing import Callable, Iterator, Optional

from dysejax.config import DataConfig
from dysejax.data.blocks import BlockSource
from dysejax.data.corpus import Corpus, open_corpus
from dysejax.data.sources import Source, stdlib_source, text_source
from dysejax.data.split import split_value
from dysejax.data.synthetic import SyntheticSource
from dysejax.data.token_cache import TokenCache
from dysejax.data.tokenizer import ByteTokenizer, Tokenizer
from dysejax.data.tokenizers import bpe_file, cached_bpe, open_tokenizer, train_bpe
from dysejax.errors import DataError

Log = Optional[Callable[[str], None]]


def training_texts(corpus: Corpus, seed: int, eval_fraction: float, limit_bytes: int) -> Iterator[str]:
    """Texts of the corpus's training documents (not in the eval split), up to `limit_bytes`."""
    total = 0
    for key, text in corpus.documents():
        if split_value(seed, key) < eval_fraction:
            continue
        yield text
        total += len(text)
        if total >= limit_bytes:
            return


def build_tokenizer(cfg: DataConfig, vocab_size: Optional[int], seed: int, cache_dir: Optional[str],
                    log: Log = None) -> Tokenizer:
    """The tokenizer `cfg.tokenizer` names; `bpe` is trained here once and cached in `cache_dir`."""
    if cfg.tokenizer != "bpe":
        return open_tokenizer(cfg.tokenizer)
    if cfg.source == "synthetic":
        raise DataError("data.source=synthetic makes byte tokens: set data.tokenizer=bytes")
    if vocab_size is None or cache_dir is None:
        raise ValueError("data.tokenizer=bpe needs the model's vocab_size and a cache folder")
    corpus = open_corpus(cfg)
    path = bpe_file(cache_dir, corpus.fingerprint(), vocab_size, cfg.tokenizer_sample_bytes)
    tokenizer = cached_bpe(path)
    if tokenizer is None:
        import time

        t0 = time.perf_counter()
        tokenizer = train_bpe(training_texts(corpus, seed, cfg.eval_fraction, cfg.tokenizer_sample_bytes),
                              vocab_size, path)
        if log:
            log(f"tokenizer: byte-level BPE of {tokenizer.vocab_size} tokens trained on up to "
                f"{cfg.tokenizer_sample_bytes / 1e6:g} MB of {corpus.describe()} in {time.perf_counter() - t0:.1f} s "
                f"-> {path}")
    tokenizer.name = "bpe"
    return tokenizer


def open_source(cfg: DataConfig, seed: int, tokenizer: Tokenizer, cache_dir: Optional[str], log: Log = None) -> Source:
    """The token source of `cfg` under `tokenizer` (see the module docstring)."""
    is_bytes = isinstance(tokenizer, ByteTokenizer)
    if cfg.source == "synthetic":
        if not is_bytes:
            raise DataError("data.source=synthetic makes byte tokens: set data.tokenizer=bytes")
        return SyntheticSource(cfg.synthetic, seed, cfg.max_docs)
    if is_bytes and cfg.source in ("stdlib", "text"):
        files = stdlib_source(cfg.max_docs) if cfg.source == "stdlib" else text_source(cfg.path, cfg.glob, cfg.max_docs)
        return BlockSource(files) if cfg.documents == "blocks" else files
    if cache_dir is None:
        raise ValueError("a token cache folder is needed for this source and tokenizer")
    os.makedirs(cache_dir, exist_ok=True)
    return TokenCache.open_or_build(cache_dir, open_corpus(cfg), tokenizer, log)
