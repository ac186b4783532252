"""Agent liveness from its pod's readiness: a dead agent is stale within 90 s, a Ready one keeps a quiet node.

The rule only ever makes a node stale sooner than the heartbeat rule: a Ready pod never
stretches the heartbeat's own limit, and a node with no known pod goes by the heartbeat alone.
"""

import asyncio
import copy
import datetime
from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st

import gpunode_facts
import handling
import operator_context
from gpuhealth_api import resources, vocabulary
from gpuhealth_operator.decisions import clocks, liveness, model, signals, times
from gpuhealth_operator.runtime import cli, handlers, reconciler, ticker
from gpuhealth_operator.shared import settings
from gpuhealth_operator.state import agent_pods
from gpuhealth_sim.backtest import memcluster

Condition = vocabulary.Condition
NOW = datetime.datetime(2026, 11, 22, 1, 0, tzinfo=datetime.UTC)
GRACE = liveness.NOT_READY_GRACE_SECONDS


def ago(seconds: float) -> datetime.datetime:
    return NOW - datetime.timedelta(seconds=seconds)


def facts(heartbeat_seconds: int = 300) -> Any:
    agent = {"lastHeartbeatTime": "2026-11-22T00:50:00Z", "heartbeatSeconds": heartbeat_seconds}
    return {"agent": agent, "gpus": [{"index": 0, "uuid": "GPU-0"}]}


def stale(pod: liveness.AgentPod | None, report_age_seconds: float) -> bool | None:
    return signals.agent_stale(facts(), report_age_seconds, NOW, pod).present


@pytest.mark.parametrize(
    ("pod", "report_age_seconds", "expected"),
    [
        # No pod known (agents outside Kubernetes): the heartbeat rule alone, 3 x 300 s.
        (None, 899, False),
        (None, 901, True),
        # A Ready pod keeps a quiet node live up to the heartbeat's own limit, never beyond it.
        (liveness.AgentPod("ns/a", True, ago(3600)), 899, False),
        (liveness.AgentPod("ns/a", True, ago(3600)), 901, True),
        # NotReady or gone: stale once the grace is over and no report came in it.
        (liveness.AgentPod("ns/a", False, ago(GRACE - 1)), 600, False),
        (liveness.AgentPod("ns/a", False, ago(GRACE + 1)), 600, True),
        (liveness.AgentPod("ns/a", False, ago(GRACE + 1), gone=True), 600, True),
        # A report newer than the grace: its facts are fresh whatever the pod says.
        (liveness.AgentPod("ns/a", False, ago(600)), GRACE - 1, False),
    ],
)
def test_liveness_rule(pod: liveness.AgentPod | None, report_age_seconds: float, expected: bool) -> None:
    assert stale(pod, report_age_seconds) is expected


def test_a_dead_agent_is_stale_within_90_seconds_with_a_5_minute_heartbeat() -> None:
    went_down = ago(85)  # readiness probe every 10 s: the kubelet says NotReady within 10 s of the death
    pod = liveness.AgentPod("gpu-health/agent-x", False, went_down)
    signal = signals.agent_stale(facts(), 200, NOW, pod)
    assert signal.present is True
    assert signal.observed_at == went_down + datetime.timedelta(seconds=GRACE)
    assert "gpu-health/agent-x is not Ready since" in signal.message
    later = signals.agent_stale(facts(), 260, NOW + datetime.timedelta(seconds=60), pod)
    assert later.message == signal.message, "no elapsed time in the message: it changes with the facts"


def test_a_stale_agent_makes_every_fact_unknown_never_a_fault() -> None:
    ecc: Any = facts()
    ecc["gpus"][0]["ecc"] = {"uncorrectedVolatile": 3}
    pod = liveness.AgentPod("ns/a", False, ago(GRACE + 5))
    raw = signals.raw_signals(ecc, model.NodeView(name="n"), frozenset(), NOW, 600, agent_pod=pod)
    assert raw[Condition.AGENT_STALE].present is True
    assert raw[Condition.ECC_UNCORRECTABLE].present is None


def test_observe_keeps_the_first_not_ready_time_and_another_ready_pod_wins() -> None:
    first = liveness.observe(None, "ns/a", False, ago(100))
    assert liveness.observe(first, "ns/a", False, ago(10)).since == ago(100)
    ready = liveness.observe(first, "ns/a", True, ago(5))
    assert (ready.ready, ready.since) == (True, ago(5))
    # A rolling update with a surge: the new pod's NotReady does not hide the old one's Ready.
    assert liveness.observe(ready, "ns/b", False, ago(4)) == ready
    gone = liveness.observe(ready, "ns/a", False, ago(3), gone=True)
    assert (gone.ready, gone.gone, gone.since) == (False, True, ago(3))


def pod(name: str, node: str | None, ready: bool | None, transition: str = "2026-11-22T00:00:00Z") -> Any:
    body: Any = {"metadata": {"namespace": "gpu-health", "name": name}, "spec": {}, "status": {}}
    if node is not None:
        body["spec"]["nodeName"] = node
    if ready is not None:
        status = "True" if ready else "False"
        body["status"]["conditions"] = [{"type": "Ready", "status": status, "lastTransitionTime": transition}]
    return body


def test_agent_pods_store_reports_the_nodes_whose_readiness_changed() -> None:
    pods = agent_pods.AgentPods()
    assert pods.observe(pod("a", None, True), NOW) is None, "an unscheduled pod has no node"
    assert pods.observe(pod("a", "n1", True), NOW) == "n1"
    assert pods.observe(pod("a", "n1", True), NOW) is None, "no change"
    assert not pods.not_ready("n1")
    assert pods.observe(pod("a", "n1", False), NOW) == "n1"
    assert pods.not_ready("n1")
    assert pods.nodes["n1"].since == NOW, "a change seen by the operator is timed by its clock"
    assert pods.deleted(pod("a", "n1", False), NOW) is None, "already not Ready"
    assert pods.nodes["n1"].gone
    assert pods.observe(pod("b", "n1", None), NOW) is None, "a new pod without a Ready condition yet"
    assert pods.nodes["n1"].since == NOW and not pods.nodes["n1"].gone
    pods.forget_node("n1")
    assert pods.get("n1") is None


def test_a_first_sighting_dates_a_not_ready_pod_from_its_condition_at_the_latest_now() -> None:
    pods = agent_pods.AgentPods()
    pods.observe(pod("a", "n1", False, "2026-11-22T00:58:00Z"), NOW)
    assert pods.nodes["n1"].since == ago(120), "an operator restart does not restart the grace"
    pods.observe(pod("b", "n2", False, "2026-11-23T00:00:00Z"), NOW)
    assert pods.nodes["n2"].since == NOW, "a transition in the future counts as now"


def test_a_node_whose_agent_is_stale_leaves_its_straggler_cohort() -> None:
    """The timer's straggler scoring leaves out a node whose agent is stale, by its pod or by its
    heartbeat: its old numbers neither count in its peers' statistics nor get it flagged."""

    async def scenario() -> None:
        cluster = memcluster.MemoryKube()
        ctx = operator_context.new_context(cluster)
        clock = [NOW]
        ctx.clock = lambda: clock[0]
        rule = {"name": "straggler", "condition": "Straggler", "action": "Label", "forSeconds": 300}
        policy = {"apiVersion": resources.API_VERSION, "kind": resources.POLICY_KIND}
        policy |= {"metadata": {"name": "p", "generation": 1}, "spec": {"rules": [rule]}}
        await handlers.on_policy({"type": "ADDED", "object": policy}, memo=ctx)  # type: ignore[typeddict-item]
        names = [f"n{i}" for i in range(6)]

        async def report(name: str) -> None:
            status = gpunode_facts.agent_status(heartbeat=times.render(clock[0]), heartbeat_seconds=300)
            stored = cluster.put_gpunode(name, status)
            await handling.handle(
                handlers.on_gpunode, {"type": "MODIFIED", "object": copy.deepcopy(stored)}, ctx
            )

        for name in names:
            node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": name}, "spec": {}}
            cluster.put_node(copy.deepcopy(node))
            await handling.handle(handlers.on_node, {"type": "ADDED", "object": node}, ctx)
            await report(name)

        def scored(at: datetime.datetime) -> dict[str, int]:
            reconciler.score_stragglers(ctx, at)
            return {node: score.peers for (_, node), score in ctx.judging.stragglers.items()}

        assert scored(NOW) == dict.fromkeys(names, 5)
        ctx.agent_pods.observe(pod("a0", "n0", False, times.render(NOW)), NOW)  # its agent died
        later = NOW + datetime.timedelta(seconds=GRACE + 1)  # no report since: n0's numbers are old
        assert scored(later) == dict.fromkeys(names[1:], 4), "n0: by its pod, long before its heartbeat"
        clock[0] = NOW + datetime.timedelta(seconds=901)  # three 300 s heartbeats: all but n1 report
        for name in names[2:]:
            await report(name)
        assert scored(clock[0]) == dict.fromkeys(names[2:], 3), "n1: its heartbeat"

    asyncio.run(scenario())


@hypothesis.settings(max_examples=400, deadline=None)
@hypothesis.given(
    agent=st.one_of(
        st.none(),
        st.just("not an object"),
        st.fixed_dictionaries(
            {},
            optional={
                "lastHeartbeatTime": st.sampled_from(["2026-11-22T00:50:00Z", "", "garbage", 7]),
                "heartbeatSeconds": st.one_of(st.integers(-5, 4000), st.floats(0, 100), st.booleans()),
            },
        ),
    ),
    report_age_seconds=st.floats(0, 20_000),
    pod=st.one_of(
        st.none(),
        st.builds(
            liveness.AgentPod,
            st.just("ns/a"),
            st.booleans(),
            st.integers(0, 3 * int(GRACE)).map(ago),
            gone=st.booleans(),
        ),
    ),
)
def test_the_cheap_staleness_check_agrees_with_the_signal(
    agent: object, report_age_seconds: float, pod: liveness.AgentPod | None
) -> None:
    """The straggler statistics ask `agent_is_stale` of every member each tick; it must say what the
    AgentStale signal says, or a stale node's old numbers would move its cohort's median."""
    facts_ = {"gpus": [{"index": 0}]} if agent is None else {"agent": agent, "gpus": [{"index": 0}]}
    expected = signals.agent_stale(facts_, report_age_seconds, NOW, pod).present
    assert signals.agent_is_stale(clocks.stale_limit(facts_), report_age_seconds, NOW, pod) is expected


AGENT_NAMESPACE = settings.Settings().agent_pod_namespace or ""
DAEMONSET = {
    "apiVersion": "apps/v1",
    "kind": "DaemonSet",
    "name": "gpu-health-agent",
    "uid": "ds",
    "controller": True,
}


def owned_pod(name: str, node: str, ready: bool, namespace: str = "", owners: Any = None) -> Any:
    """An agent-labelled pod (the watch's selector matched it) in `namespace`, owned by `owners`."""
    body = pod(name, node, ready, times.render(NOW))
    body["metadata"]["namespace"] = namespace or AGENT_NAMESPACE
    body["metadata"]["ownerReferences"] = [DAEMONSET] if owners is None else owners
    return body


@pytest.mark.parametrize(
    ("namespace", "owners", "agent"),
    [
        ("", None, True),  # the chart's DaemonSet's pod, in the operator's namespace
        ("tenant", None, False),  # a tenant's own DaemonSet with the agent's labels
        ("", [], False),  # a bare pod in our namespace with the agent's labels
        ("", [{**DAEMONSET, "kind": "ReplicaSet"}], False),
        ("", [{**DAEMONSET, "controller": False}], False),  # not its controller
        ("", [{**DAEMONSET, "apiVersion": "example.com/v1"}], False),  # a DaemonSet of another API
    ],
)
def test_only_the_daemonsets_pods_in_the_agents_namespace_are_the_agent(
    namespace: str, owners: Any, agent: bool
) -> None:
    cluster: Any = memcluster.MemoryKube()
    ctx = operator_context.new_context(cluster, clock=lambda: NOW)
    body = owned_pod("a", "n1", True, namespace, owners)
    asyncio.run(handlers.on_agent_pod({"type": "MODIFIED", "object": body}, memo=ctx))  # type: ignore[typeddict-item]
    assert (ctx.agent_pods.get("n1") is not None) is agent
    assert agent_pods.is_agent(body, AGENT_NAMESPACE) is agent


def test_a_tenant_pod_with_the_agents_labels_turning_not_ready_does_not_hide_a_fault() -> None:
    """Issue 24, 6: a tenant's pod carrying the agent's labels, in its own namespace, turns Ready then
    NotReady on a faulty node. It is not the agent: the node is not made Unknown (which never drains),
    its sustained fault is acted on after forSeconds. Nor does a tenant's Ready pod keep the node live
    while the real agent's pod is NotReady."""

    async def scenario() -> None:
        cluster = memcluster.MemoryKube()
        ctx = operator_context.new_context(cluster)
        clock = [NOW]
        ctx.clock = lambda: clock[0]
        rule = {"name": "hot", "condition": "ThermalThrottled", "action": "Cordon", "forSeconds": 120}
        policy = {"apiVersion": resources.API_VERSION, "kind": resources.POLICY_KIND}
        policy |= {"metadata": {"name": "p", "generation": 1}, "spec": {"rules": [rule], "maxUnavailable": 2}}
        await handlers.on_policy({"type": "ADDED", "object": policy}, memo=ctx)  # type: ignore[typeddict-item]
        hot = {0: {"temperatureCelsius": 95, "clockEventReasons": ["HwThermalSlowdown"]}}
        for name in ("faulty", "quiet"):
            node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": name}, "spec": {}}
            cluster.put_node(copy.deepcopy(node))
            await handling.handle(handlers.on_node, {"type": "ADDED", "object": node}, ctx)
            status = gpunode_facts.agent_status(
                heartbeat=times.render(NOW),
                heartbeat_seconds=300,
                observed=times.render(NOW),
                overrides=hot if name == "faulty" else None,
            )
            stored = cluster.put_gpunode(name, status)
            await handling.handle(
                handlers.on_gpunode, {"type": "MODIFIED", "object": copy.deepcopy(stored)}, ctx
            )

        async def event(body: Any) -> None:
            await handlers.on_agent_pod({"type": "MODIFIED", "object": body}, memo=ctx)  # type: ignore[typeddict-item]

        # On "faulty": a tenant's bare pod and a tenant's DaemonSet pod, Ready then NotReady.
        for tenant in (
            owned_pod("t1", "faulty", True, "tenant", []),
            owned_pod("t2", "faulty", True, "tenant"),
        ):
            await event(tenant)
            tenant["status"]["conditions"][0]["status"] = "False"
            await event(tenant)
        # On "quiet": the real agent's pod NotReady, a tenant's Ready pod beside it.
        await event(owned_pod("agent-quiet", "quiet", False))
        await event(owned_pod("t3", "quiet", True, "tenant"))

        clock[0] = NOW + datetime.timedelta(seconds=121)
        await ticker.tick(ctx, full=True)
        faulty = cluster.gpunodes["faulty"]["status"]
        assert faulty["health"] != "Unknown", faulty.get("conditions")
        assert cluster.nodes["faulty"]["spec"].get("unschedulable") is True, "the fault is acted on"
        assert cluster.gpunodes["quiet"]["status"]["health"] == "Unknown", "its own agent is down"

    asyncio.run(scenario())


def test_the_agents_namespace_is_the_operators_own_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "release-ns")
    assert cli.parse_args([]).agent_pod_namespace == "release-ns"
    assert cli.parse_args(["--agent-pod-namespace=agents"]).agent_pod_namespace == "agents"
    monkeypatch.delenv("POD_NAMESPACE")
    assert cli.parse_args(["--lease-namespace=ops"]).agent_pod_namespace == "ops"
