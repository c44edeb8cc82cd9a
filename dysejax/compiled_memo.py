"""Programs compiled in this process, reused by every later lowering of the same module.

JAX's in-memory caches key compiled programs by the traced function, so a second trainer of
one configuration (a notebook re-run, a test after another) lowers the same module again and
would compile it again; on XLA:CPU with several devices the persistent cache cannot serve it
(`dysejax.runtime.persistent_cache_refusal`). Here a program is keyed by its lowered module's
text and its devices, and the most recent `LIMIT` compiled programs are kept.
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any, Sequence

LIMIT = 64

_compiled: "OrderedDict[str, Any]" = OrderedDict()
_lock = threading.Lock()


def compile_once(lowered, device_ids: Sequence[int]):
    """`lowered.compile()`, or the program an earlier identical lowering compiled in this process."""
    key = hashlib.sha256(lowered.as_text().encode() + repr(tuple(device_ids)).encode()).hexdigest()
    with _lock:
        if key in _compiled:
            _compiled.move_to_end(key)
            return _compiled[key]
    compiled = lowered.compile()
    with _lock:
        _compiled[key] = compiled
        while len(_compiled) > LIMIT:
            _compiled.popitem(last=False)
    return compiled
