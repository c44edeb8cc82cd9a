"""The contenders of the headline benchmark and the one measurement loop they share.

A contender is a plan per bucket, as a user would configure a trainer:

* `auto`: the cost model's plan per bucket (the first candidate whose program fits the budget
  by XLA's figure, exactly as the trainer's warmup selects it);
* `S@R`: one fixed plan for every bucket, strategy S under remat policy R, as a user of a
  static trainer would choose (`dp@none`, `metp@full`, ...);
* `S@best`: strategy S with, per bucket, the remat policy that measured fastest among those
  that run there (an oracle over remat: the strongest single-strategy contender).

A contender cannot run a bucket's batches when its program there is over the per-device
budget (XLA's figure: on CPU this stands in for out-of-memory) or when its strategy cannot
serve the bucket's shape (e.g. batch-parallel strategies at one row per batch).

Every distinct program (bucket, plan) that any contender runs is run once per batch on the
same batch, in an order rotated every batch, and its time is counted for every contender that
runs it: identical programs are not timed twice. One training state is threaded through the
programs (the timing of a step does not depend on the weights' values).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from sharding.remat import NAMES as REMAT_NAMES

REMATS = REMAT_NAMES  # every static strategy under every policy, as auto may choose
LEANNESS = ("full", "selective", "dots", "none")  # least kept first (max_length tries these first)
STATIC = ("dp", "fsdp", "tp", "tp_sp", "ring", "ulysses", "metp")  # the static contenders' strategies


@dataclass
class Contender:
    """A plan per bucket; `programs[b]` runs bucket b, `why_not[b]` says why a bucket cannot run."""

    name: str
    programs: dict = field(default_factory=dict)  # bucket -> Program
    why_not: dict = field(default_factory=dict)  # bucket -> reason
    plan_ids: dict = field(default_factory=dict)  # bucket -> plan id (also when it cannot run)
    bytes: dict = field(default_factory=dict)  # bucket -> XLA bytes per device (when compiled)
    infeasible: set = field(default_factory=set)  # buckets whose shape the strategy cannot serve
    compile_s: dict = field(default_factory=dict)  # bucket -> seconds its programs there took to compile
    compiled: dict = field(default_factory=dict)  # bucket -> programs compiled there (tried and kept)


def static_plan(trainer, strategy: str, remat: str):
    """Every layer `strategy` under `remat`, written as the planner writes it (the model's
    default policy without a suffix), so identical plans share one program."""
    from sharding.plan import Plan, Run
    default = trainer.config.model.remat
    return Plan((Run(strategy, trainer.config.model.n_layers, None if remat == default else remat),))


def build_static(trainer, strategy: str, remat: str) -> Contender:
    """`strategy@remat` on every bucket: compiled ahead where the strategy can serve the shape."""
    return build_fixed(trainer, f"{strategy}@{remat}", static_plan(trainer, strategy, remat))


def build_fixed(trainer, name: str, plan, bounded: bool = True) -> Contender:
    """One written plan on every bucket: compiled ahead where its strategies can serve the shape
    and run where it fits the budget (anywhere when not `bounded`: a ceiling, not a contender)."""
    from dysejax.errors import PlanError
    c = Contender(name)
    for b in trainer.data.buckets:
        bs = trainer.data.batch_size(b)
        c.plan_ids[b] = plan.id
        try:
            trainer.planner.check(plan, b, bs)
        except PlanError as e:
            c.why_not[b] = f"infeasible: {e}"
            c.infeasible.add(b)
            continue
        program = trainer.programs.get("train", b, bs, plan)
        c.compile_s[b], c.compiled[b] = program.compile_s, 1
        _admit(c, trainer.budget if bounded else None, b, program)
    return c


def build_auto(trainer) -> Contender:
    """The trainer's own `auto` selection per bucket (first candidate within budget by XLA)."""
    from dysejax.errors import PlanError
    c = Contender("auto")
    for b in trainer.data.buckets:
        bs = trainer.data.batch_size(b)
        candidates = trainer.planner.candidates(b)
        try:
            program = trainer.programs.select("train", b, bs, candidates, trainer.budget)
        except PlanError:
            program = trainer.programs.get("train", b, bs, candidates[-1])
        c.plan_ids[b] = program.plan.id
        tried = candidates[:[p.id for p in candidates].index(program.plan.id) + 1]
        compiled = [trainer.programs.get("train", b, bs, p) for p in tried]
        c.compile_s[b], c.compiled[b] = sum(p.compile_s for p in compiled), len(compiled)
        _admit(c, trainer.budget, b, program)
    return c


def _admit(c: Contender, budget, bucket: int, program) -> None:
    c.bytes[bucket] = program.bytes_per_device
    if budget is None or program.bytes_per_device <= budget:
        c.programs[bucket] = program
    else:
        c.why_not[bucket] = f"over budget: {program.bytes_per_device / 2**20:.1f} MiB > {budget / 2**20:.1f} MiB"


@dataclass
class Timings:
    """Measured seconds per (bucket, plan id), one entry per batch of the bucket in batch order
    (the median of the runs on it; `runs` keeps them all), and the batches' real tokens per
    bucket."""

    seconds: dict = field(default_factory=dict)  # (bucket, plan_id) -> [s per batch]
    runs: dict = field(default_factory=dict)  # (bucket, plan_id) -> [[s per run] per batch]
    tokens: dict = field(default_factory=dict)  # bucket -> [real tokens per batch]
    compiles_after_warmup: int = 0


def measure(trainer, contenders: list[Contender], batches: list, repeats: int = 1, progress=print) -> Timings:
    """Run every distinct program of every contender `repeats` times on each batch, after one
    untimed run of each; a batch's sample of a program is the median of its runs there (one step
    on this machine varies by ~10% from run to run, as much as from batch to batch). The
    programs of a batch run in rounds, each round in an order rotated from the last
    (interleaved), so drift in the machine's speed reaches every program alike."""
    import jax
    distinct: dict[int, dict[str, object]] = {}
    for c in contenders:
        for b, program in c.programs.items():
            distinct.setdefault(b, {})[program.plan.id] = program
    state = trainer.state_layout.init(trainer.config.train.seed)
    first = {}
    for pb in batches:
        first.setdefault(pb.bucket, pb)
    for b, pb in first.items():  # warm: first-run effects (allocations, thread pools) untimed
        for program in distinct.get(b, {}).values():
            state, out = program(state, trainer.load_batch(pb, program.plan))
            jax.block_until_ready(out["loss"])
    timings = Timings()
    lowered = trainer.compiles.lowered
    t_start = time.perf_counter()
    turn = 0
    for i, pb in enumerate(batches):
        programs = list(distinct.get(pb.bucket, {}).values())
        runs: dict[str, list[float]] = {}
        for _ in range(repeats):
            k = turn % max(1, len(programs))
            turn += 1
            for program in programs[k:] + programs[:k]:
                batch = trainer.load_batch(pb, program.plan)
                t0 = time.perf_counter()
                state, out = program(state, batch)
                jax.block_until_ready(out["loss"])
                runs.setdefault(program.plan.id, []).append(time.perf_counter() - t0)
        for pid, secs in runs.items():
            timings.seconds.setdefault((pb.bucket, pid), []).append(statistics.median(secs))
            timings.runs.setdefault((pb.bucket, pid), []).append(secs)
        timings.tokens.setdefault(pb.bucket, []).append(pb.real_tokens)
        if progress:
            progress(f"batch {i + 1}/{len(batches)} (bucket {pb.bucket}, {len(programs)} programs x {repeats}) "
                     f"done, {time.perf_counter() - t_start:.0f} s")
    timings.compiles_after_warmup = trainer.compiles.lowered - lowered
    return timings


def oracle_over_remat(strategy: str, statics: dict[str, Contender], timings: Timings, buckets) -> Contender:
    """`strategy@best`: per bucket the remat policy whose program measured fastest there."""
    c = Contender(f"{strategy}@best")
    for b in buckets:
        options = [statics[f"{strategy}@{r}"] for r in REMATS]
        runnable = [o for o in options if b in o.programs and (b, o.programs[b].plan.id) in timings.seconds]
        c.compile_s[b] = sum(o.compile_s.get(b) or 0.0 for o in options)  # it tries every policy
        c.compiled[b] = sum(o.compiled.get(b, 0) for o in options)
        if runnable:
            best = min(runnable, key=lambda o: statistics.median(timings.seconds[(b, o.programs[b].plan.id)]))
            c.programs[b], c.plan_ids[b], c.bytes[b] = best.programs[b], best.plan_ids[b], best.bytes[b]
        else:
            leanest = min((o for o in options if b in o.bytes), key=lambda o: o.bytes[b], default=options[0])
            c.plan_ids[b] = leanest.plan_ids.get(b, "")
            if b in leanest.bytes:
                c.bytes[b] = leanest.bytes[b]
            c.why_not[b] = leanest.why_not.get(b, "not measured")
            if all(b in o.infeasible for o in options):
                c.infeasible.add(b)
    return c


def tally(c: Contender, timings: Timings, bucket_steps: dict[int, int], epoch_steps: dict[int, int]) -> dict:
    """A contender's figures (JSON-able). Per bucket: the step-time samples with their median and
    range, and the seconds its programs took to compile. Per epoch: sample k is the sum over
    buckets of the epoch's batches x the k-th measured step time there (so contenders' epoch
    samples are measured on the same batches); None when some bucket of the epoch cannot run."""
    per_bucket = {}
    samples = []
    for b, n in bucket_steps.items():
        row = {"plan": c.plan_ids.get(b), "bytes_per_device": c.bytes.get(b), "steps": n,
               "epoch_steps": epoch_steps.get(b, 0), "runs": b in c.programs, "why_not": c.why_not.get(b),
               "compile_s": c.compile_s.get(b), "programs_compiled": c.compiled.get(b, 0)}
        secs = timings.seconds.get((b, c.programs[b].plan.id), []) if b in c.programs else []
        if secs:
            tok = sum(timings.tokens.get(b, []))
            row.update(seconds=secs, runs_s=timings.runs.get((b, c.programs[b].plan.id)),
                       tokens_per_s=tok / sum(secs), step_s=statistics.median(secs),
                       step_s_range=[min(secs), max(secs)])
            samples.append((epoch_steps.get(b, 0), secs))
        per_bucket[str(b)] = row
    cannot = sum(epoch_steps.get(b, 0) for b in bucket_steps if b not in c.programs)
    epochs = None
    if not cannot and samples:
        k = min(len(secs) for _, secs in samples)
        epochs = [sum(n * secs[i] for n, secs in samples) for i in range(k)]
    compile_s = sum(v for v in c.compile_s.values() if v)
    return {"epoch_s": statistics.median(epochs) if epochs else None, "epoch_samples_s": epochs,
            "epoch_s_range": [min(epochs), max(epochs)] if epochs else None, "epoch_steps_cannot_run": cannot,
            "programs_compiled": sum(c.compiled.values()), "compile_s": compile_s, "per_bucket": per_bucket}


def fits_at(trainer, plan, seq_len: int) -> bool:
    """Whether `plan` can serve length `seq_len` (the pipeline's batch size there) within the
    budget by XLA's figure (compiled, not run)."""
    from dysejax.errors import PlanError
    bs = trainer.data.batch_size(seq_len)
    try:
        trainer.planner.check(plan, seq_len, bs)
    except PlanError:
        return False
    return trainer.budget is None or trainer.programs.get("train", seq_len, bs, plan).bytes_per_device <= trainer.budget


def auto_fits_at(trainer, seq_len: int) -> bool:
    """Whether `auto` finds a plan within the budget at `seq_len` (by XLA's figure)."""
    from dysejax.errors import PlanError
    bs = trainer.data.batch_size(seq_len)
    try:
        trainer.programs.select("train", seq_len, bs, list(trainer.planner.plan(seq_len, bs).candidates),
                                trainer.budget)
        return True
    except (PlanError, ValueError):
        return False


def strategy_max_lengths(trainer, strategy: str, start: int, cap: int) -> dict[str, tuple[int, bool]]:
    """{remat: (max trainable length, capped)} of `strategy` as one static plan, and under
    "best" the longest of them (XLA's figure against the trainer's budget). Leanest policy
    first: the others are searched only where they could beat it."""
    out, best, capped = {}, 0, False
    for r in sorted(REMATS, key=LEANNESS.index):
        plan = static_plan(trainer, strategy, r)
        fits = lambda n, plan=plan: fits_at(trainer, plan, n)  # noqa: E731
        if best and (capped or not fits(2 * best)):  # the next length on the grid
            continue
        out[r] = max_length(fits, start, cap)
        if out[r][0] > best:
            best, capped = out[r]
    out["best"] = (best, capped)
    return out


def max_length(fits, start: int, cap: int, unit: int = 256) -> tuple[int, bool]:
    """(largest power-of-two multiple of `start` <= cap that `fits`, or below `start` the
    largest start / 2^k >= unit; whether the search stopped at the cap: then a lower bound).
    Memory grows with length, so the search stops at the first length that does not fit."""
    if not fits(start):
        s = start // 2
        while s >= unit and not fits(s):
            s //= 2
        return (s if s >= unit else 0), False
    best, s = start, 2 * start
    while s <= cap and fits(s):
        best, s = s, 2 * s
    return best, s > cap
