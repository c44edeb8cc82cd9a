"""Buckets, per-bucket batch sizes and the policy for documents longer than every bucket.

A row of bucket L holds L + 1 token slots (inputs = slots[:L], targets = slots[1:]), so a
document or chunk of n tokens goes to the smallest bucket with n <= L + 1. The batch size of
bucket L keeps tokens per step near `tokens_per_batch`: a multiple of the device count x
grad_accum (`multiple`) where that many rows fit the budget; for longer buckets the largest
divisor of `multiple` that fits and is a multiple of `unit` (grad_accum; a pipeline needs the
whole `multiple`), so a 16K-token budget at a 16K bucket is one row that the sequence-sharded
strategies split, not one row per device.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from dysejax.errors import DataError

LONG_POLICIES = ("split", "truncate", "skip", "error")


def bucket_index(n, buckets: Sequence[int]):
    """Index of the smallest bucket whose rows hold n tokens (n <= L + 1); works on arrays too."""
    caps = np.asarray(buckets, dtype=np.int64) + 1
    idx = np.searchsorted(caps, n, side="left")
    if np.any(idx >= len(caps)):
        raise ValueError(f"{np.max(n)} tokens do not fit the largest bucket {buckets[-1]}")
    return idx


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket length L with n <= L + 1."""
    return int(buckets[int(bucket_index(n, buckets))])


def batch_size(length: int, tokens_per_batch: int, multiple: int = 1, unit: int | None = None) -> int:
    """Rows per batch of bucket `length`: (tokens_per_batch // L) // m * m when that is >= m
    (m = `multiple`), else the largest divisor of m that is a multiple of `unit` (default m) and
    at most tokens_per_batch // L, at least `unit`."""
    rows = tokens_per_batch // length
    if rows >= multiple:
        return rows // multiple * multiple
    unit = multiple if unit is None else unit
    if unit < 1 or multiple % unit:
        raise ValueError(f"batch unit {unit} does not divide the batch multiple {multiple}")
    return max(k for k in range(unit, multiple + 1, unit) if multiple % k == 0 and (k <= rows or k == unit))


def check_long(keys: Sequence[str], lengths: np.ndarray, max_bucket: int, policy: str) -> dict:
    """Counts of what `policy` does to documents over max_bucket + 1 tokens; raises for 'error'."""
    if policy not in LONG_POLICIES:
        raise DataError(f"unknown data.long_policy {policy!r}: use one of {', '.join(LONG_POLICIES)}")
    cap = max_bucket + 1
    long = np.flatnonzero(lengths > cap)
    n_long = lengths[long]
    if policy == "error" and len(long):
        first = int(long[0])
        more = f" (and {len(long) - 1} more)" if len(long) > 1 else ""
        raise DataError(f"document {keys[first]!r} has {int(lengths[first])} tokens, more than the {cap} "
                        f"a row of the largest bucket {max_bucket} holds{more}: set data.long_policy to "
                        f"split, truncate or skip, or add a bucket >= {int(lengths[first]) - 1} to data.buckets")
    chunks = int(np.sum(-(-n_long // cap))) if policy == "split" else 0
    dropped = {"truncate": int(np.sum(n_long - cap)), "skip": int(np.sum(n_long))}.get(policy, 0)
    return {"long_policy": policy, "long_documents": int(len(long)), "chunks_created": chunks,
            "tokens_dropped": dropped, "documents_skipped": int(len(long)) if policy == "skip" else 0}


def expand(docs: np.ndarray, lengths: np.ndarray, max_bucket: int, policy: str):
    """(doc, start, end) arrays of the pieces the long-document policy makes of `docs`, in order."""
    cap = max_bucket + 1
    docs = np.asarray(docs, dtype=np.int64)
    n = lengths[docs]
    if policy == "split":
        k = -(-n // cap)
        doc = np.repeat(docs, k)
        first = np.repeat(np.cumsum(k) - k, k)
        start = (np.arange(len(doc), dtype=np.int64) - first) * cap
        end = np.minimum(start + cap, np.repeat(n, k))
        return doc, start, end
    if policy == "skip":
        keep = n <= cap
        return docs[keep], np.zeros(int(keep.sum()), dtype=np.int64), n[keep]
    return docs, np.zeros(len(docs), dtype=np.int64), np.minimum(n, cap)  # truncate (or nothing long)
