"""Each policy's breaker at run time: reset requests are acted on once per value, and survive a restart."""

import asyncio
import copy
import datetime
from typing import Any

import drain_cluster
import gpunode_facts
import handling
from gpuhealth_api import keys
from gpuhealth_operator.decisions import breaker, model, times
from gpuhealth_operator.runtime import handlers, ticker
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import breakers

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
POLICY = model.Policy(name="p", breaker_max_new_unhealthy=1, breaker_window_seconds=600)


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def body(annotation: str | None = None, recorded: dict[str, str] | None = None) -> dict[str, object]:
    annotations = {} if annotation is None else {keys.BREAKER_RESET_ANNOTATION: annotation}
    return {
        "metadata": {"name": "p", "annotations": annotations},
        "status": {} if recorded is None else {breakers.STATUS_FIELD: recorded},
    }


def test_a_storm_trips_it_and_old_faults_are_pruned() -> None:
    owner = breakers.Breakers()
    turned = {"a": at(0), "b": at(1), "old": at(-700)}
    assert owner.current(POLICY, 10, turned, at(2)).state is breaker.State.OPEN
    assert "old" not in turned, "out of every window: pruned"
    assert owner.paused("p") is not None
    condition = owner.condition("p", at(3))
    assert (condition["type"], condition["status"], condition["reason"]) == ("Paused", "True", "FaultStorm")
    assert condition["lastTransitionTime"] == times.render(at(2))


def test_a_closed_breaker_says_so() -> None:
    condition = breakers.Breakers().condition("p", at(0))
    assert (condition["status"], condition["reason"]) == ("False", "BreakerClosed")


def test_a_reset_is_acted_on_once_per_value_and_recorded() -> None:
    owner = breakers.Breakers()
    turned = {"a": at(0), "b": at(1)}
    owner.current(POLICY, 10, turned, at(2))
    owner.note_reset("p", body("ack-1"))
    assert owner.resets == {"p": "ack-1"}
    owner.reset("p", owner.resets.pop("p"), at(3))
    assert owner.current(POLICY, 10, turned, at(4)).state is breaker.State.CLOSED
    assert owner.status("p") == {"breakerReset": {"value": "ack-1", "time": times.render(at(3))}}
    owner.note_reset("p", body("ack-1", owner.status("p")["breakerReset"]))
    assert owner.resets == {}, "the same value again is no new request"
    owner.note_reset("p", body("ack-2"))
    assert owner.resets == {"p": "ack-2"}


def test_after_a_restart_the_recorded_reset_is_neither_repeated_nor_forgotten() -> None:
    restarted = breakers.Breakers()
    restarted.note_reset("p", body("ack-1", {"value": "ack-1", "time": times.render(at(3))}))
    assert restarted.resets == {}
    # The storm before the reset does not trip the new process; a new one does.
    assert restarted.current(POLICY, 10, {"a": at(0), "b": at(1)}, at(5)).state is breaker.State.CLOSED
    assert restarted.current(POLICY, 10, {"a": at(4), "b": at(5)}, at(6)).state is breaker.State.OPEN


def written(reason: str, status: str = "True", since: float = 0) -> dict[str, object]:
    """A policy body whose status holds the Paused condition an earlier process wrote."""
    condition = {
        "type": "Paused",
        "status": status,
        "reason": reason,
        "message": "why.",
        "lastTransitionTime": times.render(at(since)),
    }
    return {**body(), "status": {"conditions": [{"type": "Ready", "status": "True"}, condition]}}


def test_a_new_process_takes_up_an_open_breaker_from_the_policy_status() -> None:
    restarted = breakers.Breakers()
    restarted.note_reset("p", written("FaultStorm", since=5))
    state = restarted.states["p"]
    assert (state.state, state.since, state.reason) == (breaker.State.OPEN, at(5), "why")
    # The storm's nodes are still held back a window later: it stays open; once they recover, half-open.
    assert (
        restarted.current(POLICY, 10, {"a": at(0)}, at(700), held=[at(0), at(1)]).state is breaker.State.OPEN
    )
    assert restarted.current(POLICY, 10, {"a": at(0)}, at(701), held=[]).state is breaker.State.HALF_OPEN


def test_a_new_process_takes_up_a_half_open_breaker_with_its_trial_spent() -> None:
    restarted = breakers.Breakers()
    restarted.note_reset("p", written("HalfOpen", since=5))
    state = restarted.states["p"]
    assert state.state is breaker.State.HALF_OPEN
    assert breaker.admit(state, "n", at(6))[1] is False


def test_a_closed_or_missing_paused_condition_takes_nothing_up_and_a_known_breaker_is_kept() -> None:
    for closed in (written("BreakerClosed", status="False"), body()):
        restarted = breakers.Breakers()
        restarted.note_reset("p", closed)
        assert "p" not in restarted.states
    running = breakers.Breakers()
    running.states["p"] = breaker.Breaker()
    running.note_reset("p", written("FaultStorm"))  # our own older write, echoed by the watch
    assert running.states["p"] == breaker.Breaker()


def test_forgetting_a_node_keeps_the_trial_spent() -> None:
    owner = breakers.Breakers()
    owner.states["p"] = breaker.Breaker(state=breaker.State.HALF_OPEN, since=at(0), trial="n", trial_at=at(1))
    owner.forget_node("n")
    state = owner.states["p"]
    assert state.trial is None
    assert breaker.admit(state, "m", at(2))[1] is False


def test_a_limit_of_every_selected_node_never_trips_and_costs_no_count() -> None:
    owner = breakers.Breakers()
    everything = model.Policy(name="p", breaker_max_new_unhealthy="100%")
    turned = {f"n{i}": at(0) for i in range(10)}
    assert owner.current(everything, 10, turned, at(1)).state is breaker.State.CLOSED


# --- a storm that does not end (issue 24, item 1) --------------------------------------------------------

STORM_NODES = [f"n{i:02d}" for i in range(20)]
DRA_VERSION = "v1beta2"
STORM_SPEC = drain_cluster.drain_spec(
    "gpu",
    maxUnavailable="50%",
    rules=[{"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}],
    breaker={"maxNewUnhealthy": 2, "windowSeconds": 600},
)


class Fleet:
    """20 GPU nodes under one policy on the in-memory cluster, on a clock the test moves."""

    def __init__(
        self, spec: dict[str, Any] | None = None, others: dict[str, dict[str, Any]] | None = None
    ) -> None:
        self.cluster = drain_cluster.DrainCluster()
        self.spec = STORM_SPEC if spec is None else spec
        self.others = others or {}
        """More policies over the same nodes: name → spec."""
        self.now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        self.ecc: dict[str, int] = {}
        self.ctx = self.new_context()

    def new_context(self) -> context.Context:
        ctx = drain_cluster.make_context(self.cluster)
        ctx.clock = lambda: self.now
        return ctx

    async def start(self) -> None:
        self.cluster.serve_device_taint_rules(DRA_VERSION)
        await self.policy()
        for name, spec in self.others.items():
            body = drain_cluster.policy_body(name, spec)
            await handlers.on_policy(drain_cluster.event("ADDED", body), memo=self.ctx)
        for name in STORM_NODES:
            self.cluster.put_node(drain_cluster.node_body(name, {"pool": "gpu"}))
            self.cluster.put_slice(gpunode_facts.resource_slice(name, 8))
            await self.deliver_node(name)
            await self.report(name, 0)

    async def policy(self, **annotations: str) -> None:
        """The policy as the watch delivers it: spec, annotations and the status the operator wrote."""
        body = drain_cluster.policy_body("p", self.spec)
        body["metadata"]["annotations"] = annotations
        body["status"] = copy.deepcopy((self.cluster.policies.get("p") or {}).get("status") or {})
        await handlers.on_policy(drain_cluster.event("MODIFIED", body), memo=self.ctx)

    async def deliver_node(self, name: str) -> None:
        body = copy.deepcopy(self.cluster.nodes[name])
        await handling.handle(handlers.on_node, drain_cluster.event("MODIFIED", body), self.ctx)

    async def report(self, name: str, ecc: int) -> None:
        """The node's agent reports (a fresh heartbeat) `ecc` uncorrectable errors on GPU 0."""
        self.ecc[name] = ecc
        stamp = gpunode_facts.rfc3339(self.now)
        facts = gpunode_facts.agent_status(
            overrides={0: {"ecc": {"uncorrectedVolatile": ecc}}}, heartbeat=stamp, observed=stamp
        )
        stored = self.cluster.put_gpunode(name, facts)
        await handling.handle(
            handlers.on_gpunode, drain_cluster.event("MODIFIED", copy.deepcopy(stored)), self.ctx
        )

    async def later(self, seconds: float) -> None:
        """Time passes: every agent reports again, then the operator's timer runs two passes."""
        self.now += datetime.timedelta(seconds=seconds)
        for name in STORM_NODES:
            await self.report(name, self.ecc[name])
        await ticker.tick(self.ctx, full=True)
        await ticker.tick(self.ctx, full=True)

    def cordoned(self) -> list[str]:
        return sorted(n for n, body in self.cluster.nodes.items() if body["spec"].get("unschedulable"))

    def paused(self) -> dict[str, object]:
        conditions = (self.cluster.policies.get("p") or {}).get("status", {}).get("conditions") or []
        return next(c for c in conditions if c["type"] == "Paused")


async def storm(fleet: Fleet, *, cordons: int = 2) -> None:
    """Every node turns Unhealthy within a minute and stays so (a bad driver rollout)."""
    await fleet.start()
    for name in STORM_NODES:
        fleet.now += datetime.timedelta(seconds=2)
        await fleet.report(name, 1)
    await fleet.later(1)
    assert len(fleet.cordoned()) == cordons
    assert fleet.paused()["reason"] == "FaultStorm"


def test_a_storm_that_has_not_ended_keeps_it_open_after_the_window() -> None:
    """20 nodes turn Unhealthy and stay so: 2 cordoned, and no more however long the storm lasts."""

    async def scenario() -> None:
        fleet = Fleet()
        await storm(fleet)
        for _ in range(4):  # 11 minutes, then a probe's length, then more
            await fleet.later(330)
            assert len(fleet.cordoned()) == 2, "the breaker let the storm through"
        paused = fleet.paused()
        assert (paused["status"], paused["reason"]) == ("True", "FaultStorm")
        assert "not ended" in str(paused["message"])
        assert keys.BREAKER_RESET_ANNOTATION in str(paused["message"])

    asyncio.run(scenario())


def test_a_storm_of_faults_isolated_per_gpu_keeps_it_open_too() -> None:
    """IsolateGPU is a disruption the breaker holds back: nodes whose GPUs wait for it are held back."""

    async def scenario() -> None:
        isolate = [{"name": "ecc", "condition": "EccUncorrectable", "action": "IsolateGPU"}]
        fleet = Fleet({**STORM_SPEC, "rules": isolate, "maxUnavailableGPUs": "100%"})
        await storm(fleet, cordons=0)
        isolated = {rule["metadata"]["labels"][keys.NODE_LABEL] for rule in fleet.cluster.rules.values()}
        assert 0 < len(isolated - {""}) <= 2
        for _ in range(4):
            await fleet.later(330)
            now = {rule["metadata"]["labels"].get(keys.NODE_LABEL) for rule in fleet.cluster.rules.values()}
            assert now == isolated, "the breaker let the storm's isolations through"
        assert fleet.paused()["reason"] == "FaultStorm"

    asyncio.run(scenario())


def test_a_breaker_holding_back_another_policys_cordons_stays_open_while_the_storm_goes_on() -> None:
    """`p` only labels ECC faults and trips on the storm; `pool` cordons them and never trips. A node
    needs every selecting policy's breaker, so `p` holds `pool`'s cordons back: those are its storm."""

    async def scenario() -> None:
        label = [{"name": "ecc", "condition": "EccUncorrectable", "action": "Label"}]
        pool = {**STORM_SPEC, "breaker": {"maxNewUnhealthy": "100%"}}
        fleet = Fleet({**STORM_SPEC, "rules": label}, others={"pool": pool})
        await storm(fleet)
        for _ in range(4):
            await fleet.later(330)
            assert len(fleet.cordoned()) == 2, "the breaker let the storm through"
        assert fleet.paused()["reason"] == "FaultStorm"

    asyncio.run(scenario())


def test_a_human_resumes_a_breaker_held_open_by_a_storm_that_has_not_ended() -> None:
    async def scenario() -> None:
        fleet = Fleet()
        await storm(fleet)
        await fleet.later(700)
        assert len(fleet.cordoned()) == 2
        await fleet.policy(**{keys.BREAKER_RESET_ANNOTATION: "oncall-ack"})
        await fleet.later(1)
        assert len(fleet.cordoned()) == 10, "the budget (50%) now decides"
        assert fleet.paused()["status"] == "False"

    asyncio.run(scenario())


def test_once_the_storm_ends_it_half_opens_and_resumes_by_itself() -> None:
    """All but one of the nodes it held back recover: the one left is a fault of its own."""

    async def scenario() -> None:
        fleet = Fleet()
        await storm(fleet)
        held = [n for n in STORM_NODES if n not in fleet.cordoned()]
        for name in held[1:]:
            await fleet.report(name, 0)
        await fleet.later(600)
        assert fleet.paused()["reason"] == "HalfOpen"
        assert held[0] in fleet.cordoned(), "the trial"
        await fleet.later(60)
        assert fleet.paused()["status"] == "False"
        assert len(fleet.cordoned()) == 3

    asyncio.run(scenario())


def test_a_restart_keeps_it_open_while_the_storm_goes_on() -> None:
    """The open breaker is in the policy's status (Paused since ...): a new process holds it open too."""

    async def scenario() -> None:
        fleet = Fleet()
        await storm(fleet)
        await fleet.later(300)
        fleet.ctx = fleet.new_context()  # a new process (or replica) over the same cluster
        await fleet.policy()
        for name in STORM_NODES:
            await fleet.deliver_node(name)
        await fleet.later(400)  # past the window since the storm began
        await fleet.later(400)
        assert len(fleet.cordoned()) == 2, "the restart forgot the storm"
        assert fleet.paused()["reason"] == "FaultStorm"

    asyncio.run(scenario())
