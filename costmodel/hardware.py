"""Device profiles: peak compute, memory and link bandwidths, for devices here or elsewhere.

Figures are vendor peaks (dense bf16 tensor-core FLOP/s, HBM capacity and bandwidth, NVLink
bandwidth per direction per GPU, the GPU's share of the node's network) so a user can plan a
GPU cluster from a laptop; `costmodel.time.TimeCoefficients.from_profile` applies achievable
fractions, `profile` fits them on real devices. Every figure says where it comes from (the
quotes are in docs/cluster_predictions.md); a figure that no stored source gave is marked so.
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
    inter_node_bw: float  # bytes/s per direction across nodes: this device's share of the node's NICs
    link_latency_s: float = 5e-6
    devices_per_node: int = 8
    hbm_bw: float = 2.0e12  # bytes/s of device memory (memory-bound elementwise work)
    inter_node_latency_s: float = 10e-6  # seconds per message hop across nodes
    fp8_flops: float = 0.0  # peak dense fp8 FLOP/s (0: no fp8 tensor cores)


# Sources (quoted in docs/cluster_predictions.md):
#  [A100]  NVIDIA A100 datasheet via glennklockwood.com/garden/processors/A100: BF16 312 TFLOPS
#          dense; A100 40G SXM4 "40 GB HBM2 ... 1.555 TB/s", "300+300 GB/s NVLink"; A100 80G
#          "80 GB HBM2e ... 2.039 [TB]/s"; 40 GB card: "Total amount of global memory: 40441
#          MBytes (42405855232 bytes)" (deviceQuery, upb-pc2 wiki).
#  [H100]  glennklockwood.com/garden/processors/h100: BF16 989.4 dense, FP8 1978.9 dense TFLOPS,
#          "80 GB HBM3", "3.35 TB/s", "900 GB/s NVLink" (both directions: 450 per direction).
#  [DGXH]  DGX H100: "each GPU is directly wired to a 400Gb/s NIC" (linux-wireless list, DGX
#          H100 reference block diagram; DGX H100 User Guide table 6: one ConnectX-7 per GPU).
#  [A3]    cloud.google.com GPU network bandwidth: "A3 High (NVIDIA H100): up to 1,000 Gbps" per
#          VM of 8 GPUs (an upper bound: it includes the VM's general-purpose NIC); "A3 Ultra
#          ... eight CX7 NICs deliver a total network bandwidth of 3,200 Gbps", one per H200.
#  [H200]  flashgenius NCP-AII guide: H200 "HBM3e capacity/bandwidth (4.8 TB/s ...)", same
#          compute die as H100; 141 GB.
#  [FlexSP] FlexSP's cluster (arXiv 2412.01523 as quoted in issue 29): 64 x A100-40GB, NVLink,
#          "400 Gb/s IB" per node; the repo's solver.py measured all-to-all bandwidths are
#          labelled "2 IB". Read as 400 Gb/s per node of 8 GPUs: 6.25 GB/s per GPU (the
#          paper's setup paragraph was not readable in the stored material).
#  Not found in stored material (kept from the earlier profiles, marked "unsourced"): the
#  A100-80GB NIC (200 Gb/s HDR per GPU as in DGX A100), V100 / A10 links, inter-node latency
#  (10 us: the order of one NCCL message over InfiniBand; from 5 to 20 us gpu_reference's step
#  times move < 0.1%, its multi-node all-to-all points 2-8%).
PROFILES = {
    "a100-80gb": DeviceProfile("A100-80GB", 312e12, 80 * 2**30, 300e9, 25e9, hbm_bw=2.039e12),  # [A100]; NIC unsourced
    "a100-40gb": DeviceProfile("A100-40GB", 312e12, 42405855232, 300e9, 400e9 / 8 / 8, hbm_bw=1.555e12),  # [A100] [FlexSP]
    "h100": DeviceProfile("H100-SXM", 989.4e12, 80 * 2**30, 450e9, 400e9 / 8, hbm_bw=3.35e12,
                          fp8_flops=1978.9e12),  # [H100] [DGXH]
    "h100-a3": DeviceProfile("H100-SXM (GCP A3 High)", 989.4e12, 80 * 2**30, 450e9, 1000e9 / 8 / 8, hbm_bw=3.35e12,
                             fp8_flops=1978.9e12),  # [H100] [A3]
    "h200": DeviceProfile("H200-SXM", 989.4e12, 141 * 10**9, 450e9, 400e9 / 8, hbm_bw=4.8e12,
                          fp8_flops=1978.9e12),  # [H200] [A3] (A3 Ultra: one 400 Gb/s CX7 per GPU)
    "v100-32gb": DeviceProfile("V100-32GB", 125e12, 32 * 2**30, 150e9, 12.5e9, hbm_bw=0.9e12),  # fp16; unsourced
    "a10-24gb": DeviceProfile("A10-24GB", 125e12, 24 * 2**30, 32e9, 12.5e9, hbm_bw=0.6e12),  # PCIe only; unsourced
}


def get_profile(name: str) -> DeviceProfile:
    """A named profile (one of `PROFILES`: a100-80gb, a100-40gb, h100, h100-a3, h200, v100-32gb, a10-24gb)."""
    try:
        return PROFILES[name.lower()]
    except KeyError:
        raise KeyError(f"unknown device profile {name!r} (known: {', '.join(PROFILES)})") from None
