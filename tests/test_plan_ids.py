"""One plan syntax: the id every report prints (`ring:3@selective,metp:1@full`) is read back by
the one parser (`sharding.plan.parse_plan`) wherever a plan is written."""
import pytest

from sharding.plan import Plan, PlanSyntaxError, Run, parse_plan
from dysejax.plans import plan_entries

KNOWN = ["dp", "fsdp", "tp", "tp_sp", "ring", "ulysses", "metp"]


@pytest.mark.parametrize("text, runs", [
    ("ring", [("ring", 4, None)]),
    ("ring@full", [("ring", 4, "full")]),
    ("ring:4", [("ring", 4, None)]),
    ("ring:3@selective,metp:1@full", [("ring", 3, "selective"), ("metp", 1, "full")]),
    (" tp_sp:3, metp:1@dots ", [("tp_sp", 3, None), ("metp", 1, "dots")]),
])
def test_plan_ids_parse(text, runs):
    plan = parse_plan(text, 4, KNOWN)
    assert plan == Plan(tuple(Run(*r) for r in runs))
    assert parse_plan(plan.id, 4, KNOWN) == plan  # the id round-trips
    assert parse_plan(plan.as_data(), 4, KNOWN) == plan  # and so does the written form


FORMAT = ("is not a plan: write STRATEGY, STRATEGY@REMAT or runs STRATEGY:LAYERS[@REMAT] joined by commas, "
          "e.g. tp_sp:3@selective,metp:1@full")


@pytest.mark.parametrize("text, message", [
    ("ring:x", f"'ring:x' {FORMAT}"),
    ("ring,metp", f"'ring,metp' {FORMAT}"),
    ("ring:3@,metp:1", f"'ring:3@,metp:1' {FORMAT}"),
    ("", f"'' {FORMAT}"),
    ("ring@bogus", "remat must be one of none, selective, dots, full, got 'bogus' in 'ring@bogus'"),
    ("ring:0,metp:4", "layer count must be a positive integer, got '0' in 'ring:0,metp:4'"),
    ("ring:3,metp:2", "runs cover 5 layers but the model has 4 (model.n_layers)"),
    ("foo:2,ring:2", "unknown strategy 'foo' (known: dp, fsdp, tp, tp_sp, ring, ulysses, metp)"),
])
def test_bad_plan_ids_name_the_problem(text, message):
    with pytest.raises(PlanSyntaxError) as e:
        parse_plan(text, 4, KNOWN)
    assert str(e.value) == f"parallel.plan: {message}"


def test_per_bucket_plans_take_ids():
    entries = plan_entries({64: "ring:3@selective,metp:1@full", "default": "auto"}, [64, 128], 4, KNOWN)
    assert entries[64].id == "ring:3@selective,metp:1@full" and entries[128] == "auto"
