"""HPH: hybrid pipeline planning for heterogeneous clusters (topology, partition, recompute, simulation).

`plan_hetero(load_cluster(path), load_model(config), Workload(...))` -> `HeteroPlan`; the CLI is
`python -m costmodel hetero --cluster FILE --config MODEL_CONFIG`.
"""
from costmodel.hetero.cluster import Cluster, ClusterError, Group, Link, load_cluster, parse_cluster
from costmodel.hetero.planner import HeteroPlan, plan_hetero
from costmodel.hetero.simulate import SimResult, simulate
from costmodel.hetero.workload import Workload, load_model

__all__ = ["Cluster", "ClusterError", "Group", "Link", "load_cluster", "parse_cluster", "HeteroPlan", "plan_hetero",
           "SimResult", "simulate", "Workload", "load_model"]
