"""Staleness is timed by the operator's clock: when it saw the agent's lastHeartbeatTime change."""

import asyncio
import copy
import datetime
from collections.abc import Mapping
from typing import Any, Final

import pytest

import gpunode_facts
import handling
import memory_fleet
from gpuhealth_api import keys
from gpuhealth_operator.runtime import handlers
from gpuhealth_operator.state import cache

T0 = memory_fleet.T0


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
        assert record.report_age(at(30)) == 30


def test_only_a_new_heartbeat_moves_the_clock_not_our_own_status_writes() -> None:
    nodes = cache.ClusterCache()
    nodes.put_gpunode(body(1, "2027-01-01T00:00:00Z"), now=at(0))
    # The operator's own status write (health, action) keeps the agent's heartbeat as it was.
    written = nodes.put_gpunode(body(2, "2027-01-01T00:00:00Z", health="Healthy"), now=at(100))
    assert written.report_seen_at == at(0)
    assert written.report_age(at(200)) == 200
    reported = nodes.put_gpunode(body(3, "2027-01-01T00:01:00Z"), now=at(210))
    assert reported.report_seen_at == at(210)


def test_an_older_resource_version_changes_nothing() -> None:
    nodes = cache.ClusterCache()
    nodes.put_gpunode(body(5, "2027-01-01T00:00:00Z"), now=at(0))
    kept = nodes.put_gpunode(body(4, "2027-01-01T00:05:00Z"), now=at(50))
    assert kept.report_seen_at == at(0)


def test_a_clock_that_moved_backwards_is_no_negative_age() -> None:
    record = cache.ClusterCache().put_gpunode(body(1, "2027-01-01T00:00:00Z"), now=at(100))
    assert record.report_age(at(0)) == 0


def test_after_a_restart_an_agent_already_judged_stale_stays_stale() -> None:
    """The previous operator's AgentStale condition (its clock) says since when; old facts stay old."""
    stale = {"type": "AgentStale", "status": "True", "lastTransitionTime": "2026-01-01T11:00:00Z"}
    record = cache.ClusterCache().put_gpunode(body(1, "2026-01-01T10:57:00Z", conditions=[stale]), now=at(0))
    assert record.report_age(at(0)) == 3600 + 180


def test_after_a_restart_a_fresh_agent_is_timed_from_the_first_sighting() -> None:
    fresh = {"type": "AgentStale", "status": "False", "lastTransitionTime": "2026-01-01T11:00:00Z"}
    record = cache.ClusterCache().put_gpunode(body(1, "2026-01-01T10:00:00Z", conditions=[fresh]), now=at(0))
    assert record.report_age(at(0)) == 0


# Issue 24, 9: the agent's clock decides no window. An agent whose clock is 10 or 20 minutes slow (or
# ahead) stamps its reports (lastHeartbeatTime, observedTime) that far off; the operator times forSeconds,
# the straggler window and the budget queue by its own clock of receipt.

SKEWS = [-1200.0, -600.0, 600.0]
"""The agent's clock against the operator's: 20 and 10 minutes slow, 10 minutes ahead."""


class Fleet(memory_fleet.MemoryFleet):
    """One policy with one rule over nodes whose agents' clocks are off."""

    def __init__(self, rule: dict[str, Any]) -> None:
        super().__init__([rule])

    async def report(
        self, name: str, skew: float, gpu: Mapping[str, Any], observed: datetime.datetime
    ) -> None:
        """A report sent now, stamped by an agent clock `skew` seconds off; `observed`: the operator's time
        of the fact, stamped by the agent's clock too."""
        agent_now = self.now + datetime.timedelta(seconds=skew)
        status = gpunode_facts.agent_status(
            heartbeat=gpunode_facts.rfc3339(agent_now),
            heartbeat_seconds=60,
            observed=gpunode_facts.rfc3339(observed + datetime.timedelta(seconds=skew)),
            overrides=dict.fromkeys(range(8), gpu),
        )
        await self.deliver(name, status)


HOT: Final = {"temperatureCelsius": 95, "clockEventReasons": ["HwThermalSlowdown"]}


@pytest.mark.parametrize("skew", SKEWS)
def test_one_sample_of_a_sustained_fault_is_not_a_cordon_whatever_the_agents_clock(skew: float) -> None:
    """forSeconds 300 counts from when the operator received the first report showing the fault."""

    async def scenario() -> None:
        rule = {"name": "hot", "condition": "ThermalThrottled", "action": "Cordon", "forSeconds": 300}
        fleet = Fleet(rule)
        await fleet.start(["n"])
        first = fleet.now
        await fleet.report("n", skew, HOT, first)
        await fleet.tick(1)
        assert not fleet.cordoned("n"), "one sample, not 300 s of the fault"
        for _ in range(4):  # a report a minute, the fault held, the agent's observedTime unchanged
            await fleet.tick(59)
            await fleet.report("n", skew, HOT, first)
            await fleet.tick(1)
            assert not fleet.cordoned("n"), f"{(fleet.now - first).total_seconds():g} s of the fault"
        await fleet.tick(60)
        assert fleet.cordoned("n"), "300 s of the fault by the operator's clock"

    asyncio.run(scenario())


@pytest.mark.parametrize("skew", SKEWS)
def test_a_real_straggler_is_labelled_after_forseconds_whatever_its_agents_clock(skew: float) -> None:
    """The straggler window holds the samples the operator received in the last forSeconds."""

    async def scenario() -> None:
        rule = {"name": "slow", "condition": "Straggler", "action": "Label", "forSeconds": 300}
        fleet = Fleet(rule)
        names = ["slow", *(f"peer{i}" for i in range(5))]
        await fleet.start(names)
        slow = {"smClockMHz": 1400}
        labelled_at = None
        start = fleet.now
        for _ in range(12):
            for name in names:
                await fleet.report(
                    name, skew if name == "slow" else 0.0, slow if name == "slow" else {}, fleet.now
                )
            await fleet.tick(60)
            if labelled_at is None and fleet.labels("slow").get(keys.STRAGGLER_LABEL):
                labelled_at = (fleet.now - start).total_seconds()
        assert labelled_at is not None, "a real straggler is labelled"
        # Its z-scores count from its third report (120 s, `stragglers.settled`); the rule fires once
        # they span forSeconds (the report at 420 s), at the timer's next tick.
        assert 300 <= labelled_at <= 480, f"labelled after {labelled_at:g} s: forSeconds is 300 s"
        assert not any(fleet.labels(n).get(keys.STRAGGLER_LABEL) for n in names[1:])

    asyncio.run(scenario())


def test_the_budget_queue_serves_the_fault_received_first_not_the_one_stamped_earliest() -> None:
    """Two nodes wait for one place in the budget: the one whose fault the operator received first goes
    first, though the other's agent, 20 minutes slow, stamped its fault earlier."""

    async def scenario() -> None:
        rule = {"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}
        fleet = Fleet(rule)
        fleet.policies[0]["spec"] |= {"maxUnavailable": 1, "breaker": {"maxNewUnhealthy": "100%"}}
        await fleet.start(["held", "first", "second"])
        for name in ("held", "first", "second"):
            await fleet.report(name, 0.0, {}, fleet.now)
        human = copy.deepcopy(fleet.cluster.nodes["held"])
        human["spec"]["unschedulable"] = True  # a human's cordon takes the budget's one place
        fleet.cluster.put_node(human)
        await handling.handle(
            handlers.on_node, {"type": "MODIFIED", "object": copy.deepcopy(human)}, fleet.ctx
        )
        ecc = {"ecc": {"uncorrectedVolatile": 2}}
        await fleet.tick(10)
        await fleet.report("first", 0.0, ecc, fleet.now)
        await fleet.tick(10)
        await fleet.report("second", -1200.0, ecc, fleet.now)
        await fleet.tick(10)
        assert not fleet.cordoned("first") and not fleet.cordoned("second"), "both wait for the budget"
        human["spec"]["unschedulable"] = False
        fleet.cluster.put_node(copy.deepcopy(human))
        await handling.handle(
            handlers.on_node, {"type": "MODIFIED", "object": copy.deepcopy(human)}, fleet.ctx
        )
        await fleet.tick(1)
        assert (fleet.cordoned("first"), fleet.cordoned("second")) == (True, False)

    asyncio.run(scenario())
