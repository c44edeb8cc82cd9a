"""Folder paths for orbax: any path a shell accepts, `[ ] * ?` included.

orbax (through etils' `epath.glob`) lists inside a checkpoint folder by joining the folder's
path with a pattern and globbing the whole string, so glob syntax in the folder's own path is
read as a pattern: under `runs/w_[x]` a checkpoint is written but never found again (`[x]`
matches `x`), and `*` or `?` can match a sibling folder. Such a path is handed to orbax through
a symlink from a private temporary folder (removed at exit); every other path is passed as it
is. (JAX's compile cache globs only to evict, which dysejax leaves off.)
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading

GLOB_CHARS = "*?["
_aliases: dict[str, str] = {}  # real folder -> its symlink
_lock = threading.Lock()
_root: list[str] = []


def _remove_root() -> None:
    if _root:
        shutil.rmtree(_root[0], ignore_errors=True)  # removes the links, never what they point to


def glob_safe(path: str, create: bool = False) -> str:
    """`path` (made absolute) in a form with no glob syntax, reaching the same folder; with
    `create`, the folder holding the last glob character is created first."""
    path = os.path.abspath(path)
    parts = path.split(os.sep)
    magic = [i for i, part in enumerate(parts) if any(c in part for c in GLOB_CHARS)]
    if not magic:
        return path
    target = os.sep.join(parts[:magic[-1] + 1])
    if create:
        os.makedirs(target, exist_ok=True)
    with _lock:
        if target not in _aliases:
            if not _root:
                _root.append(tempfile.mkdtemp(prefix="dysejax-paths-"))
                atexit.register(_remove_root)
            link = os.path.join(_root[0], str(len(_aliases)))
            os.symlink(target, link, target_is_directory=True)
            _aliases[target] = link
        link = _aliases[target]
    return os.path.join(link, *parts[magic[-1] + 1:])


def real_paths(text: str) -> str:
    """`text` (e.g. a library's error message) with every alias replaced by the path it stands for."""
    for target, link in _aliases.items():
        text = text.replace(link, target)
    return text
