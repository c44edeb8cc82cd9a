"""Turning a BatchPlan into arrays.

A row of bucket L has L + 1 token slots filled by its segments in order (then PAD). Of shape
[B, L]: `inputs` = slots[:L], `targets` = slots[1:], `segment_ids` (1, 2, ... per segment of the
row, 0 = pad), `positions` (restart at 0 at each segment), `loss_mask` (1.0 where the target is
the next token of the same segment; the last token of a segment and padding predict nothing).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from dysejax.data.packing import BatchPlan
from dysejax.data.tokenizer import PAD_ID

ARRAYS = ("inputs", "targets", "segment_ids", "positions", "loss_mask")


@dataclass
class Batch:
    """The five [B, L] arrays of one batch, its bucket L and its real (non-pad) input tokens."""

    inputs: np.ndarray  # int32
    targets: np.ndarray  # int32
    segment_ids: np.ndarray  # int32, 0 = pad
    positions: np.ndarray  # int32
    loss_mask: np.ndarray  # float32
    bucket: int
    real_tokens: int

    def as_dict(self) -> dict:
        """The five arrays by name."""
        return {name: getattr(self, name) for name in ARRAYS}


def materialize(plan: BatchPlan, read, rows: Optional[slice] = None, pad_id: int = PAD_ID) -> Batch:
    """Arrays of `plan` (or of its rows `rows` only); `read(doc, start, end)` gives tokens."""
    chosen = plan.rows if rows is None else plan.rows[rows]
    L = plan.bucket
    slots = np.full((len(chosen), L + 1), pad_id, dtype=np.int32)
    seg = np.zeros((len(chosen), L + 1), dtype=np.int32)
    pos = np.zeros((len(chosen), L + 1), dtype=np.int32)
    for r, row in enumerate(chosen):
        at = 0
        for k, (doc, start, end) in enumerate(row, start=1):
            n = end - start
            slots[r, at : at + n] = read(doc, start, end)
            seg[r, at : at + n] = k
            pos[r, at : at + n] = np.arange(n, dtype=np.int32)
            at += n
    seg_in = seg[:, :L]
    mask = (seg_in != 0) & (seg_in == seg[:, 1:])
    c = np.ascontiguousarray
    return Batch(inputs=c(slots[:, :L]), targets=c(slots[:, 1:]), segment_ids=c(seg_in),
                 positions=c(pos[:, :L]), loss_mask=mask.astype(np.float32),
                 bucket=L, real_tokens=int(np.count_nonzero(seg_in)))
