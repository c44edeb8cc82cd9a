"""The per-bucket plan search: which strategy each layer runs, per (batch, seq_len) bucket.

Over a `costmodel.table.CostTable` (per device, model predictions):
  * `ranked_plans(table, budget)` — the entry point: the optimum, the optimum under tighter
    budgets as fallbacks, the leanest plan last (`Ranking`);
  * `exact_plan(table, budget)` — the optimum (exact pruning, then a label search over
    layers in exact integer bytes);
  * `paradyse_plan(table, budget)` / `ParaDySeSelector` — ParaDySe's Algorithm 1 (dominated
    choices dropped, fastest if it fits, else the best two-segment plan, else the leanest),
    with a per-(b, s) cache and 5% smoothing; `ranked_plans(..., method="paradyse")`;
  * `leanest_plan(table, budget)` — the plan with the fewest bytes.
The test oracles (a DP over layers and discretised memory, HiGHS on the flow formulation)
live in tests/oracles/. The cluster planners (ILP, PTIP, HPH) are in `costmodel.cluster`.
"""
from costmodel.search.arrays import TableArrays, evaluate, table_arrays
from costmodel.search.exact import exact_plan, leanest_plan
from costmodel.search.paradyse import ParaDySeSelector, non_dominated, paradyse_plan
from costmodel.search.prune import prune_exact
from costmodel.search.ranked import METHODS, Ranking, ranked_plans, unlimited_budget
from costmodel.search.result import SearchResult

__all__ = ["ranked_plans", "Ranking", "METHODS", "unlimited_budget", "SearchResult", "exact_plan", "leanest_plan", "paradyse_plan",
           "ParaDySeSelector", "non_dominated", "prune_exact", "TableArrays", "table_arrays", "evaluate"]
