"""The order of an epoch's batches: buckets interleaved so every prefix holds the epoch's mix.

Packing emits batches in the order they complete, which groups long-document pieces into runs
of longest-bucket batches. Training and measurement both want every stretch of an epoch to hold
the epoch's bucket mix. Each bucket keeps its own (already shuffled) order; the next batch comes
from the bucket furthest behind its share (m * n_bucket / n_total after m batches), ties broken
by a seeded priority. Every prefix then holds, per bucket, within 1 batch of its share.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def interleave(plans: Sequence, rng: np.random.Generator) -> list:
    """`plans` reordered so that buckets interleave evenly (each bucket's own order kept)."""
    groups: dict[int, list] = {}
    for p in plans:
        groups.setdefault(p.bucket, []).append(p)
    buckets = sorted(groups)
    total = np.array([len(groups[b]) for b in buckets])
    share = total / max(1, total.sum())
    taken = np.zeros(len(buckets), dtype=np.int64)
    priority = rng.random(len(buckets))
    out = []
    for m in range(1, int(total.sum()) + 1):
        behind = np.where(taken < total, np.round(m * share - taken, 9), -np.inf)
        i = max(range(len(buckets)), key=lambda j: (behind[j], priority[j]))
        out.append(groups[buckets[i]][taken[i]])
        taken[i] += 1
    return out
