"""The deterministic train/eval split.

A document goes to eval iff blake2b(seed, key), read as a number in [0, 1), is below the eval
fraction; the split of a document never depends on which other documents exist. If the fraction
is positive but no document falls below it, the document with the smallest hash goes to eval.
"""
from __future__ import annotations

import hashlib
from typing import Optional, Sequence

import numpy as np


def split_value(seed: int, key: str) -> float:
    """A stable number in [0, 1) for (seed, key)."""
    digest = hashlib.blake2b(f"{seed}\x00{key}".encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def eval_mask(keys: Sequence[str], seed: int, fraction: float,
              eligible: Optional[np.ndarray] = None) -> np.ndarray:
    """Boolean mask of the documents that belong to eval (at least one if fraction > 0)."""
    if fraction <= 0 or not len(keys):
        return np.zeros(len(keys), dtype=bool)
    values = np.fromiter((split_value(seed, k) for k in keys), dtype=np.float64, count=len(keys))
    mask = values < fraction
    ok = np.ones(len(keys), dtype=bool) if eligible is None else np.asarray(eligible, dtype=bool)
    if not (mask & ok).any() and ok.any():
        mask[np.flatnonzero(ok)[np.argmin(values[ok])]] = True
    return mask
