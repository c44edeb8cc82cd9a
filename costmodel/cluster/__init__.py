"""Cluster planners, priced through the same shape and cost table as `parallel.plan: auto`.

  * `workload` — what they are asked about: `Model` (a config's layer `BlockSpec`, layers,
    vocabulary), `Workload` (sequence length, micro-batch, global batch), `Cluster` (nodes of
    devices of one `costmodel.hardware` profile);
  * `layers` — what they read from the cost model: a group of devices' layer options
    (`costmodel.table.cost_table`, `costmodel.memory.layer_memory`);
  * `ilp` — minimal-memory-redundancy strategy generation (per-layer strategies within a time
    budget, states replicated or sharded across nodes) vs Megatron-LM;
  * `ptip` — PTIP: DP x TP x PP degrees and the layer split as one MIP vs Megatron-LM;
  * `hetero` — HPH: pipelines over heterogeneous clusters (topology, partition, recompute,
    simulation);
  * `pipeline` — the pipeline cost terms they share (bubbles, in-flight micro-batches,
    transfers, schedules).
All figures are model predictions (simulated), not measurements.
"""
from costmodel.cluster.workload import Cluster, ClusterError, Model, Workload, load_model

__all__ = ["Cluster", "ClusterError", "Model", "Workload", "load_model"]
