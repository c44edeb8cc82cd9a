"""Minimal-memory-redundancy strategy generation (FITEE 2025), priced by the shared cost model.

Every node of a `Cluster` (d nodes of m devices) runs the same per-layer plan over its m devices:
one option per layer (a registered strategy x a remat policy) from the node's cost table
(`costmodel.cluster.layers`, the tables `parallel.plan: auto` searches). The model states are
laid out across nodes one of two ways:

  rep    each node holds the states once, split over its m devices (unified storage), and the
         nodes replicate them (plain data parallelism, Megatron's DP): the node's table, plus a
         ring all-reduce of the gradients across the d nodes once per iteration;
  shard  the states split over all n = d x m devices: dysejax's own layout on the mesh
         {data: d, model: m} (batch strategies split the batch over all n devices, model
         strategies work over the node's m), priced by that mesh's table (its collectives at
         the inter-node bandwidth); the gradients are reduce-scattered inside the layers.

Per device, a plan's bytes are the paper's redundant memory (copies of what other devices hold)
plus the model's unique share that every plan pays alike, so the ILP minimises the bytes:

    minimise   bytes(plan)       (base + sum stored + the largest transient, the table's)
    subject to iteration(plan) <= (1 + time_slack) x reference
    iteration  = micro-steps x (plan time - the layers' update) + the layers' update + sync
    micro-steps = global_batch / (micro_batch x d)

per layout. The paper solves it as an ILP (one-hot option per operator, edge variables for
resharding); over a cost table the same problem is solved exactly by `leanest_within`: the
least byte budget under which the fastest plan (`costmodel.search.exact_plan`) meets the time
bound, by bisection (milliseconds, where HiGHS on the flow formulation takes 10-60 s on these
tables, whose interchangeable layers make it highly symmetric; tests/oracles/milp.py
`table_milp(minimise="bytes")` is the cross-check). The reference is the fastest plan that
fits the device (found by `costmodel.search.exact_plan` on each layout's table) or
Megatron-LM's. Megatron-LM's standard configuration: every layer `tp`
(TP over the node), `rep` across nodes (DP), no remat. Like for like: both sides are priced by
the same tables, with the model config's attention (blockwise = flash-style on both sides).
All figures are model predictions (simulated), not measurements.
"""
from __future__ import annotations

import time as _time
from dataclasses import dataclass, field
from typing import Optional, Sequence

from costmodel.cluster.layers import GroupCosts, group_costs
from costmodel.cluster.megatron import tensor_parallel
from costmodel.cluster.workload import Cluster, ClusterError, Model, Workload
from costmodel.time import TimeCoefficients, collective_time
from costmodel.search import SearchResult, exact_plan, leanest_plan, unlimited_budget
from sharding.plan import Plan, compress

__all__ = ["INTER", "Layout", "layouts", "PlanCost", "RedundancyResult", "min_redundancy_plan", "megatron_plan",
           "leanest_within"]

INTER = ("rep", "shard")


def leanest_within(table, max_time_s: float, rel_tol: float = 1e-9) -> Optional[SearchResult]:
    """The plan of `table` with the fewest bytes whose time is at most `max_time_s` (None: no
    plan is that fast): the least budget B whose fastest plan meets the time, by bisection on B
    (exact: the fastest plan within B is a non-increasing step function of B)."""
    ok = lambda r: r.fits and r.time_s <= max_time_s  # noqa: E731
    lean = leanest_plan(table, unlimited_budget(table))
    lo = exact_plan(table, lean.bytes)  # the fastest of the leanest plans
    if ok(lo):
        return lo
    best = exact_plan(table, unlimited_budget(table))
    if best.time_s > max_time_s:
        return None
    lo_b, hi_b = lean.bytes, best.bytes  # the answer's bytes lie in (lo_b, hi_b]
    while hi_b - lo_b > max(1.0, rel_tol * hi_b):
        r = exact_plan(table, (lo_b + hi_b) / 2)
        if ok(r):
            best, hi_b = r, r.bytes
        else:
            lo_b = (lo_b + hi_b) / 2
    return best


@dataclass(frozen=True)
class Layout:
    """One way of laying the states across nodes: its cost table and iteration terms."""

    inter: str
    costs: GroupCosts
    micro_steps: float
    extra_s: float  # iteration = micro_steps x plan time + extra_s

    def iteration_s(self, per_layer: Sequence[int]) -> float:
        return self.micro_steps * self.costs.table.plan_time(per_layer) + self.extra_s

    def plan_time_bound(self, iteration_s: float) -> float:
        """The largest plan time (the table's, per micro-step) within this iteration time."""
        return (iteration_s - self.extra_s) / self.micro_steps


def layouts(model: Model, wl: Workload, cl: Cluster, inter: Sequence[str] = INTER,
            remats: Sequence[str] = ("none",)) -> dict:
    """{inter: Layout} for the state layouts asked for (one node: `rep` only, `shard` is the same)."""
    d, m, prof = cl.n_nodes, cl.devices_per_node, cl.profile
    steps = wl.global_batch / (wl.micro_batch * d)
    out = {}
    for mode in inter:
        if mode not in INTER:
            raise ValueError(f"unknown state layout {mode!r} (known: {', '.join(INTER)})")
        if mode == "shard" and d == 1:
            continue
        mesh = m if mode == "rep" else {"data": d, "model": m}
        gc = group_costs(model, prof, mesh, wl.micro_batch * (1 if mode == "rep" else d), wl.seq_len, remats=remats)
        if gc is None:
            continue
        update = model.n_layers * gc.update_time_s
        sync = 0.0
        if mode == "rep":
            grads = model.n_layers * float(gc.grad_bytes.max()) + gc.ends_grad_bytes
            # one device of each node per ring (the nodes' replicas of a shard): the NICs' pace
            sync = collective_time(TimeCoefficients.from_profile(prof), "all-reduce", grads, d, 1)
        out[mode] = Layout(mode, gc, steps, sync - (steps - 1) * update)
    if not out:
        raise ClusterError(f"no strategy can serve {model.name} at micro-batch {wl.micro_batch} x {wl.seq_len} "
                           f"on nodes of {m}")
    return out


@dataclass(frozen=True)
class PlanCost:
    """Per-device bytes and iteration time of a plan on a layout (model predictions)."""

    bytes: float
    iter_time_s: float
    tokens_per_s: float
    fits: bool


def _cost(lay: Layout, per_layer, wl: Workload, cl: Cluster) -> PlanCost:
    b = float(lay.costs.table.plan_bytes(per_layer))
    t = lay.iteration_s(per_layer)
    return PlanCost(bytes=b, iter_time_s=t, tokens_per_s=wl.tokens / t, fits=b <= cl.memory_limit)


def megatron_plan(model: Model, lay: Layout) -> list:
    """Megatron-LM's standard configuration on a layout: every layer tensor-parallel without remat."""
    tp = tensor_parallel()
    k = lay.costs.index(tp, "none")
    if k is None:
        raise ClusterError(f"{tp} cannot serve {model.name} on this node (Megatron's configuration)")
    return [k] * model.n_layers


@dataclass
class RedundancyResult:
    """The least-bytes plan within the time budget, and Megatron-LM's configuration priced alike."""

    plan: Plan  # what every node runs, layer by layer
    inter: str  # how the states are laid out across nodes
    cost: PlanCost
    megatron: PlanCost
    reference_time_s: float
    time_budget_s: float
    status: str
    search_s: float
    info: dict = field(default_factory=dict)

    @property
    def memory_saving(self) -> float:
        """1 - bytes / Megatron's bytes (per device, model prediction)."""
        return 1.0 - self.cost.bytes / self.megatron.bytes

    def summary(self) -> str:
        return f"{self.plan.id} ({self.inter})"


def _plan(lay: Layout, per_layer) -> Plan:
    choices = [lay.costs.choices[i] for i in per_layer]
    return compress([c.strategy for c in choices], [None if c.remat == "none" else c.remat for c in choices])


def min_redundancy_plan(model: Model, wl: Workload, cl: Cluster, *, time_slack: float = 0.05,
                        reference: str = "fastest", inter: Sequence[str] = INTER,
                        remats: Sequence[str] = ("none",)) -> RedundancyResult:
    """The per-layer plan and state layout with the fewest bytes per device within
    (1 + time_slack) x the reference iteration time (reference: 'fastest' = the fastest plan
    that fits the device over the layouts, 'megatron' = Megatron's configuration). inter: the
    state layouts allowed (('rep',) compares like for like with Megatron's data parallelism);
    remats: the remat policies each layer may use."""
    t0 = _time.perf_counter()
    lays = layouts(model, wl, cl, inter, remats)
    rep = lays.get("rep") or layouts(model, wl, cl, ("rep",), ("none",))["rep"]
    mega_layers = megatron_plan(model, rep)
    mega = _cost(rep, mega_layers, wl, cl)
    info = {}
    if reference == "megatron":
        ref = mega.iter_time_s
    elif reference == "fastest":
        fastest = {}
        for mode, lay in lays.items():
            r = exact_plan(lay.costs.table, cl.memory_limit)
            if not r.fits:  # nothing fits: the fastest plan at all
                r = exact_plan(lay.costs.table, unlimited_budget(lay.costs.table))
            fastest[mode] = (r.fits and _cost(lay, r.per_layer, wl, cl).fits, lay.iteration_s(r.per_layer), r)
        fits_any = any(f for f, _, _ in fastest.values())
        mode, (_, ref, r) = min(((k, v) for k, v in fastest.items() if v[0] or not fits_any), key=lambda kv: kv[1][1])
        info = {"fastest": _cost(lays[mode], r.per_layer, wl, cl), "fastest_plan": _plan(lays[mode], r.per_layer).id,
                "fastest_inter": mode}
    else:
        raise ValueError(f"reference must be 'fastest' or 'megatron', got {reference!r}")
    budget = (1.0 + time_slack) * ref
    best, status = None, "no plan within the time budget"
    for mode, lay in lays.items():
        r = leanest_within(lay.costs.table, lay.plan_time_bound(budget) * (1 + 1e-9))
        if r is None:
            continue
        cost = _cost(lay, r.per_layer, wl, cl)
        if best is None or (cost.bytes, cost.iter_time_s) < (best[2].bytes, best[2].iter_time_s):
            best, status = (mode, list(r.per_layer), cost), "optimal" if r.optimal else "not proven"
    if best is None:  # no plan within the budget (only when the reference is Megatron's on no layout here)
        lean = leanest_plan(rep.costs.table, cl.memory_limit)
        best = ("rep", list(lean.per_layer), _cost(rep, lean.per_layer, wl, cl))
    mode, per_layer, cost = best
    return RedundancyResult(plan=_plan(lays.get(mode, rep), per_layer), inter=mode, cost=cost, megatron=mega,
                            reference_time_s=ref, time_budget_s=budget, status=status,
                            search_s=_time.perf_counter() - t0, info=info)
