"""Collectives in compiled (partitioned) HLO text: count and bytes per device, by kind.

Loops count: an op inside a `while` body with a known trip count n counts n times (XLA's
cost_analysis counts loop bodies once). Bytes of an op are the larger of its operand and result
buffers on one device (for an all-gather the gathered result, for a reduce-scatter its input),
i.e. the data the collective handles, not the wire traffic of a particular algorithm.
"""
from __future__ import annotations

import re
from collections import defaultdict

KINDS = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute", "all-to-all")
DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
               "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1}

_HEADER = re.compile(r"^(?:ENTRY\s+)?%([\w.\-]+)\s*\(.*\)\s*->.*\{\s*$")
_OP = re.compile(r"^\s*(?:ROOT\s+)?%[\w.\-]+\s*=\s*(.+?)\s+([a-z][\w\-]*)\((.*)$")
_ARRAY = re.compile(r"\b([a-z]+\d*[a-z0-9]*)\[([\d,]*)\]")
_CALLS = re.compile(r"(?:body|calls|to_apply|true_computation|false_computation)=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def _bytes(types: str) -> list[int]:
    out = []
    for dtype, dims in _ARRAY.findall(types):
        if dtype not in DTYPE_BYTES:
            continue
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        out.append(n * DTYPE_BYTES[dtype])
    return out


def _computations(text: str) -> tuple[dict[str, list[str]], str]:
    comps: dict[str, list[str]] = {}
    entry, current = "", None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            current = header.group(1)
            comps[current] = []
            if line.startswith("ENTRY"):
                entry = current
        elif current is not None:
            if line.strip() == "}":
                current = None
            else:
                comps[current].append(line)
    return comps, entry


def _multiplicities(comps: dict[str, list[str]], entry: str) -> dict[str, int]:
    mult: dict[str, int] = defaultdict(int)

    def visit(name: str, times: int, depth: int = 0):
        if name not in comps or depth > 64:
            return
        mult[name] += times
        for line in comps[name]:
            trip = _TRIP.search(line)
            n = int(trip.group(1)) if (trip and " while(" in line) else 1
            for callee in _CALLS.findall(line):
                visit(callee, times * (n if "body=%" + callee in line else 1), depth + 1)
            for group in _BRANCHES.findall(line):
                for callee in re.findall(r"%([\w.\-]+)", group):
                    visit(callee, times, depth + 1)
    visit(entry, 1)
    return mult


def collective_stats(text: str) -> dict[str, dict[str, int]]:
    """{kind: {"count": executions, "bytes": bytes per device}} for each collective kind."""
    comps, entry = _computations(text)
    mult = _multiplicities(comps, entry)
    stats = {k: {"count": 0, "bytes": 0} for k in KINDS}
    for name, lines in comps.items():
        times = mult.get(name, 0)
        if not times:
            continue
        for line in lines:
            op = _OP.match(line)
            if not op:
                continue
            result, opcode, rest = op.groups()
            if opcode.endswith("-done"):
                continue
            kind = opcode[:-6] if opcode.endswith("-start") else opcode
            if kind not in stats:
                continue
            operands = rest.split("),")[0]
            size = max(_bytes(result) + _bytes(operands) + [0])
            stats[kind]["count"] += times
            stats[kind]["bytes"] += times * size
    return stats


def collective_bytes(text: str) -> dict[str, int]:
    """Bytes per device handled by each kind of collective."""
    return {k: v["bytes"] for k, v in collective_stats(text).items()}


_NAME = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=")
_REF = re.compile(r"%([\w.\-]+)")


_CHANNEL = re.compile(r"channel_id=(\d+)")


def unordered_collectives(text: str) -> list[tuple[str, str, str]]:
    """(computation, op, op) for each pair of instructions that run collectives (directly or in
    a called computation) with no data dependence between them: XLA:CPU may start those in
    different orders on different devices, which deadlocks (`sharding.ops.ordering`)."""
    return [(comp, a, b) for comp, a, b, _ in _unordered_pairs(text)]


def shared_channel_collectives(text: str) -> list[tuple[str, str, str, tuple]]:
    """(computation, op, op, shared keys) for each pair of instructions with no data dependence
    between them that run collectives of one kind on one channel id (directly or in a called
    computation). XLA:CPU keys a collective's rendezvous by (kind, channel id) and lets
    collectives it has started overlap: two such collectives in flight join one rendezvous
    (`sharding.ops.ordering.unique_collective_channels`)."""
    return [(comp, a, b, shared) for comp, a, b, (ka, kb) in _unordered_pairs(text) if (shared := tuple(sorted(ka & kb)))]


def _unordered_pairs(text: str) -> list[tuple[str, str, str, tuple[set, set]]]:
    """Pairs of collective-bearing instructions of one computation with no data dependence
    between them, each with the (kind, channel id) keys it bears."""
    comps, _ = _computations(text)
    borne: dict[str, frozenset] = {}

    def own_keys(line: str) -> set:
        op = _OP.match(line)
        if not (op and op.group(2).removesuffix("-start") in KINDS):
            return set()
        channel = _CHANNEL.search(line)
        return {(op.group(2).removesuffix("-start"), channel.group(1) if channel else None)}

    def callees(line: str) -> list[str]:
        return _CALLS.findall(line) + [c for g in _BRANCHES.findall(line) for c in _REF.findall(g)]

    def bears(name: str, depth: int = 0) -> frozenset:
        if name not in borne:
            borne[name] = frozenset()
            keys = set()
            for line in comps.get(name, ()):
                keys |= own_keys(line)
                for c in callees(line):
                    if depth < 64:
                        keys |= bears(c, depth + 1)
            borne[name] = frozenset(keys)
        return borne[name]

    out = []
    for comp, lines in comps.items():
        deps: dict[str, set[str]] = {}
        collective: list[tuple[str, set]] = []
        for line in lines:
            name = _NAME.match(line)
            op = _OP.match(line)
            if not (name and op):
                continue
            me = name.group(1)
            rest = op.group(3).split(", metadata=")[0]
            deps[me] = {r for r in _REF.findall(rest) if r in deps}
            keys = own_keys(line).union(*(bears(c) for c in callees(line)))
            if keys:
                collective.append((me, keys))
        ancestors: dict[str, set[str]] = {}
        for me in deps:  # instructions are listed after their operands
            anc = set()
            for d in deps[me]:
                anc |= ancestors[d] | {d}
            ancestors[me] = anc
        for i, (a, ka) in enumerate(collective):
            for b, kb in collective[i + 1:]:
                if a not in ancestors[b] and b not in ancestors[a]:
                    out.append((comp, a, b, (ka, kb)))
    return out
