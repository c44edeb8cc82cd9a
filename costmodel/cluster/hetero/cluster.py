"""A heterogeneous cluster description (YAML) as dataclasses.

    name: my_cluster
    memory_fraction: 0.9      # usable share of device memory (default 0.9)
    groups:                   # identical devices in one node
      - {name: a100-n0, device: a100-80gb, count: 8, node: n0}
      - {name: old, device: {flops: 1.0e14, memory_gb: 24, intra_node_bw: 6.4e10}, count: 4, node: n1}
    intra_node: {bandwidth: 3.0e11, latency: 5.0e-6}   # between groups of one node (default: NVLink
                                                       # of the slower device)
    inter_node: {bandwidth: 1.25e10, latency: 1.0e-5}  # between nodes (default: the slower NIC)
    links:                    # overrides between two groups or two nodes
      - {between: [n0, n1], bandwidth: 2.5e10, latency: 5.0e-6}

Bandwidths are bytes/s per device pair in each direction (one NIC per GPU); `device` names a
`costmodel.hardware.PROFILES` entry or gives flops and memory inline (peak figures: the shared
time model applies its achievable fractions, `costmodel.time.TimeCoefficients.from_profile`).
Devices of one group talk over their own NVLink (`intra_node_bw` of the device).
"""
from __future__ import annotations

from dataclasses import dataclass

from costmodel.cluster.workload import ClusterError, read_yaml
from costmodel.hardware import PROFILES, DeviceProfile

__all__ = ["ClusterError", "Group", "Link", "HeteroCluster", "load_cluster", "parse_cluster"]


@dataclass(frozen=True)
class Group:
    """`count` identical devices of one kind in one node."""

    name: str
    device: DeviceProfile
    count: int
    node: str


@dataclass(frozen=True)
class Link:
    bandwidth: float  # bytes/s per device pair, each direction
    latency: float


@dataclass(frozen=True)
class HeteroCluster:
    """Groups of identical devices and the links between them (see the module doc)."""

    name: str
    groups: tuple
    links: dict  # frozenset({a, b}) of group or node names -> Link
    intra_node: Link | None
    inter_node: Link | None
    memory_fraction: float = 0.9

    @property
    def n_devices(self) -> int:
        return sum(g.count for g in self.groups)

    def group(self, name: str) -> Group:
        return next(g for g in self.groups if g.name == name)

    def link(self, a: Group, b: Group) -> Link:
        """The link between a device of group a and one of group b."""
        if a.name == b.name:
            return Link(a.device.intra_node_bw, a.device.link_latency_s)
        for key in ((a.name, b.name), (a.node, b.node)):
            if frozenset(key) in self.links:
                return self.links[frozenset(key)]
        lat = max(a.device.link_latency_s, b.device.link_latency_s)
        if a.node == b.node:
            return self.intra_node or Link(min(a.device.intra_node_bw, b.device.intra_node_bw), lat)
        return self.inter_node or Link(min(a.device.inter_node_bw, b.device.inter_node_bw), lat)


def _num(value, where: str, positive: bool = True) -> float:
    try:
        x = float(value)  # YAML 1.1 reads 1.25e10 (no dot or sign) as a string
    except (TypeError, ValueError):
        raise ClusterError(f"{where}: expected a number, got {value!r}") from None
    if positive and not x > 0:
        raise ClusterError(f"{where}: must be > 0, got {value!r}")
    return x


def _device(spec, where: str) -> DeviceProfile:
    if isinstance(spec, str):
        if spec.lower() not in PROFILES:
            raise ClusterError(f"{where}: unknown device kind {spec!r}; use one of {', '.join(PROFILES)} "
                               "or give {flops: ..., memory_gb: ...}")
        return PROFILES[spec.lower()]
    if not isinstance(spec, dict):
        raise ClusterError(f"{where}: expected a device name or {{flops, memory_gb}}, got {spec!r}")
    unknown = set(spec) - {"name", "flops", "memory_gb", "memory_bytes", "intra_node_bw", "inter_node_bw", "latency"}
    if unknown:
        raise ClusterError(f"{where}: unknown key {sorted(unknown)[0]!r} (known: name, flops, memory_gb, "
                           "memory_bytes, intra_node_bw, inter_node_bw, latency)")
    if "flops" not in spec or not ({"memory_gb", "memory_bytes"} & set(spec)):
        raise ClusterError(f"{where}: an inline device needs flops and memory_gb (or memory_bytes)")
    mem = (_num(spec["memory_gb"], f"{where}.memory_gb") * 2**30 if "memory_gb" in spec
           else _num(spec["memory_bytes"], f"{where}.memory_bytes"))
    return DeviceProfile(str(spec.get("name", "custom")), _num(spec["flops"], f"{where}.flops"), int(mem),
                         _num(spec.get("intra_node_bw", 300e9), f"{where}.intra_node_bw"),
                         _num(spec.get("inter_node_bw", 25e9), f"{where}.inter_node_bw"),
                         _num(spec.get("latency", 5e-6), f"{where}.latency"))


def _link(spec, where: str) -> Link:
    if not isinstance(spec, dict) or "bandwidth" not in spec:
        raise ClusterError(f"{where}: expected {{bandwidth: bytes/s, latency: s}}, got {spec!r}")
    return Link(_num(spec["bandwidth"], f"{where}.bandwidth"), _num(spec.get("latency", 5e-6), f"{where}.latency"))


def parse_cluster(data, source: str = "cluster") -> HeteroCluster:
    """A `HeteroCluster` from the parsed YAML mapping (see the module doc)."""
    if not isinstance(data, dict):
        raise ClusterError(f"{source}: expected a mapping with 'groups', got {type(data).__name__}")
    unknown = set(data) - {"name", "memory_fraction", "groups", "intra_node", "inter_node", "links"}
    if unknown:
        raise ClusterError(f"{source}: unknown key {sorted(unknown)[0]!r} (known: name, memory_fraction, "
                           "groups, intra_node, inter_node, links)")
    groups_spec = data.get("groups")
    if not isinstance(groups_spec, list) or not groups_spec:
        raise ClusterError(f"{source}: groups: give a non-empty list of {{name, device, count, node}}")
    groups = []
    for i, g in enumerate(groups_spec):
        where = f"{source}: groups[{i}]"
        if not isinstance(g, dict):
            raise ClusterError(f"{where}: expected {{name, device, count, node}}, got {g!r}")
        for key in ("device", "count"):
            if key not in g:
                raise ClusterError(f"{where}: missing '{key}'")
        count = g["count"]
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ClusterError(f"{where}.count: must be a positive integer, got {count!r}")
        name = str(g.get("name", f"group{i}"))
        if any(x.name == name for x in groups):
            raise ClusterError(f"{where}.name: {name!r} is used twice; give each group its own name")
        unknown = set(g) - {"name", "device", "count", "node"}
        if unknown:
            raise ClusterError(f"{where}: unknown key {sorted(unknown)[0]!r} (known: name, device, count, node)")
        groups.append(Group(name, _device(g["device"], f"{where}.device"), count, str(g.get("node", name))))
    names = {g.name for g in groups} | {g.node for g in groups}
    links = {}
    for i, spec in enumerate(data.get("links") or []):
        where = f"{source}: links[{i}]"
        ends = spec.get("between") if isinstance(spec, dict) else None
        if not isinstance(ends, list) or len(ends) != 2 or not set(map(str, ends)) <= names:
            raise ClusterError(f"{where}.between: give two group or node names (known: {', '.join(sorted(names))})")
        links[frozenset(map(str, ends))] = _link(spec, where)
    frac = _num(data.get("memory_fraction", 0.9), f"{source}: memory_fraction")
    if frac > 1:
        raise ClusterError(f"{source}: memory_fraction: must be in (0, 1], got {frac}")
    return HeteroCluster(str(data.get("name", source)), tuple(groups), links,
                   _link(data["intra_node"], f"{source}: intra_node") if data.get("intra_node") else None,
                   _link(data["inter_node"], f"{source}: inter_node") if data.get("inter_node") else None, frac)


def load_cluster(path: str) -> HeteroCluster:
    """Read and validate a cluster YAML file."""
    return parse_cluster(read_yaml(path, "cluster file"), path)
