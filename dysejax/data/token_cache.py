"""The token cache: a corpus tokenised once into memory-mapped files in the workdir.

`TokenCache.open_or_build(directory, corpus, tokenizer)` reuses the cache whose key (the
corpus fingerprint and the tokenizer's) matches, or streams the corpus through the tokenizer
into a new one and removes stale ones. A cache is a folder:
  tokens.bin   every document's tokens ([BOS] + ids + EOS), concatenated (uint16 or uint32)
  offsets.npy  int64 [n + 1]: document i is tokens[offsets[i]:offsets[i + 1]]
  keys.json    the documents' keys (for the train/eval split and messages)
  meta.json    the key, the token dtype, counts
It is written into a temporary folder and renamed when complete, so a killed build leaves no
cache behind. Reading maps `tokens.bin`: host memory holds the pages batches touch, not the
corpus. A `TokenCache` is a `Source` for the data pipeline.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from typing import Callable, Optional

import numpy as np

from dysejax.data.corpus import Corpus
from dysejax.data.tokenizer import Tokenizer
from dysejax.errors import DataError

FORMAT = 1
_BATCH_DOCS = 256  # documents tokenised per call (the tokenizers library runs a batch in parallel)


def cache_key(corpus: Corpus, tokenizer: Tokenizer) -> str:
    """The folder name of the cache of this corpus under this tokenizer."""
    return f"tokens-v{FORMAT}-{corpus.fingerprint()}-{tokenizer.fingerprint()}"


class TokenCache:
    """A built cache, opened read-only (see the module docstring)."""

    def __init__(self, path: str, about: str = ""):
        self.path = path
        with open(os.path.join(path, "meta.json")) as f:
            self.meta = json.load(f)
        with open(os.path.join(path, "keys.json")) as f:
            self.keys = json.load(f)
        self.offsets = np.load(os.path.join(path, "offsets.npy"))
        self.lengths = np.diff(self.offsets)
        n = int(self.offsets[-1])
        dtype = np.dtype(self.meta["dtype"])
        self.tokens = np.memmap(os.path.join(path, "tokens.bin"), dtype=dtype, mode="r", shape=(n,)) if n else \
            np.zeros(0, dtype)
        self.name = self.meta["source"]
        self.about = about or self.meta.get("about", "")

    def describe(self) -> str:
        """Source, tokenizer and where the cache lives."""
        return f"{self.about}, tokenised by {self.meta['tokenizer']} (cache {self.path})"

    def read(self, i: int, start: int, end: int) -> np.ndarray:
        """int32 tokens[start:end] of document i."""
        length = int(self.lengths[i])
        if not 0 <= start <= end <= length:
            raise IndexError(f"token range [{start}, {end}) outside document {self.keys[i]!r} of {length} tokens")
        at = int(self.offsets[i])
        return np.asarray(self.tokens[at + start:at + end], dtype=np.int32)

    @classmethod
    def open_or_build(cls, directory: str, corpus: Corpus, tokenizer: Tokenizer,
                      log: Optional[Callable[[str], None]] = None) -> "TokenCache":
        """The cache of `corpus` under `tokenizer` in `directory`, built if missing."""
        key = cache_key(corpus, tokenizer)
        path = os.path.join(directory, key)
        if not os.path.isfile(os.path.join(path, "meta.json")):
            t0 = time.perf_counter()
            build(path, corpus, tokenizer)
            if log:
                log(f"token cache: {corpus.describe()} tokenised by {tokenizer.describe()} in "
                    f"{time.perf_counter() - t0:.1f} s -> {path}")
            for stale in os.listdir(directory):  # caches of an older corpus or tokenizer
                if stale.startswith("tokens-") and stale != key and ".tmp" not in stale:
                    shutil.rmtree(os.path.join(directory, stale), ignore_errors=True)
        return cls(path, corpus.describe())


def build(path: str, corpus: Corpus, tokenizer: Tokenizer) -> None:
    """Stream `corpus` through `tokenizer` into a cache folder at `path` (atomically)."""
    dtype = np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32
    tmp = f"{path}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    keys: list[str] = []
    offsets = [0]
    try:
        with open(os.path.join(tmp, "tokens.bin"), "wb") as out:
            batch_keys, batch_texts = [], []

            def flush():
                for ids in tokenizer.documents(batch_texts):
                    out.write(ids.astype(dtype).tobytes())
                    offsets.append(offsets[-1] + len(ids))
                keys.extend(batch_keys)
                batch_keys.clear()
                batch_texts.clear()

            for k, text in corpus.documents():
                batch_keys.append(k)
                batch_texts.append(text)
                if len(batch_texts) == _BATCH_DOCS:
                    flush()
            flush()
        if not keys:
            raise DataError(f"{corpus.describe()} has no documents: add some or point data.path elsewhere")
        np.save(os.path.join(tmp, "offsets.npy"), np.asarray(offsets, dtype=np.int64))
        with open(os.path.join(tmp, "keys.json"), "w") as f:
            json.dump(keys, f)
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump({"format": FORMAT, "source": corpus.name, "about": corpus.describe(),
                       "tokenizer": tokenizer.describe(), "dtype": np.dtype(dtype).name,
                       "documents": len(keys), "tokens": offsets[-1]}, f)
        if os.path.isdir(path):  # another process finished the same cache first
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
