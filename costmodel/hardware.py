"""Device profiles: peak compute, memory and link bandwidths, for devices here or elsewhere.

Figures are vendor peaks (dense bf16 tensor-core FLOP/s, HBM capacity, NVLink bandwidth per
direction per GPU, one InfiniBand NIC per GPU) so a user can plan a GPU cluster from a laptop;
`profile` fits the achievable fraction on real devices.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceProfile:
    """One accelerator and its links."""

    name: str
    flops: float  # peak dense bf16 FLOP/s
    memory_bytes: int  # device memory
    intra_node_bw: float  # bytes/s per direction to a peer in the node (NVLink)
    inter_node_bw: float  # bytes/s per direction across nodes (one NIC per device)
    link_latency_s: float = 5e-6
    devices_per_node: int = 8


PROFILES = {
    "a100-80gb": DeviceProfile("A100-80GB", 312e12, 80 * 2**30, 300e9, 25e9),
    "h100": DeviceProfile("H100-SXM", 989e12, 80 * 2**30, 450e9, 50e9),
    "h200": DeviceProfile("H200-SXM", 989e12, 141 * 10**9, 450e9, 50e9),
    "v100-32gb": DeviceProfile("V100-32GB", 125e12, 32 * 2**30, 150e9, 12.5e9),  # fp16 tensor cores
    "a10-24gb": DeviceProfile("A10-24GB", 125e12, 24 * 2**30, 32e9, 12.5e9),  # PCIe only, no NVLink
}


def get_profile(name: str) -> DeviceProfile:
    """A named profile (a100-80gb, h100, h200, v100-32gb, a10-24gb)."""
    try:
        return PROFILES[name.lower()]
    except KeyError:
        raise KeyError(f"unknown device profile {name!r} (known: {', '.join(PROFILES)})") from None
