"""Byte-level tokens: ids 0..255 are bytes, then PAD, BOS and EOS.

A document's tokens are its bytes followed by one EOS (no BOS). `encode` and `decode` convert
between text and ids; `decode` drops the special ids.
"""
from __future__ import annotations

import numpy as np

from dysejax.config import BYTE_VOCAB

PAD_ID = 256
BOS_ID = 257
EOS_ID = 258
assert EOS_ID + 1 == BYTE_VOCAB


def document_tokens(data: bytes) -> np.ndarray:
    """The int32 tokens of one document: its bytes, then EOS."""
    out = np.empty(len(data) + 1, dtype=np.int32)
    out[:-1] = np.frombuffer(data, dtype=np.uint8)
    out[-1] = EOS_ID
    return out


def encode(text: str | bytes, eos: bool = True) -> np.ndarray:
    """Token ids of `text` (UTF-8 bytes), with a trailing EOS unless `eos=False`."""
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    ids = document_tokens(data)
    return ids if eos else ids[:-1]


def decode(ids) -> str:
    """Text of token ids; special ids are dropped and invalid UTF-8 is replaced."""
    arr = np.asarray(ids).reshape(-1)
    return bytes(arr[arr < 256].astype(np.uint8).tolist()).decode("utf-8", errors="replace")
