"""Split file documents into top-level blocks: code's natural variable-length documents.

A block starts at a line that begins in column 0 (not whitespace, not a closing bracket) after
a blank line: a `def`/`class` with its body, a decorator run, or a group of top-level
statements. On the standard library this turns ~1,800 files of mostly > 1 KB into ~60,000
documents from a few bytes to tens of KB — a long-tailed mix at lengths a CPU can train on.
"""
from __future__ import annotations

import re

import numpy as np

from dysejax.data.sources import FileSource, check_range, tokens_from_bytes

_BOUNDARY = re.compile(rb"\n[ \t]*\n(?=[^\s)\]}])")


def block_offsets(data: bytes) -> list[tuple[int, int]]:
    """[start, end) byte ranges of the top-level blocks of one file (covering it exactly)."""
    cuts = [0] + [m.end() for m in _BOUNDARY.finditer(data)] + [len(data)]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


class BlockSource:
    """Documents = top-level blocks of the files of a FileSource (tokens = bytes + EOS)."""

    def __init__(self, files: FileSource):
        self.files = files
        self.name = files.name
        keys, spans = [], []
        for i, key in enumerate(files.keys):
            data = (files.root / key).read_bytes()
            for a, b in block_offsets(data):
                keys.append(f"{key}@{a}")
                spans.append((i, a, b))
        self.keys = keys
        self.spans = np.asarray(spans, dtype=np.int64).reshape(-1, 3)
        self.lengths = self.spans[:, 2] - self.spans[:, 1] + 1

    def describe(self) -> str:
        """Source name, files and blocks."""
        return f"{self.files.describe()} as {len(self.keys)} top-level blocks"

    def read(self, i: int, start: int, end: int) -> np.ndarray:
        """int32 tokens[start:end] of block i."""
        f, a, b = (int(v) for v in self.spans[i])
        check_range(b - a + 1, start, end, self.keys[i])
        with open(self.files.root / self.files.keys[f], "rb") as fh:
            fh.seek(a + start)
            chunk = fh.read(max(min(end, b - a) - start, 0))
        return tokens_from_bytes(chunk, end == b - a + 1)
