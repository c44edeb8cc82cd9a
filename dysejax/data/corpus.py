"""Documents as text, streamed in a fixed order: what the tokenizer and the token cache read.

A `Corpus` yields (key, text) pairs from `documents()` without holding the corpus in memory,
and has a `fingerprint()` that changes when its files change (paths, sizes, modification
times) or when the options that cut it into documents do. Kinds:
  * `FileCorpus`: whole files (stdlib, a text folder) or their top-level blocks;
  * `JsonlCorpus`: the string field `data.text_field` of every line of *.jsonl files, read
    line by line;
  * `ArrowCorpus`: Parquet or Arrow files, read by pyarrow one record batch at a time.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterator, Optional

from dysejax.config import DataConfig
from dysejax.data.blocks import block_offsets
from dysejax.data.sources import FileSource, decode_text, require_path, stdlib_source, text_files, utf8_error
from dysejax.errors import DataError

EXTENSIONS = {"jsonl": "jsonl", "parquet": "parquet", "arrow": "arrow"}


def _hash(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def _stat(root: Path, rels) -> list:
    return [(rel, st.st_size, st.st_mtime_ns) for rel in rels for st in [(root / rel).stat()]]


class Corpus:
    """Base: `name`, `describe()`, `fingerprint()`, `documents()`."""

    name: str

    def describe(self) -> str:
        raise NotImplementedError

    def fingerprint(self) -> str:
        raise NotImplementedError

    def documents(self) -> Iterator[tuple[str, str]]:
        """(key, text) of every document, in a fixed order."""
        raise NotImplementedError


class FileCorpus(Corpus):
    """Files of a FileSource as documents, or their top-level blocks (`blocks=True`)."""

    def __init__(self, files: FileSource, blocks: bool, strict_utf8: bool):
        self.files, self.blocks, self.strict = files, blocks, strict_utf8
        self.name = files.name

    def describe(self) -> str:
        return self.files.describe() + (" as top-level blocks" if self.blocks else "")

    def fingerprint(self) -> str:
        return _hash(self.name, str(self.files.root), self.blocks, self.strict, _stat(self.files.root, self.files.keys))

    def documents(self):
        for key in self.files.keys:
            where = self.files.root / key
            data = where.read_bytes()
            spans = block_offsets(data) if self.blocks else [(0, len(data))]
            for a, b in spans:
                yield (f"{key}@{a}" if self.blocks else key), decode_text(str(where), data[a:b], self.strict)


def data_files(path: Optional[str], kind: str) -> tuple[Path, list[str]]:
    """(root, sorted relative paths) of the *.{kind} files data.path names (a file or a folder)."""
    given = require_path(path, kind)
    if given.is_file():
        return given.parent, [given.name]
    if not any(given.iterdir()):
        raise DataError(f"data.path {path!r} is an empty folder: put .{kind} files in it or point data.path elsewhere")
    files = sorted(p.relative_to(given).as_posix() for p in given.glob(f"**/*.{EXTENSIONS[kind]}") if p.is_file())
    if not files:
        raise DataError(f"no *.{kind} files under {path!r}: point data.path at a .{kind} file or a folder of them")
    return given, files


def record_text(where: str, obj, field: str) -> str:
    """The string field `field` of one record, or a one-line DataError naming the fix."""
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


class _Records(Corpus):
    """Shared by the record formats: files under a root, a text field, a document cap."""

    unit = "rows"

    def __init__(self, kind: str, path: Optional[str], field: str, max_docs: Optional[int]):
        self.name, self.field, self.max_docs, self.path = kind, field, max_docs, path
        self.root, self.files = data_files(path, kind)
        self.seen = 0  # records read (the empty ones too), for the message when none has text

    def describe(self) -> str:
        n = len(self.files)
        return f"{self.name} ({n} file{'s' if n != 1 else ''} under {self.root})"

    def fingerprint(self) -> str:
        return _hash(self.name, str(self.root), self.field, self.max_docs, _stat(self.root, self.files))

    def records(self, rel: str) -> Iterator[tuple[str, str]]:
        """(key, text) of the non-empty records of one file."""
        raise NotImplementedError

    def documents(self):
        n = 0
        for rel in self.files:
            for key, text in self.records(rel):
                if self.max_docs is not None and n >= self.max_docs:
                    return
                n += 1
                yield key, text
        if n == 0:
            what = f"{self.seen} {self.unit}" if self.seen else f"no {self.unit}"
            raise DataError(f"{self.path!r} has {what} with a non-empty field {self.field!r}: "
                            "check data.path and data.text_field")


class JsonlCorpus(_Records):
    """The string field of every line of *.jsonl files, read line by line."""

    unit = "lines"

    def __init__(self, path, field="text", max_docs=None):
        super().__init__("jsonl", path, field, max_docs)

    def records(self, rel):
        with open(self.root / rel, "rb") as f:
            offset = 0
            for lineno, line in enumerate(f, start=1):
                where = f"{self.root / rel}:{lineno}"
                line = line.rstrip(b"\n")
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise utf8_error(where, line, e, "remove that line", offset) from None
                offset += len(line) + 1
                if not line.strip():
                    continue
                self.seen += 1
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{where}: invalid JSON ({e.msg} at column {e.colno}): "
                                    f"each line must be one JSON object with a string field {self.field!r}") from None
                text = record_text(where, obj, self.field)
                if text:
                    yield f"{rel}:{lineno}", text


class ArrowCorpus(_Records):
    """Rows of Parquet or Arrow (IPC file or stream) files, read by pyarrow one record batch at
    a time: memory holds a batch (a Parquet row group), not the file. (Hugging Face `datasets`
    streaming was measured to grow past 1 GB on a 3 GB corpus; it reads these files with the
    same pyarrow underneath.)"""

    BATCH_ROWS = 1024

    def _batches(self, where: str, column: str):
        import pyarrow as pa

        if self.name == "parquet":
            import pyarrow.parquet as pq

            f = pq.ParquetFile(where)
            self._require(where, f.schema_arrow.names)
            yield from f.iter_batches(batch_size=self.BATCH_ROWS, columns=[column])
            return
        source = pa.memory_map(where)
        try:
            reader = pa.ipc.open_file(source)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:  # the streaming format (what Hugging Face datasets saves)
            source.seek(0)
            reader = pa.ipc.open_stream(source)
            batches = iter(reader)
        self._require(where, reader.schema.names)
        for batch in batches:
            yield batch.select([column])

    def _require(self, where: str, columns) -> None:
        if self.field not in columns:
            raise DataError(f"{where}: no column {self.field!r} (columns: {', '.join(columns)}): "
                            "set data.text_field to the column holding the text")

    def records(self, rel):
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise DataError(f"data.source={self.name} needs pyarrow: pip install pyarrow (or dysejax[data])") from None
        where = str(self.root / rel)
        i = 0
        try:
            for batch in self._batches(where, self.field):
                for value in batch.column(0).to_pylist():
                    self.seen += 1
                    text = None if value is None else record_text(f"{where}: row {i}", {self.field: value}, self.field)
                    if text:  # null and empty texts are no documents
                        yield f"{rel}:{i}", text
                    i += 1
        except DataError:
            raise
        except Exception as e:  # pyarrow's errors for a damaged or foreign file
            raise DataError(f"{where}: not a readable {self.name} file ({' '.join(str(e).split())[:160]}): "
                            "fix or remove it") from None


def open_corpus(cfg: DataConfig) -> Corpus:
    """The corpus `cfg.source` names (not `synthetic`: it has lengths, not texts)."""
    if cfg.source == "stdlib":  # a few stdlib files are not UTF-8: replace their bad bytes
        return FileCorpus(stdlib_source(cfg.max_docs), cfg.documents == "blocks", strict_utf8=False)
    if cfg.source == "text":
        return FileCorpus(text_files(cfg.path, cfg.glob, cfg.max_docs), cfg.documents == "blocks", strict_utf8=True)
    if cfg.source == "jsonl":
        return JsonlCorpus(cfg.path, cfg.text_field, cfg.max_docs)
    if cfg.source in ("parquet", "arrow"):
        return ArrowCorpus(cfg.source, cfg.path, cfg.text_field, cfg.max_docs)
    raise DataError(f"data.source={cfg.source!r} has no texts to tokenize: use stdlib, text, jsonl, parquet or arrow")
