"""#26 item 4: the pure rule of new-node validation (`decisions.new_nodes`)."""

from __future__ import annotations

import datetime

import pytest

from gpuhealth_operator.decisions import new_nodes, repair

POLICY = "2026-11-26T10:00:00Z"
NOW = datetime.datetime(2026, 11, 26, 12, 0, tzinfo=datetime.UTC)
Step = new_nodes.Step


def facts(**changed: bool) -> new_nodes.Facts:
    base = {
        "wanted": True,
        "dry_run": False,
        "new": True,
        "tainted": False,
        "failed": False,
        "started": False,
        "busy": False,
    }
    base.update(changed)
    return new_nodes.Facts(**base)


def test_a_node_created_after_the_policy_is_new() -> None:
    assert new_nodes.is_new("2026-11-26T10:00:01Z", POLICY, validated=False)


@pytest.mark.parametrize(
    ("node", "policy", "validated"),
    [
        ("2026-11-26T09:59:59Z", POLICY, False),  # there before the policy: never new
        ("2026-11-26T10:00:00Z", POLICY, False),  # the same second: not later
        ("2026-11-26T10:00:01Z", POLICY, True),  # validated once: never again
        ("", POLICY, False),  # unknown times are never new
        ("2026-11-26T10:00:01Z", "", False),
    ],
)
def test_existing_validated_or_unknown_nodes_are_not_new(node: str, policy: str, validated: bool) -> None:
    assert not new_nodes.is_new(node, policy, validated=validated)


def test_a_new_node_is_tainted_first_then_its_job_started_then_observed() -> None:
    assert new_nodes.plan(facts()) is Step.TAINT
    assert new_nodes.plan(facts(tainted=True)) is Step.START
    assert new_nodes.plan(facts(tainted=True, started=True)) is Step.OBSERVE


def test_a_busy_node_is_in_service_not_new() -> None:
    assert new_nodes.plan(facts(busy=True)) is Step.NOTHING


def test_dry_run_only_says_so() -> None:
    assert new_nodes.plan(facts(dry_run=True)) is Step.DRY_RUN


@pytest.mark.parametrize(
    "changed",
    [{"wanted": False}, {"new": False}, {"dry_run": True}],
    ids=["deselected-excluded-or-policy-gone", "no-longer-new", "dry-run"],
)
def test_a_tainted_node_that_no_longer_qualifies_is_cancelled(changed: dict[str, bool]) -> None:
    assert new_nodes.plan(facts(tainted=True, started=True, **changed)) is Step.CANCEL


def test_a_failed_node_is_left_to_a_human() -> None:
    assert new_nodes.plan(facts(tainted=True, failed=True, new=False)) is Step.NOTHING
    assert new_nodes.plan(facts(tainted=False, failed=True, new=False)) is Step.NOTHING


def test_nodes_of_no_policy_with_new_nodes_are_left_alone() -> None:
    assert new_nodes.plan(facts(wanted=False, new=False)) is Step.NOTHING


def test_job_passes_fails_or_times_out() -> None:
    started = "2026-11-26T11:50:00Z"
    ok = repair.JobView(repair.JobPhase.SUCCEEDED)
    assert new_nodes.observe(ok, "j", started, 900, NOW).outcome is new_nodes.Outcome.PASSED
    failed = repair.JobView(repair.JobPhase.FAILED, message="BackoffLimitExceeded")
    seen = new_nodes.observe(failed, "j", started, 900, NOW)
    assert seen.outcome is new_nodes.Outcome.FAILED
    assert "BackoffLimitExceeded" in seen.message
    running = repair.JobView(repair.JobPhase.ACTIVE)
    assert new_nodes.observe(running, "j", started, 900, NOW).outcome is new_nodes.Outcome.WAIT
    late = new_nodes.observe(running, "j", started, 600, NOW)
    assert late.outcome is new_nodes.Outcome.FAILED
    assert "600s" in late.message


def test_job_name_is_deterministic_and_short() -> None:
    long = "a" * 200 + ".example.com"
    assert new_nodes.job_name(long) == new_nodes.job_name(long)
    assert len(new_nodes.job_name(long)) <= 63
    assert new_nodes.job_name("gpu-node-1").endswith("-new")
    assert new_nodes.job_name("gpu-node-1") != new_nodes.job_name("gpu-node-2")
