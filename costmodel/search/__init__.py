"""Plan search: which strategy each layer runs, per (batch, seq_len) bucket, and cluster planners.

Per-bucket layer plans over a `costmodel.table.CostTable` (per device, model predictions):
  * `paradyse_plan(table, budget)` / `ParaDySeSelector` — ParaDySe's Algorithm 1 (dominated
    choices dropped, fastest if it fits, else the best two-segment plan, else the leanest),
    with a per-(b, s) cache and 5% smoothing;
  * `exact_plan(table, budget)` — the optimum by DP over layers and discretised memory
    (switch costs and the max-over-layers transient included), with a proven lower bound;
  * `milp_plan(table, budget)` — the same optimum by `scipy.optimize.milp` (HiGHS), flow
    formulation, as the cross-check.
Cluster-level planners (self-contained analytical models, see their module docs):
  * `costmodel.search.ilp` — minimal-memory-redundancy ILP over per-operator strategies;
  * `costmodel.search.ptip` — PTIP: DP x TP x PP degrees and layer -> stage assignment as one MIP.
"""
from costmodel.search._common import SearchResult
from costmodel.search.exact import exact_plan, min_bytes_plan, prune_exact
from costmodel.search.milp import milp_plan
from costmodel.search.paradyse import ParaDySeSelector, non_dominated, paradyse_plan

__all__ = ["SearchResult", "paradyse_plan", "ParaDySeSelector", "non_dominated", "exact_plan",
           "milp_plan", "prune_exact", "min_bytes_plan"]
