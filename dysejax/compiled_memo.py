"""Programs compiled in this process, reused by every later lowering of the same module.

JAX's in-memory caches key compiled programs by the traced function, so a second trainer of
one configuration (a notebook re-run, a test after another) lowers the same module again and
would compile it again; on XLA:CPU with several devices the persistent cache cannot serve it
(`dysejax.runtime.persistent_cache_refusal`). Here a program is keyed by its lowered module's
text, its input and output pytree structures (two optimizers' states can lower to one module
text, e.g. adam's and adabelief's, and a compiled program accepts only the pytree it was
traced with) and its devices, and the most recent `LIMIT` compiled programs are kept with the seconds
XLA took to compile them (what a comparison of plans charges each, whichever asked first).
"""
from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from typing import Any, Sequence

LIMIT = 64

_compiled: "OrderedDict[str, Any]" = OrderedDict()
_lock = threading.Lock()


def compile_once(lowered, device_ids: Sequence[int]) -> tuple[Any, float]:
    """(`lowered.compile()`, its seconds), or the program and seconds of an earlier identical
    lowering in this process."""
    key = hashlib.sha256("\0".join((lowered.as_text(), str(lowered.in_tree), str(lowered.out_tree),
                                     repr(tuple(device_ids)))).encode()).hexdigest()
    with _lock:
        if key in _compiled:
            _compiled.move_to_end(key)
            return _compiled[key]
    t0 = time.perf_counter()
    compiled = lowered.compile()
    entry = (compiled, time.perf_counter() - t0)
    with _lock:
        _compiled[key] = entry
        while len(_compiled) > LIMIT:
            _compiled.popitem(last=False)
    return entry
