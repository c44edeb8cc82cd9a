"""HPH heterogeneous planner: simulator, partitioner, recompute in bubbles, CLI (all model predictions)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from costmodel.cluster import ClusterError, Model, Workload, load_model, pipeline
from costmodel.cluster.hetero import parse_cluster, plan_hetero, simulate, topology
from costmodel.cluster.hetero.recompute import recompute_report
from costmodel.cluster.hetero.stage import StageCost
from sharding.ops.blocks import BlockSpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = Model("test-1b", BlockSpec(n_heads=16, head_dim=128, d_model=2048, d_ff=5632, attention="blockwise",
                                   attention_block=1024, compute_dtype="bfloat16"), n_layers=16, vocab=32000)
WL = Workload.split(seq_len=2048, global_batch=64, microbatches=16)


def _stage(f, b, rec=0.0, static=0.0, act=1.0, rec_bytes=0.0, sync=0.0):
    return StageCost("tp", rec > 0, f, b, rec, sync, static, act, rec_bytes)


def _cluster(fast_flops, slow_flops, fast_gb=80, slow_gb=80):
    """Two nodes of 4 devices, not a shipped cluster file."""
    return parse_cluster({"name": "generated", "groups": [
        {"name": "fast", "device": {"name": "fast", "flops": fast_flops, "memory_gb": fast_gb}, "count": 4,
         "node": "a"},
        {"name": "slow", "device": {"name": "slow", "flops": slow_flops, "memory_gb": slow_gb}, "count": 4,
         "node": "b"}], "inter_node": {"bandwidth": "2.5e10", "latency": 1e-5}})


def _sim_matches(plan):
    sim = plan.simulate()
    assert sim.iteration_s == pytest.approx(plan.predicted_iteration_s, rel=1e-6), plan.name
    return sim


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_simulator_uniform_stages_hand_computed(schedule):
    p, m, f, b = 4, 8, 1.0, 2.0
    costs = [_stage(f, b, static=10.0, act=3.0) for _ in range(p)]
    sim = simulate(costs, [0.0] * (p - 1), m, schedule)
    assert sim.iteration_s == pytest.approx((m + p - 1) * (f + b))
    assert sim.bubble_fraction == pytest.approx(pipeline.bubble_fraction(p, m))
    assert sim.peak_bytes == tuple(10.0 + 3.0 * pipeline.in_flight(k, p, m, schedule) for k in range(p))
    assert pipeline.iteration_time([f] * p, [b] * p, [0.0] * (p - 1), m, schedule) == pytest.approx(sim.iteration_s)


def test_simulator_gpipe_with_transfers_hand_computed():
    """GPipe = a forward then a backward flow shop: (m + p - 1)(F + B) + 2 (p - 1) c for c <= F."""
    p, m, f, b, c = 3, 5, 1.0, 2.0, 0.25
    sim = simulate([_stage(f, b) for _ in range(p)], [c] * (p - 1), m, "gpipe")
    assert sim.iteration_s == pytest.approx((m + p - 1) * (f + b) + 2 * (p - 1) * c)


def test_recompute_hidden_in_bubble_and_reported_when_not():
    m = 8
    # stage 0 is fast: its recompute runs while it waits for stage 1's gradients
    hidden = [_stage(1.0, 2.0, rec=1.0, act=1.0, rec_bytes=4.0), _stage(2.0, 4.0)]
    base = pipeline.iteration_time([1.0, 2.0], [2.0, 4.0], [0.01], m)
    rep = recompute_report(hidden, [0.01], m, "1f1b")
    assert rep.hidden and rep.extra_s == 0.0 and rep.stages == (0,)
    assert simulate(hidden, [0.01], m).iteration_s == pytest.approx(base)
    assert simulate(hidden, [0.01], m).peak_bytes[0] == pytest.approx(2 * 1.0 + 4.0)  # min(p, m) inputs + one
    # the recomputing stage is the bottleneck: no bubble to hide it in
    exposed = [_stage(2.0, 4.0, rec=2.0), _stage(1.0, 2.0)]
    rep = recompute_report(exposed, [0.01], m, "1f1b")
    assert not rep.hidden and rep.extra_s > 0.9 * m * 2.0 and "not hidden" in rep.describe()


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_planner_beats_even_split_when_speeds_differ(schedule):
    plan = plan_hetero(_cluster(3.0e14, 1.0e14), MODEL, WL, schedule)
    even = plan.baselines["even_split"]
    assert plan.predicted_iteration_s < even.predicted_iteration_s * (1 - 0.02)
    for b in plan.baselines.values():
        _sim_matches(b)
        assert plan.predicted_iteration_s <= b.predicted_iteration_s * (1 + 1e-9), b.name
    sim = _sim_matches(plan)
    for k, u in enumerate(plan.stages):
        assert sim.peak_bytes[k] <= 0.9 * u.group.device.memory_bytes, f"stage {k} over memory"
    assert [j - i for i, j in plan.partition.bounds] != [j - i for i, j in even.partition.bounds]


def test_planner_never_worse_and_fits_on_random_clusters():
    rng = np.random.default_rng(0)
    for trial in range(4):
        flops = rng.uniform(0.5e14, 4e14, size=2)
        gb = rng.choice([16, 24, 40, 80], size=2)
        cl = parse_cluster({"name": f"random{trial}", "groups": [
            {"name": f"g{i}", "device": {"name": f"k{i}", "flops": float(flops[i]), "memory_gb": int(gb[i])},
             "count": int(rng.choice([2, 4])), "node": f"n{i}"} for i in range(2)]})
        plan = plan_hetero(cl, MODEL, WL)
        sim = _sim_matches(plan)
        for b in plan.baselines.values():
            assert plan.predicted_iteration_s <= b.predicted_iteration_s * (1 + 1e-9), (trial, b.name)
        for k, u in enumerate(plan.stages):
            assert sim.peak_bytes[k] == pytest.approx(plan.peak_bytes()[k])
            assert sim.peak_bytes[k] <= cl.memory_fraction * u.group.device.memory_bytes, (trial, k)


def test_memory_poor_devices_recompute_and_still_fit():
    wl = Workload.split(seq_len=16384, global_batch=16, microbatches=16)
    # 6 GB fits without recompute since the chunked loss (its transient is one chunk's logits);
    # 4.5 GB does not fit even with it
    plan = plan_hetero(_cluster(3.0e14, 1.0e14, fast_gb=5, slow_gb=5), MODEL, wl)
    sim = _sim_matches(plan)
    assert plan.recompute.stages, "expected a memory-poor stage to recompute"
    assert plan.recompute.hidden, plan.recompute.describe()  # the fast stages' bubbles absorb it
    for k, u in enumerate(plan.stages):
        assert sim.peak_bytes[k] <= 0.9 * u.group.device.memory_bytes
    c = plan.partition.costs
    free = pipeline.iteration_time([x.fwd_s for x in c], [x.bwd_s for x in c], plan.send_s, wl.microbatches,
                                   "1f1b", None, [x.sync_s for x in c])
    assert plan.recompute.extra_s == pytest.approx(max(0.0, plan.predicted_iteration_s - free), abs=1e-12)


@pytest.mark.parametrize("n_nodes", [2, 4])  # 4 groups: exhaustive; 8 groups: greedy
def test_topology_crosses_the_slow_link_once_per_node_pair(n_nodes):
    """Two groups per node, 1 GB/s between nodes: the best orders keep a node's groups adjacent."""
    groups = [{"name": f"g{i}", "device": "a100-80gb", "count": 2, "node": f"n{i // 2}"} for i in range(2 * n_nodes)]
    cl = parse_cluster({"groups": groups, "inter_node": {"bandwidth": 1e9}})
    widths = {cl.groups[0].device: 2}
    for order in topology.candidate_orders(cl, widths, 1e8, 16):
        nodes = [g.node for g in order]
        assert sum(a != b for a, b in zip(nodes, nodes[1:])) == n_nodes - 1, nodes


def test_cluster_errors_name_the_field():
    with pytest.raises(ClusterError, match=r"groups\[0\]\.device: unknown device kind 'z100'"):
        parse_cluster({"groups": [{"device": "z100", "count": 8}]})
    with pytest.raises(ClusterError, match=r"groups\[0\]\.count"):
        parse_cluster({"groups": [{"device": "h100", "count": 0}]})
    with pytest.raises(ClusterError, match=r"links\[0\]\.between"):
        parse_cluster({"groups": [{"device": "h100", "count": 8}], "links": [{"between": ["x", "y"], "bandwidth": 1}]})
    assert load_model(os.path.join(ROOT, "configs", "7b.yaml")).n_layers == 32


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "costmodel", "hetero", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_cli_json_keys():
    r = _cli("--cluster", "configs/clusters/mixed_8.yaml", "--config", "configs/1.3b.yaml", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {"stages", "predicted_iteration_s", "baselines", "throughput_tokens_per_s"} <= set(out)
    assert set(out["baselines"]) == {"even_split", "even_split_tuned", "homogeneous"}
    assert all(isinstance(b["predicted_iteration_s"], float) for b in out["baselines"].values())
    assert sum(s["n_layers"] for s in out["stages"]) == 24
    for s in out["stages"]:
        assert {"group", "devices", "layers", "n_layers", "device_kind", "recompute", "stage_time_s", "peak_bytes",
                "memory_bytes"} <= set(s)
        assert s["peak_bytes"] <= s["memory_bytes"]
    assert out["simulated_iteration_s"] == pytest.approx(out["predicted_iteration_s"], rel=1e-6)


def test_cli_errors(tmp_path):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("groups: [\n")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("groups:\n  - {name: g, device: z100, count: 8}\n")
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text("groups:\n  - {name: g, device: {flops: 1.0e+14, memory_gb: 1}, count: 2}\n")
    cases = [("missing.yaml", "configs/7b.yaml", "cannot read"), (str(bad_yaml), "configs/7b.yaml", "not valid YAML"),
             (str(unknown), "configs/7b.yaml", "unknown device kind"), (str(tiny), "configs/13b.yaml", "does not fit"),
             ("configs/clusters/mixed_8.yaml", "missing.yaml", "cannot read")]
    for cluster, config, msg in cases:
        r = _cli("--cluster", cluster, "--config", config)
        assert r.returncode == 2 and r.stdout == "", (cluster, r.stdout)
        assert r.stderr.startswith("error: ") and msg in r.stderr and r.stderr.count("\n") == 1, r.stderr
