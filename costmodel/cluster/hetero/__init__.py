"""HPH: hybrid pipeline planning for heterogeneous clusters (topology, partition, recompute, simulation).

`plan_hetero(load_cluster(path), load_model(config), Workload(...))` -> `HeteroPlan`; the CLI is
`python -m costmodel hetero --cluster FILE --config MODEL_CONFIG`. Stages are priced by the
shared cost model (`costmodel.cluster.layers`).
"""
from costmodel.cluster.hetero.cluster import Group, HeteroCluster, Link, load_cluster, parse_cluster
from costmodel.cluster.hetero.planner import HeteroPlan, plan_hetero
from costmodel.cluster.hetero.simulate import SimResult, simulate

__all__ = ["HeteroCluster", "Group", "Link", "load_cluster", "parse_cluster", "HeteroPlan", "plan_hetero",
           "SimResult", "simulate"]
