"""The time model's two tiers of links (NVLink in a node, NICs across nodes) and weight-collective
overlap: group placement on the mesh, the bytes each link carries, and what a layer pays."""
from dataclasses import replace

import pytest

from costmodel import memory as M
from costmodel import time as T
from costmodel.hardware import PROFILES
from sharding.ops.blocks import BlockSpec
from sharding.strategies.description import BATCH_ROLE, DEVICES_ROLE, MODEL_ROLE

SPEC_7B = BlockSpec(n_heads=32, head_dim=128, d_model=4096, d_ff=11008, gated=True, activation="silu",
                    attention="blockwise", attention_block=1024, compute_dtype="bfloat16")


def _layer(mesh, batch=8, seq=4096):
    return M.Shape(SPEC_7B, mesh, batch, seq).layer


def test_groups_are_placed_as_build_mesh_lays_devices_out():
    """Model axes are the inner axes (a host's devices along the last axes): a model group of 8
    is one node, the batch axes stride it (one device per node), all 64 devices span 8 nodes."""
    hybrid = _layer({"data": 8, "model": 8})
    assert T.in_node(hybrid, MODEL_ROLE, 8) == 8
    assert T.in_node(hybrid, BATCH_ROLE, 8) == 1
    assert T.in_node(hybrid, DEVICES_ROLE, 8) == 8
    small_model = _layer({"data": 16, "model": 2})
    assert T.in_node(small_model, BATCH_ROLE, 8) == 4  # 4 of the 16 batch peers share a node
    assert T.in_node(_layer({"data": 64}), MODEL_ROLE, 8) == 8  # one axis: the model group is all 64
    assert T.in_node(hybrid, BATCH_ROLE, 0) == 8  # one tier: the group is in one node


def test_bytes_per_link_of_a_collective_spanning_nodes():
    """All-to-all: the share for peers in other nodes goes through the NIC; ring collectives: every
    byte crosses a node boundary once through one of the node's members' NICs; ppermute: NIC."""
    size = 1600.0
    assert T.links("all-to-all", size, 8, 8) == (1400.0, 0.0, 7)  # inside a node: NVLink only
    assert T.links("all-to-all", size, 16, 8) == (700.0, 800.0, 15)
    assert T.links("all-gather", size, 16, 8) == (1500.0, 1500.0 / 8, 15)
    assert T.links("all-reduce", size, 4, 1) == (2400.0, 2400.0, 6)
    assert T.links("collective-permute", size, 16, 8) == (0.0, 1600.0, 1)


def test_link_time_takes_the_slower_link_and_the_inter_node_latency():
    c = T.TimeCoefficients(1, 1, 1, 1, bandwidth={"all-to-all": 100.0}, latency={"all-to-all": 1.0},
                           inter_bandwidth={"all-to-all": 10.0}, inter_latency={"all-to-all": 3.0}, devices_per_node=8)
    assert c.link_time("all-to-all", 700.0, 0.0, 7) == pytest.approx(7.0 + 7 * 1.0)
    assert c.link_time("all-to-all", 700.0, 800.0, 15) == pytest.approx(80.0 + 15 * 3.0)
    assert c.link_time("all-to-all", 9000.0, 10.0, 1) == pytest.approx(90.0 + 3.0)


def test_flexsp_all_to_all_bandwidth_across_nodes():
    """FlexSP's measured all-to-all bandwidths on its 64 x A100-40GB cluster (repo solver.py, "4k seq,
    2 IB": 10.33, 5.94, 4.87 GB/s of the local array at 16, 32, 64 GPUs) within 20%: the NIC
    carries the bytes for other nodes, (p - 8) / p of the array."""
    coeffs = T.TimeCoefficients.from_profile(PROFILES["a100-40gb"])
    size = 32 * 2**20
    for p, measured in ((16, 10.33e9), (32, 5.94e9), (64, 4.87e9)):
        predicted = size / T.collective_time(coeffs, "all-to-all", size, p, 8)
        assert abs(predicted / measured - 1) < 0.2, (p, predicted, measured)


def test_one_node_prices_as_one_tier():
    """On 8 GPUs of one node the second tier changes nothing."""
    coeffs = T.TimeCoefficients.from_profile(PROFILES["h100"])
    flat = replace(coeffs, devices_per_node=0)
    for strategy in ("fsdp", "tp_sp", "ring", "ulysses", "metp"):
        shape = M.Shape(SPEC_7B, {"data": 8}, 8, 8192)
        assert T.layer_time(shape, strategy, "none", coeffs).total == T.layer_time(shape, strategy, "none", flat).total


def test_a_group_spanning_nodes_pays_the_nic():
    """Ulysses over 16 GPUs of two nodes: its all-to-alls run at the NIC's pace, which costs more
    per layer than 16 GPUs in one (hypothetical) node; fsdp's gathers over all 64 GPUs too."""
    coeffs = T.TimeCoefficients.from_profile(PROFILES["a100-40gb"])
    big_node = replace(coeffs, devices_per_node=64)
    shape = M.Shape(SPEC_7B, {"data": 16}, 1, 65536)
    two_nodes, one_node = (T.layer_time(shape, "ulysses", "none", c).comm for c in (coeffs, big_node))
    assert two_nodes > 3 * one_node
    w = T.layer_work(shape, "ulysses", devices_per_node=8)
    a2a = [(intra, inter) for kind, intra, inter, _, _ in w.links if kind == "all-to-all"]
    assert len(a2a) == 1 and a2a[0][1] > a2a[0][0]  # more bytes through the NIC than over NVLink


def test_weight_collectives_hide_behind_long_compute():
    """fsdp's weight gathers and gradient reduce-scatters overlap the layer's compute on GPUs
    (`overlap`): exposed only where they outlast it; without overlap (XLA:CPU) every byte costs."""
    coeffs = T.TimeCoefficients.from_profile(PROFILES["a100-40gb"])
    long = T.layer_time(M.Shape(SPEC_7B, {"data": 8}, 8, 8192), "fsdp", "none", coeffs)
    assert long.comm == 0.0 and long.hidden > 0
    fsdp64 = M.Shape(SPEC_7B, {"data": 64}, 64, 512)  # 512 tokens a device, weights gathered over 8 nodes
    short = T.layer_time(fsdp64, "fsdp", "none", coeffs)
    assert short.comm > 0 and short.hidden == pytest.approx(short.attention + short.compute)  # hidden: the compute's length
    serial = T.layer_time(fsdp64, "fsdp", "none", replace(coeffs, overlap=False))
    w = T.layer_work(fsdp64, "fsdp", devices_per_node=8)
    assert serial.comm == pytest.approx(sum(coeffs.link_time(k, a, b, h) for k, a, b, h, _ in w.links))
