"""Document sources of byte tokens: the Python standard library or a folder of text files.

Every source offers the same small interface (`Source`): `name`, `describe()`, per-document
`keys` (stable names used for the train/eval split and in messages), `lengths` (tokens per
document, EOS included) and `read(i, start, end)` -> int32 tokens[start:end] of document i.
File-backed sources know byte-token lengths from file sizes and read bytes only when a batch is
built. Other tokenizers and the streamed formats (JSONL, Parquet, Arrow) go through the token
cache (`dysejax.data.corpus`, `dysejax.data.token_cache`); this module keeps the JSONL checks.
"""
from __future__ import annotations

import functools
import os
import sysconfig
from pathlib import Path
from typing import Optional, Protocol

import numpy as np

from dysejax.data.tokenizer import EOS_ID
from dysejax.errors import DataError

EXCLUDED_DIRS = ("site-packages", "dist-packages")


class Source(Protocol):
    """What the pipeline needs from a document source."""

    name: str
    keys: list[str]
    lengths: np.ndarray  # int64 tokens per document, EOS included

    def read(self, i: int, start: int, end: int) -> np.ndarray:
        """int32 tokens[start:end] of document i (its bytes, then EOS)."""

    def describe(self) -> str:
        """A few words for the summary line."""


def tokens_from_bytes(chunk: bytes, with_eos: bool) -> np.ndarray:
    """int32 tokens of a byte range, with EOS appended when the range reaches the end."""
    out = np.empty(len(chunk) + int(with_eos), dtype=np.int32)
    out[: len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
    if with_eos:
        out[-1] = EOS_ID
    return out


def check_range(length: int, start: int, end: int, key: str):
    """Raise IndexError unless [start, end) lies within a document of `length` tokens."""
    if not 0 <= start <= end <= length:
        raise IndexError(f"token range [{start}, {end}) outside document {key!r} of {length} tokens")


class FileSource:
    """Documents that are whole files, read lazily (tokens = raw bytes + EOS)."""

    def __init__(self, name: str, root: Path, rel_paths: list[str], sizes: list[int], about: str):
        self.name, self.root, self.about = name, root, about
        self.keys = list(rel_paths)
        self.lengths = np.asarray(sizes, dtype=np.int64) + 1

    def describe(self) -> str:
        """Source name and where its files live."""
        return f"{self.name} ({len(self.keys)} files under {self.about})"

    def read(self, i: int, start: int, end: int) -> np.ndarray:
        """int32 tokens[start:end] of file i, reading only that byte range."""
        size = int(self.lengths[i]) - 1
        check_range(size + 1, start, end, self.keys[i])
        hi = min(end, size)
        with open(self.root / self.keys[i], "rb") as f:
            f.seek(start)
            chunk = f.read(max(hi - start, 0))
        if len(chunk) != max(hi - start, 0):
            raise DataError(f"{self.root / self.keys[i]} changed size while training: "
                            "keep the data files fixed during a run")
        return tokens_from_bytes(chunk, end == size + 1)


def stdlib_root() -> Path:
    """The standard library folder of the running Python."""
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_files() -> tuple[Path, list[str], list[int]]:
    root = stdlib_root()
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS]
        for fn in filenames:
            if fn.endswith(".py"):
                full = Path(dirpath) / fn
                found.append((full.relative_to(root).as_posix(), full.stat().st_size))
    found.sort()
    return root, [r for r, _ in found], [s for _, s in found]


def stdlib_source(max_docs: Optional[int] = None) -> FileSource:
    """Every non-empty *.py file of the standard library (no site-packages), sorted by path."""
    root, rels, sizes = _stdlib_files()
    keep = [(r, s) for r, s in zip(rels, sizes) if s > 0][:max_docs]
    if not keep:
        raise DataError(f"no Python files found under the standard library {root}: "
                        "use data.source=text or jsonl with data.path")
    return FileSource("stdlib", root, [r for r, _ in keep], [s for _, s in keep], str(root))


@functools.lru_cache(maxsize=1)
def stdlib_corpus() -> np.ndarray:
    """All non-empty stdlib *.py files concatenated in sorted order, as one uint8 array."""
    root, rels, sizes = _stdlib_files()
    out = np.empty(sum(sizes), dtype=np.uint8)
    pos = 0
    for rel, size in zip(rels, sizes):
        data = (root / rel).read_bytes()[:size]
        out[pos : pos + len(data)] = np.frombuffer(data, dtype=np.uint8)
        pos += len(data)
    out = out[:pos]
    out.setflags(write=False)
    return out


def require_path(path: Optional[str], source: str) -> Path:
    """data.path as an existing Path, or a one-line DataError saying what to point it at."""
    if not path:
        raise DataError(f"data.path is required for data.source={source!r}: set it to a folder or file")
    p = Path(path).expanduser()
    if not p.exists():
        what = "a folder of text files" if source == "text" else f"a .{source} file or a folder of them"
        raise DataError(f"data.path {path!r} does not exist: set data.path to {what}")
    return p


def utf8_error(where: str, data: bytes, e: UnicodeDecodeError, fix: str, offset: int = 0) -> DataError:
    return DataError(f"{where}: not UTF-8 (byte 0x{data[e.start]:02x} at byte offset {offset + e.start}): "
                     f"convert it to UTF-8 or {fix}")


def text_files(path: Optional[str], pattern: str = "**/*", max_docs: Optional[int] = None) -> FileSource:
    """Non-empty files matching `pattern` under folder `path`, sorted (listed, not read)."""
    root = require_path(path, "text")
    if not root.is_dir():
        raise DataError(f"data.path {path!r} is a file; the text source reads a folder: "
                        "set data.path to its folder and data.glob to match it")
    if not any(root.iterdir()):
        raise DataError(f"data.path {path!r} is an empty folder: put text files in it or point data.path elsewhere")
    files = sorted((p.relative_to(root).as_posix() for p in root.glob(pattern) if p.is_file()))
    if not files:
        raise DataError(f"no files under {path!r} match data.glob {pattern!r}: fix data.glob (e.g. '**/*.txt') or data.path")
    sized = [(rel, (root / rel).stat().st_size) for rel in files]
    kept = [(rel, size) for rel, size in sized if size > 0][:max_docs]
    if not kept:
        raise DataError(f"all {len(files)} files under {path!r} matching {pattern!r} are empty: "
                        "add text to them or point data.path elsewhere")
    return FileSource("text", root, [r for r, _ in kept], [s for _, s in kept], str(root))


def decode_text(where: str, data: bytes, strict: bool = True) -> str:
    """UTF-8 text of a document's bytes; a one-line DataError if it is not UTF-8 (strict)."""
    try:
        return data.decode("utf-8", errors="strict" if strict else "replace")
    except UnicodeDecodeError as e:
        raise utf8_error(where, data, e, "exclude it with data.glob") from None


def text_source(path: Optional[str], pattern: str = "**/*", max_docs: Optional[int] = None) -> FileSource:
    """Files matching `pattern` under folder `path`, sorted; each must be UTF-8 text."""
    files = text_files(path, pattern, max_docs)
    for rel in files.keys:
        decode_text(str(files.root / rel), (files.root / rel).read_bytes())
    return files
