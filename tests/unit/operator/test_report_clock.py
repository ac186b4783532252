"""Staleness is timed by the operator's clock: when it saw the agent's lastHeartbeatTime change."""

import datetime

from gpuhealth_operator import cache, reconciler

T0 = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)


def body(resource_version: int, heartbeat: str | None, **status: object) -> dict:
    agent = {"lastHeartbeatTime": heartbeat, "heartbeatSeconds": 60} if heartbeat else None
    return {
        "metadata": {"name": "n", "resourceVersion": str(resource_version)},
        "status": {**({"agent": agent} if agent else {}), **status},
    }


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def test_the_first_sighting_starts_the_clock_even_for_an_old_or_future_heartbeat() -> None:
    for heartbeat in ("2020-01-01T00:00:00Z", "2027-01-01T00:00:00Z"):
        nodes = cache.ClusterCache()
        record = nodes.put_gpunode(body(1, heartbeat), now=at(0))
        assert record.report_seen_at == at(0)
        assert reconciler.report_age(record, at(30)) == 30


def test_only_a_new_heartbeat_moves_the_clock_not_our_own_status_writes() -> None:
    nodes = cache.ClusterCache()
    nodes.put_gpunode(body(1, "2027-01-01T00:00:00Z"), now=at(0))
    # The operator's own status write (health, action) keeps the agent's heartbeat as it was.
    written = nodes.put_gpunode(body(2, "2027-01-01T00:00:00Z", health="Healthy"), now=at(100))
    assert written.report_seen_at == at(0)
    assert reconciler.report_age(written, at(200)) == 200
    reported = nodes.put_gpunode(body(3, "2027-01-01T00:01:00Z"), now=at(210))
    assert reported.report_seen_at == at(210)


def test_an_older_resource_version_changes_nothing() -> None:
    nodes = cache.ClusterCache()
    nodes.put_gpunode(body(5, "2027-01-01T00:00:00Z"), now=at(0))
    kept = nodes.put_gpunode(body(4, "2027-01-01T00:05:00Z"), now=at(50))
    assert kept.report_seen_at == at(0)


def test_a_clock_that_moved_backwards_is_no_negative_age() -> None:
    record = cache.ClusterCache().put_gpunode(body(1, "2027-01-01T00:00:00Z"), now=at(100))
    assert reconciler.report_age(record, at(0)) == 0


def test_after_a_restart_an_agent_already_judged_stale_stays_stale() -> None:
    """The previous operator's AgentStale condition (its clock) says since when; old facts stay old."""
    stale = {"type": "AgentStale", "status": "True", "lastTransitionTime": "2026-01-01T11:00:00Z"}
    record = cache.ClusterCache().put_gpunode(body(1, "2026-01-01T10:57:00Z", conditions=[stale]), now=at(0))
    assert reconciler.report_age(record, at(0)) == 3600 + 180


def test_after_a_restart_a_fresh_agent_is_timed_from_the_first_sighting() -> None:
    fresh = {"type": "AgentStale", "status": "False", "lastTransitionTime": "2026-01-01T11:00:00Z"}
    record = cache.ClusterCache().put_gpunode(body(1, "2026-01-01T10:00:00Z", conditions=[fresh]), now=at(0))
    assert reconciler.report_age(record, at(0)) == 0
