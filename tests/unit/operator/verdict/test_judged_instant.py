"""A verdict is never judged at an instant earlier than what it reads.

The timer judges every due node at one instant, then acts on them one after another; under load
the acting takes seconds. A fault that lands meanwhile is cordoned and tainted by its own watch
event, which writes the node's conditions at the clock's later instant. Judged again at the
timer's earlier instant, those conditions had been held for a negative time: no rule fired, and
the pass took the fault's taint (and labels) off a cordoned node until the next pass put them back.
A wall clock stepped back (NTP, a leader on a slower clock) did the same.
"""

import asyncio
import datetime
from collections.abc import Mapping
from typing import Any

import pytest

import gpunode_facts
import memory_fleet
from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.decisions import hysteresis, model, policies, times, verdicts
from gpuhealth_operator.runtime import reconciler, ticker
from gpuhealth_operator.verdict import judging

T0 = memory_fleet.T0
HOT = {"temperatureCelsius": 95, "clockEventReasons": ["HwThermalSlowdown"]}
FAULT = {"ecc": {"uncorrectedVolatile": 1}, "remappedRows": {"failure": True}}
RULES = [
    {"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"},
    {"name": "rows", "condition": "RowRemapFailure", "action": "Taint"},
    {"name": "hot", "condition": "ThermalThrottled", "action": "Label", "forSeconds": 60},
]


class Fleet(memory_fleet.MemoryFleet):
    """Nodes under `RULES`, each policy of `policies`; records when our taint is taken off a node."""

    def __init__(self, policies: tuple[str, ...] = ("p",)) -> None:
        super().__init__(RULES, policies)
        self.taints_removed: list[str] = []

    async def report(self, name: str, gpu: Mapping[str, Any]) -> None:
        status = gpunode_facts.agent_status(
            heartbeat=gpunode_facts.rfc3339(self.now),
            heartbeat_seconds=60,
            observed=gpunode_facts.rfc3339(self.now),
            overrides={0: gpu},
        )
        await self.deliver(name, status)

    def watch_taints(self) -> None:
        """Record every Node write that takes our taint off (the flap), whatever comes after it."""
        patch = self.cluster.patch

        async def recording(path: str, body: Any, **kwargs: Any) -> Any:
            parts = path.split("/")  # /api/v1/nodes/NAME[/status]
            name = parts[4] if path.startswith("/api/v1/nodes/") else ""
            had = name in self.cluster.nodes and self.taint(name) is not None
            answer = await patch(path, body, **kwargs)
            if had and self.taint(name) is None:
                self.taints_removed.append(name)
            return answer

        self.cluster.patch = recording


def test_a_fault_cordoned_while_the_timer_acts_keeps_its_taint_through_that_pass() -> None:
    """The timer judges `a` and `b` at one instant; while it writes `a`'s label, `b`'s fault lands
    5 s later by the clock and its watch event cordons and taints `b`. The timer's own pass over `b`
    then must not take the taint off (nor the node judged healthy at the earlier instant act)."""

    async def scenario() -> None:
        fleet = Fleet()
        await fleet.start(["a", "b"])
        for name in ("a", "b"):
            await fleet.report(name, HOT)  # ThermalThrottled pending: both nodes are due at the tick
        fleet.watch_taints()
        patch = fleet.cluster.patch
        landed = False

        async def fault_lands_meanwhile(path: str, body: Any, **kwargs: Any) -> Any:
            nonlocal landed
            if path.endswith("/nodes/a") and not landed:
                landed = True
                fleet.now += datetime.timedelta(seconds=5)
                await fleet.report("b", HOT | FAULT)
                assert fleet.cordoned("b") and fleet.taint("b") == "RowRemapFailure"
            return await patch(path, body, **kwargs)

        fleet.cluster.patch = fault_lands_meanwhile
        fleet.now += datetime.timedelta(seconds=61)
        await ticker.tick(fleet.ctx)
        assert landed, "the timer wrote a's label"
        assert fleet.cordoned("b")
        assert fleet.taint("b") == "RowRemapFailure"
        assert fleet.taints_removed == [], "the timer's pass took the fault's taint off"

    asyncio.run(scenario())


def test_a_node_that_moved_after_the_timer_judged_it_is_never_stamped_cordoned_before_its_fault() -> None:
    """The timer judged `n` healthy; 5 s later its fault is in the cache (its watch event waits behind
    the node's lock). The timer's pass over `n` cordons it, stamped when the fault was there to see."""

    async def scenario() -> None:
        fleet = Fleet()
        await fleet.start(["n"])
        await fleet.report("n", HOT)
        judged_at = fleet.now = fleet.now + datetime.timedelta(seconds=61)
        policy = fleet.ctx.cache.policies["p"]
        assert judging.judge(fleet.ctx, policy, "n", judged_at).wanted_action is vocabulary.Action.LABEL  # type: ignore[union-attr]
        fleet.now += datetime.timedelta(seconds=5)
        status = gpunode_facts.agent_status(
            heartbeat=gpunode_facts.rfc3339(fleet.now), heartbeat_seconds=60, overrides={0: HOT | FAULT}
        )
        fleet.ctx.cache.put_gpunode(fleet.cluster.put_gpunode("n", status), fleet.now)
        await reconciler.reconcile_node(fleet.ctx, "n", "timer", judged_at)
        assert fleet.cordoned("n") and fleet.taint("n") == "RowRemapFailure"
        annotations = fleet.cluster.nodes["n"]["metadata"]["annotations"]
        assert annotations[keys.CORDONED_AT_ANNOTATION] == times.render(fleet.now)

    asyncio.run(scenario())


@pytest.mark.parametrize("policies", [("p",), ("p", "q")], ids=["one-policy", "two-policies"])
def test_a_clock_stepped_back_takes_no_taint_or_label_off(policies: tuple[str, ...]) -> None:
    """The operator's wall clock steps back 30 s (NTP; or a new leader's clock is behind the old
    one's): the faults cordoned and tainted before stay tainted and labelled, under one policy or
    two overlapping ones (whose wishes for the Node's labels and taint are combined)."""

    async def scenario() -> None:
        fleet = Fleet(policies)
        await fleet.start(["n"])
        await fleet.report("n", HOT | FAULT)
        fleet.now += datetime.timedelta(seconds=61)
        await ticker.tick(fleet.ctx, full=True)
        assert fleet.cordoned("n") and fleet.taint("n") == "RowRemapFailure"
        assert fleet.cluster.nodes["n"]["metadata"]["labels"].get(keys.THERMAL_LABEL) == "true"
        fleet.watch_taints()
        fleet.now -= datetime.timedelta(seconds=30)
        await fleet.report("n", HOT | FAULT)
        await ticker.tick(fleet.ctx, full=True)
        assert fleet.cordoned("n")
        assert fleet.taint("n") == "RowRemapFailure"
        assert fleet.taints_removed == []
        assert fleet.cluster.nodes["n"]["metadata"]["labels"].get(keys.THERMAL_LABEL) == "true"

    asyncio.run(scenario())


def test_conditions_held_since_after_the_judging_instant_still_fire() -> None:
    """The decision core on its own: conditions recorded at a later instant than `now` (another
    replica's clock, a pass that judged at an earlier instant) hold, and their rules fire."""
    rules = [dict(r) for r in RULES]
    policy = policies.parse_policy("p", 1, {"rules": rules})
    facts = gpunode_facts.agent_status(
        heartbeat=gpunode_facts.rfc3339(T0), heartbeat_seconds=60, overrides={0: FAULT}
    )
    view = model.NodeView(name="n")
    later = T0 + datetime.timedelta(seconds=20)
    first = verdicts.judge(policy, view, facts, {}, None, later)
    assert first.wanted_action is vocabulary.Action.CORDON and first.wanted_taint == "RowRemapFailure"
    previous = hysteresis.from_status(hysteresis.to_status(first.conditions.values(), 1))
    again = verdicts.judge(policy, view, facts, previous, None, T0)
    assert again.wanted_action is vocabulary.Action.CORDON
    assert again.wanted_taint == "RowRemapFailure"


def test_a_replica_whose_clock_ran_ahead_makes_no_longer_forseconds_rule_fire_early() -> None:
    """The last leader's clock ran 10 minutes ahead: its ThermalThrottled was observed at its +600 s and
    turned True 60 s later. Judged by a correct clock, the 60 s Label rule fires; the 600 s Cordon rule
    waits for 600 s of the fault, which the skew does not count."""
    rules = [
        {"name": "hot-label", "condition": "ThermalThrottled", "action": "Label", "forSeconds": 60},
        {"name": "hot-cordon", "condition": "ThermalThrottled", "action": "Cordon", "forSeconds": 600},
    ]
    policy = policies.parse_policy("p", 1, {"rules": rules})
    facts = gpunode_facts.agent_status(
        heartbeat=gpunode_facts.rfc3339(T0), heartbeat_seconds=60, overrides={0: HOT}
    )
    view = model.NodeView(name="n")
    ahead = datetime.timedelta(seconds=600)
    first = verdicts.judge(policy, view, facts, {}, None, T0 + ahead)  # observed by the fast clock
    held = verdicts.judge(
        policy, view, facts, first.conditions, None, T0 + ahead + datetime.timedelta(seconds=60)
    )
    assert held.wanted_action is vocabulary.Action.LABEL
    previous = hysteresis.from_status(hysteresis.to_status(held.conditions.values(), 1))
    now = T0 + datetime.timedelta(seconds=100)  # the correct clock: 100 s into the fault
    verdict = verdicts.judge(policy, view, facts, previous, None, now)
    assert verdict.wanted_action is vocabulary.Action.LABEL
    assert (
        verdicts.judge(policy, view, facts, previous, None, T0 + ahead).wanted_action
        is vocabulary.Action.LABEL
    )
    later = T0 + ahead + datetime.timedelta(seconds=600)  # 600 s of the fault by the fast clock's count
    assert (
        verdicts.judge(policy, view, facts, previous, None, later).wanted_action is vocabulary.Action.CORDON
    )
