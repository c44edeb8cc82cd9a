"""Document sources: the Python standard library, a folder of text files, or JSONL.

Every source offers the same small interface (`Source`): `name`, `describe()`, per-document
`keys` (stable names used for the train/eval split and in messages), `lengths` (tokens per
document, EOS included) and `read(i, start, end)` -> int32 tokens[start:end] of document i.
File-backed sources know lengths from file sizes and read bytes only when a batch is built;
JSONL documents are held in memory (they must be parsed to be validated anyway).
"""
from __future__ import annotations

import functools
import json
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


def _check_range(length: int, start: int, end: int, key: str):
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
        _check_range(size + 1, start, end, self.keys[i])
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


def _require_path(path: Optional[str], source: str) -> Path:
    if not path:
        raise DataError(f"data.path is required for data.source={source!r}: set it to a folder or file")
    p = Path(path).expanduser()
    if not p.exists():
        what = "a folder of text files" if source == "text" else "a .jsonl file or a folder of them"
        raise DataError(f"data.path {path!r} does not exist: set data.path to {what}")
    return p


def _utf8_error(where: str, data: bytes, e: UnicodeDecodeError, fix: str, offset: int = 0) -> DataError:
    return DataError(f"{where}: not UTF-8 (byte 0x{data[e.start]:02x} at byte offset {offset + e.start}): "
                     f"convert it to UTF-8 or {fix}")


def text_source(path: Optional[str], pattern: str = "**/*", max_docs: Optional[int] = None) -> FileSource:
    """Files matching `pattern` under folder `path`, sorted; each must be UTF-8 text."""
    root = _require_path(path, "text")
    if not root.is_dir():
        raise DataError(f"data.path {path!r} is a file; the text source reads a folder: "
                        "set data.path to its folder and data.glob to match it")
    if not any(root.iterdir()):
        raise DataError(f"data.path {path!r} is an empty folder: put text files in it or point data.path elsewhere")
    files = sorted((p.relative_to(root).as_posix() for p in root.glob(pattern) if p.is_file()))
    if not files:
        raise DataError(f"no files under {path!r} match data.glob {pattern!r}: fix data.glob (e.g. '**/*.txt') or data.path")
    rels, sizes = [], []
    for rel in files:
        if max_docs is not None and len(rels) >= max_docs:
            break
        data = (root / rel).read_bytes()
        if not data:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _utf8_error(str(root / rel), data, e, "exclude it with data.glob") from None
        rels.append(rel)
        sizes.append(len(data))
    if not rels:
        raise DataError(f"all {len(files)} files under {path!r} matching {pattern!r} are empty: "
                        "add text to them or point data.path elsewhere")
    return FileSource("text", root, rels, sizes, str(root))


class JsonlSource:
    """Documents from the string field `text_field` of each line of JSONL files, held in memory."""

    def __init__(self, name: str, keys: list[str], docs: list[bytes], about: str):
        self.name, self.keys, self.docs, self.about = name, keys, docs, about
        self.lengths = np.fromiter((len(d) + 1 for d in docs), dtype=np.int64, count=len(docs))

    def describe(self) -> str:
        """Source name and where its files live."""
        return f"{self.name} ({self.about})"

    def read(self, i: int, start: int, end: int) -> np.ndarray:
        """int32 tokens[start:end] of document i."""
        size = len(self.docs[i])
        _check_range(size + 1, start, end, self.keys[i])
        return tokens_from_bytes(self.docs[i][start:min(end, size)], end == size + 1)


def _jsonl_files(root: Path, path: str) -> tuple[Path, list[str]]:
    if root.is_file():
        return root.parent, [root.name]
    if not any(root.iterdir()):
        raise DataError(f"data.path {path!r} is an empty folder: put .jsonl files in it or point data.path elsewhere")
    files = sorted(p.relative_to(root).as_posix() for p in root.glob("**/*.jsonl") if p.is_file())
    if not files:
        raise DataError(f"no *.jsonl files under {path!r}: point data.path at a .jsonl file or a folder of them")
    return root, files


def _jsonl_text(where: str, line: bytes, field: str) -> str:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: invalid JSON ({e.msg} at column {e.colno}): "
                        f"each line must be one JSON object with a string field {field!r}") from None
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object with a string field {field!r}, "
                        f"got {type(obj).__name__}: write one object per line")
    if field not in obj:
        keys = ", ".join(sorted(map(str, obj))[:8]) or "none"
        raise DataError(f"{where}: no field {field!r} in this object (its keys: {keys}): "
                        "set data.text_field to the field holding the text")
    value = obj[field]
    if not isinstance(value, str):
        raise DataError(f"{where}: field {field!r} is {type(value).__name__}, not a string: "
                        "set data.text_field to a field holding the text")
    return value


def jsonl_source(path: Optional[str], text_field: str = "text", max_docs: Optional[int] = None) -> JsonlSource:
    """String field `text_field` of every line of a .jsonl file or folder of them (sorted)."""
    given = _require_path(path, "jsonl")
    root, files = _jsonl_files(given, path)
    keys, docs, lines_seen = [], [], 0
    for rel in files:
        if max_docs is not None and len(docs) >= max_docs:
            break
        data = (root / rel).read_bytes()
        offset = 0
        for lineno, line in enumerate(data.split(b"\n"), start=1):
            if max_docs is not None and len(docs) >= max_docs:
                break
            where = f"{root / rel}:{lineno}"
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise _utf8_error(where, line, e, "remove that line", offset) from None
            offset += len(line) + 1
            if not line.strip():
                continue
            lines_seen += 1
            text = _jsonl_text(where, line, text_field).encode("utf-8")
            if text:
                keys.append(f"{rel}:{lineno}")
                docs.append(text)
    if not docs:
        what = f"{lines_seen} lines" if lines_seen else "no lines"
        raise DataError(f"{path!r} has {what} with a non-empty field {text_field!r}: "
                        "check data.path and data.text_field")
    about = f"{len(files)} file{'s' if len(files) != 1 else ''} under {root}"
    return JsonlSource("jsonl", keys, docs, about)
