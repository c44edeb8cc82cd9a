"""Tokenizers: the interface the data pipeline uses, and byte-level tokens.

A `Tokenizer` turns document texts into int32 ids; `document(text)` adds the tokenizer's BOS
(where it defines one to prepend) and one EOS. Byte tokens: ids 0..255 are bytes, then PAD,
BOS and EOS; a document is its bytes followed by EOS (no BOS). The other kinds (a Hugging Face
`tokenizers` JSON, a sentencepiece model, a model directory's tokenizer, a BPE trained on the
corpus) live in `dysejax.data.tokenizers`.
"""
from __future__ import annotations

import hashlib
from typing import Optional, Sequence

import numpy as np

from dysejax.config import BYTE_VOCAB

PAD_ID = 256
BOS_ID = 257
EOS_ID = 258
assert EOS_ID + 1 == BYTE_VOCAB


class Tokenizer:
    """Text <-> ids. Subclasses set the ids and implement `encode_batch`, `decode`, `identity`."""

    name: str = "tokenizer"
    vocab_size: int
    pad_id: int  # fills unused slots (masked out of attention and loss)
    bos_id: Optional[int] = None  # prepended to every document when set
    eos_id: int

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """int32 ids of each text, without special tokens."""
        raise NotImplementedError

    def decode(self, ids) -> str:
        """Text of ids; special ids are dropped."""
        raise NotImplementedError

    def identity(self) -> bytes:
        """Bytes that determine every id this tokenizer produces (hashed for cache keys)."""
        raise NotImplementedError

    def fingerprint(self) -> str:
        """A short hash of `identity()`: equal fingerprints tokenize alike."""
        return hashlib.sha256(self.identity()).hexdigest()[:16]

    def documents(self, texts: Sequence[str]) -> list[np.ndarray]:
        """int32 tokens of each document: [BOS] + ids + EOS."""
        head = np.asarray([] if self.bos_id is None else [self.bos_id], np.int32)
        tail = np.asarray([self.eos_id], np.int32)
        return [np.concatenate([head, ids.astype(np.int32), tail]) for ids in self.encode_batch(texts)]

    def describe(self) -> str:
        """Name and vocabulary size, for the log."""
        return f"{self.name} ({self.vocab_size} tokens)"


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0..255; PAD 256, BOS 257 (not prepended), EOS 258."""

    name = "bytes"
    vocab_size = BYTE_VOCAB
    pad_id, eos_id = PAD_ID, EOS_ID

    def encode_batch(self, texts):
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int32) for t in texts]

    def decode(self, ids) -> str:
        return decode(ids)

    def identity(self) -> bytes:
        return b"bytes-v1"


def document_tokens(data: bytes) -> np.ndarray:
    """The int32 byte tokens of one document: its bytes, then EOS."""
    out = np.empty(len(data) + 1, dtype=np.int32)
    out[:-1] = np.frombuffer(data, dtype=np.uint8)
    out[-1] = EOS_ID
    return out


def encode(text: str | bytes, eos: bool = True) -> np.ndarray:
    """Byte token ids of `text` (UTF-8 bytes), with a trailing EOS unless `eos=False`."""
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    ids = document_tokens(data)
    return ids if eos else ids[:-1]


def decode(ids) -> str:
    """Text of byte token ids; special ids are dropped and invalid UTF-8 is replaced."""
    arr = np.asarray(ids).reshape(-1)
    return bytes(arr[arr < 256].astype(np.uint8).tolist()).decode("utf-8", errors="replace")
