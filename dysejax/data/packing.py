"""Packing pieces of documents into rows and rows into per-bucket batches, as metadata.

A `BatchPlan` says which token ranges (doc, start, end) fill each row of one batch; it is cheap
to build for a whole epoch and enough for benchmarks that never need the tokens.

With packing, a piece goes first-fit into an open row of its own bucket, else (only with
`across=True`) into an open row of a larger bucket, filling what would be padding at the cost of
fewer short-bucket batches, else it opens a new row of its own bucket;
a bucket keeps at most `OPEN_ROWS` open rows and, when it needs another, closes its fullest one.
A row also closes when fewer than 2 slots are left. Without packing every piece is its own row.
A batch of bucket L is emitted as soon as L has batch_size(L) closed rows; at the end of the
epoch the rest is flushed, smallest bucket first, and partial batches are filled up with empty
rows. The epoch's order is then set by `order.interleave`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dysejax.data.bucketing import bucket_index

OPEN_ROWS = 8
MIN_ROOM = 2  # a row with less room than this cannot take a useful piece (>= 2 tokens)

Segment = tuple  # (doc, start, end): tokens [start, end) of document `doc`


@dataclass(frozen=True)
class BatchPlan:
    """One batch as metadata: bucket L, rows of segments, and its token counts."""

    bucket: int
    batch_size: int
    rows: tuple  # batch_size tuples of (doc, start, end) segments; () is an empty row
    real_tokens: int  # non-pad input tokens
    loss_tokens: int  # positions whose target is the next token of the same document

    @property
    def fill(self) -> float:
        """Share of input slots that hold real tokens."""
        return self.real_tokens / (self.batch_size * self.bucket)

    def to_dict(self) -> dict:
        """JSON-able form (segments as lists)."""
        return {"bucket": self.bucket, "batch_size": self.batch_size, "real_tokens": self.real_tokens,
                "loss_tokens": self.loss_tokens, "rows": [[list(s) for s in row] for row in self.rows]}


def make_plan(bucket: int, batch_size: int, rows: Sequence[Sequence[Segment]]) -> BatchPlan:
    """A BatchPlan from its rows (padded with empty rows to batch_size)."""
    rows = tuple(tuple(tuple(int(v) for v in s) for s in row) for row in rows)
    if len(rows) > batch_size:
        raise ValueError(f"{len(rows)} rows do not fit a batch of {batch_size}")
    real = loss = 0
    for row in rows:
        used = sum(e - s for _, s, e in row)
        if used > bucket + 1:
            raise ValueError(f"row of {used} tokens overflows bucket {bucket} ({bucket + 1} slots)")
        real += min(used, bucket)
        loss += used - len(row)
    rows = rows + ((),) * (batch_size - len(rows))
    return BatchPlan(bucket, batch_size, rows, real, loss)


class _Packer:
    def __init__(self, buckets: Sequence[int], batch_sizes: Sequence[int], across: bool):
        self.buckets, self.batch_sizes, self.across = list(buckets), list(batch_sizes), across
        nb = len(self.buckets)
        self.open = [[] for _ in range(nb)]  # per bucket: [room, segments] rows, oldest first
        self.room = [0] * nb  # largest room among the open rows of each bucket
        self.done = [[] for _ in range(nb)]
        self.plans: list[BatchPlan] = []

    def _refresh(self, b: int):
        self.room[b] = max((r[0] for r in self.open[b]), default=0)

    def close(self, b: int, row):
        self.done[b].append(row[1])
        if len(self.done[b]) == self.batch_sizes[b]:
            self.emit(b)

    def emit(self, b: int):
        self.plans.append(make_plan(self.buckets[b], self.batch_sizes[b], self.done[b]))
        self.done[b] = []

    def add_row(self, b: int, seg: Segment, n: int):
        row = [self.buckets[b] + 1 - n, [seg]]
        if row[0] < MIN_ROOM:
            self.close(b, row)
        else:
            self.open[b].append(row)
            self.room[b] = max(self.room[b], row[0])

    def place(self, b: int, seg: Segment, n: int):
        for c in range(b, len(self.buckets) if self.across else b + 1):
            if self.room[c] < n:
                continue
            for i, row in enumerate(self.open[c]):
                if row[0] >= n:
                    row[0] -= n
                    row[1].append(seg)
                    if row[0] < MIN_ROOM:
                        self.close(c, self.open[c].pop(i))
                    self._refresh(c)
                    return
        if len(self.open[b]) >= OPEN_ROWS:
            fullest = min(range(len(self.open[b])), key=lambda i: self.open[b][i][0])
            self.close(b, self.open[b].pop(fullest))
            self._refresh(b)
        self.add_row(b, seg, n)

    def finish(self) -> list[BatchPlan]:
        for b in range(len(self.buckets)):
            for row in self.open[b]:
                self.close(b, row)
            self.open[b] = []
            if self.done[b]:
                self.emit(b)
        return self.plans


def pack(doc: np.ndarray, start: np.ndarray, end: np.ndarray, buckets: Sequence[int],
         batch_sizes: Sequence[int], packed: bool = True, across: bool = False) -> list[BatchPlan]:
    """The batches of one pass over the pieces (doc, start, end), in the order they complete."""
    packer = _Packer(buckets, batch_sizes, across)
    n = (np.asarray(end) - np.asarray(start)).astype(np.int64)
    bidx = bucket_index(n, buckets) if len(n) else np.zeros(0, dtype=np.int64)
    for d, s, e, k, b in zip(np.asarray(doc).tolist(), np.asarray(start).tolist(), np.asarray(end).tolist(),
                             n.tolist(), bidx.tolist()):
        if packed:
            packer.place(b, (d, s, e), k)
        else:
            packer.close(b, [0, [(d, s, e)]])
    return packer.finish()
