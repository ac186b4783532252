"""The backtest decides what the live operator decided: same actions, per node, in the same order.

A live operator (its own process, as in production) handles a small scripted
story on five kwok nodes while `record` follows the cluster into a trace:
a double-bit ECC error on one node (cordon and drain), a thermal episode on
another (label, then label removed), a human's cordon and uncordon of a
third, the first node's recovery (uncordon). A separate watch of the Nodes
says what the live operator did. Then `replayer.run` replays the recorded
trace under the same policy, and must report the same Node changes, per
node, in the same order.

Compared per node, not fleet-wide: the replay's timer runs on the trace's
clock in steps of `TICK` from the recording's start, the live one on its
own, so two nodes' actions a fraction of a second apart may swap across
nodes; on one node, each action needs the one before.

On DRA nodes IsolateGPU quarantines one GPU through a DeviceTaintRule: the
trace records the ResourceSlices it matches GPUs on and whether the cluster
acts on rules, so the replay isolates the same GPU, not the node.
"""

import datetime
import json
import secrets
import signal
import subprocess
import sys
import threading
import zlib
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

import agent_daemonset
import gpunode_facts
import operator_fixtures
import operator_harness
from gpuhealth_api import keys, resources, timestamps
from gpuhealth_operator.decisions import device_taints
from gpuhealth_operator.shared import settings
from gpuhealth_sim import waiting, watches
from gpuhealth_sim.backtest import liveactions, replayer, tracerecord, traces
from gpuhealth_sim.controlplane import local
from gpuhealth_sim.fleet import dra

pytestmark = pytest.mark.integration

TIMEOUT = 30.0
TICK = 0.5
ECC = {"ecc": {"uncorrectedVolatile": 1}}
HOT = {"temperatureCelsius": 93, "clockEventReasons": ["HwThermalSlowdown"], "smClockMHz": 1400}
COOL = {"temperatureCelsius": 80, "clockEventReasons": [], "smClockMHz": 1980}


operator = operator_fixtures.operator_fixture(
    "backtest", [f"--tick-seconds={TICK}", *operator_harness.QUICK_TIMER[1:]]
)


class NodeVersions:
    """Every version of the fleet's Nodes, as a watch delivers them, with its arrival time."""

    def __init__(self, api: client.ApiClient, names: set[str]) -> None:
        self.names = names
        self.versions: list[tuple[float, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self.follower = watches.Follower("test-nodes", client.CoreV1Api(api).list_node, self._on)

    def _on(self, kind: str, obj: dict[str, Any], at: float) -> None:
        name = obj["metadata"]["name"]
        if name in self.names:
            with self._lock:  # a deletion as `liveactions.actions` reads one
                self.versions.append(
                    (at, {"metadata": {"name": name}, "deleted": True} if kind == "DELETED" else obj)
                )


class Recording:
    """`record` into a trace beside a watch of the fleet's Nodes (what live did), from `start` to `stop`."""

    def __init__(
        self,
        control_plane: local.ControlPlane,
        k8s: client.ApiClient,
        trace: Path,
        names: Collection[str],
    ) -> None:
        self.trace = trace
        self._api = control_plane.api_client()
        self.recorder: tracerecord.Recorder | None = None
        self.seen = NodeVersions(k8s, set(names))

    def start(self) -> tracerecord.Recorder:
        self.recorder = tracerecord.Recorder(self._api, self.trace).start()
        self.seen.follower.start()
        assert self.seen.follower.wait_synced(30)
        return self.recorder

    def stop(self) -> None:
        if self.recorder is not None:
            self.seen.follower.stop()
            self.recorder.stop()
        self._api.close()  # type: ignore[no-untyped-call]


def _heartbeats(
    fleet: operator_harness.Fleet, recorder: tracerecord.Recorder, statuses: dict[str, Any]
) -> None:
    """The agents' next heartbeats, recorded: the replay's clock runs up to here."""
    written = recorder.records
    for name, status in statuses.items():
        fleet.report(name, status)
    waiting.wait_until(
        lambda: recorder.records >= written + len(statuses),
        timeout_seconds=TIMEOUT,
        message="the heartbeats recorded",
    )


def _policy(fleet: operator_harness.Fleet) -> dict[str, Any]:
    """The policy as the live operator read it, without its status (the replay writes its own)."""
    policy: dict[str, Any] = fleet.custom.get_cluster_custom_object(
        resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, fleet.label
    )
    policy.pop("status", None)
    return policy


def _counted(fleet: operator_harness.Fleet, **counts: int) -> bool:
    """Whether the live operator's policy status counts these (it writes them from its own cache)."""
    policy = fleet.custom.get_cluster_custom_object(
        resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, fleet.label
    )
    status = policy.get("status") or {}
    return all(status.get(key) == value for key, value in counts.items())


def _replayed_as_live(
    trace: Path, policy: dict[str, Any], live: list[replayer.Action], names: Collection[str]
) -> replayer.Result:
    result = replayer.run(trace, policy, tick_seconds=TICK)
    replayed = [a for a in result.actions if a.node in names]
    assert liveactions.differences(live, replayed) == {}, (
        f"live: {liveactions.sequence(live)}\nreplayed: {liveactions.sequence(replayed)}"
    )
    return result


def test_the_backtest_of_a_recorded_run_decides_what_the_live_operator_did(
    operator: operator_harness.OperatorProcess,
    control_plane: local.ControlPlane,
    k8s: client.ApiClient,
    tmp_path: Path,
) -> None:
    fleet = operator_harness.Fleet(k8s, label=f"bt-{secrets.token_hex(3)}")
    names = [f"{fleet.label}-{i}" for i in range(5)]
    ecc, hot, human = names[1], names[2], names[3]
    recording = Recording(control_plane, k8s, tmp_path / "run.jsonl.gz", names)
    recorder = recording.start()
    core = client.CoreV1Api(k8s)
    try:
        fleet.policy(
            fleet.label,
            {
                "maxUnavailable": 2,
                "rules": [
                    {"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"},
                    {"name": "thermal", "condition": "ThermalThrottled", "action": "Label", "forSeconds": 1},
                ],
                "drain": {"timeoutSeconds": 30, "force": True},
                "recovery": {"uncordon": True, "healthyForSeconds": 2},
            },
        )
        for name in names:
            fleet.add_node(name)

        node = fleet.node

        def wait(what: str, check: Any) -> None:
            waiting.wait_until(check, timeout_seconds=TIMEOUT, message=what)

        wait(
            "every node labelled healthy",
            lambda: all(node(n)["metadata"]["labels"].get(keys.HEALTH_LABEL) == "healthy" for n in names),
        )
        fleet.report(ecc, gpunode_facts.agent_status(overrides={2: ECC}))
        wait(
            f"{ecc} cordoned by the policy",
            lambda: (
                (n := node(ecc))["spec"].get("unschedulable")
                and n["metadata"]["annotations"].get(keys.CORDONED_BY_ANNOTATION) == fleet.label
            ),
        )
        fleet.report(hot, gpunode_facts.agent_status(overrides={4: HOT}))
        wait(f"{hot} labelled", lambda: keys.THERMAL_LABEL in node(hot)["metadata"]["labels"])
        # The replay's timer steps by TICK on the trace's clock, not in phase with the live one: the
        # episode must outlast forSeconds by more than a tick for the replay's timer to see it held.
        waiting.holds(
            lambda: keys.THERMAL_LABEL in node(hot)["metadata"]["labels"],
            seconds=3 * TICK,
            message=f"{hot} stays labelled while hot",
        )
        fleet.report(hot, gpunode_facts.agent_status(overrides={4: COOL}))
        wait(f"{hot} unlabelled", lambda: keys.THERMAL_LABEL not in node(hot)["metadata"]["labels"])
        core.patch_node(human, {"spec": {"unschedulable": True}})
        fleet.report(human, gpunode_facts.agent_status())  # the agent's next heartbeat
        wait(f"{human} cordoned", lambda: node(human)["spec"].get("unschedulable"))
        core.patch_node(human, {"spec": {"unschedulable": False}})
        fleet.report(ecc, gpunode_facts.agent_status())  # a driver reload reset the volatile counter
        wait(f"{ecc} uncordoned", lambda: not node(ecc)["spec"].get("unschedulable"))
        wait(
            f"{ecc} labelled healthy again",
            lambda: node(ecc)["metadata"]["labels"].get(keys.HEALTH_LABEL) == "healthy",
        )
        _heartbeats(fleet, recorder, {name: gpunode_facts.agent_status() for name in names})
    finally:
        recording.stop()
        policy = _policy(fleet)
        fleet.cleanup()

    live = liveactions.actions(recording.seen.versions, fleet.label)
    did = liveactions.sequence(live)
    healthy = "Label health=healthy"
    assert did[ecc] == [healthy, "Drain", "Label health=unhealthy", healthy, "Uncordon"], did
    assert did[hot] == [
        healthy,
        "Label health=degraded",
        "Label thermal-throttled=true",
        healthy,
        "Unlabel thermal-throttled",
    ], did
    assert did[human] == [healthy], did

    with traces.open_trace(recording.trace) as (_, records):
        recorded = liveactions.from_trace(list(records), fleet.label)
    assert liveactions.differences(live, recorded) == {}, "the trace holds every Node change the watch saw"

    _replayed_as_live(recording.trace, policy, live, names)


def test_a_node_replaced_while_drained_frees_the_budget_live_and_in_the_backtest(
    operator: operator_harness.OperatorProcess,
    control_plane: local.ControlPlane,
    k8s: client.ApiClient,
    tmp_path: Path,
) -> None:
    # A node with a double-bit error is often replaced, not repaired: its Node is deleted while drained
    # (the garbage collector takes its GPUNode). With maxUnavailable 1 the next fatal node is drained at
    # once live; the replay must see the deletion too, or it leaves that node Pending behind a ghost.
    fleet = operator_harness.Fleet(k8s, label=f"btr-{secrets.token_hex(3)}")
    names = [f"{fleet.label}-{i}" for i in range(3)]
    replaced, second = names[0], names[1]
    recording = Recording(control_plane, k8s, tmp_path / "replaced.jsonl.gz", names)
    recorder = recording.start()
    node = fleet.node

    def wait(what: str, check: Any) -> None:
        waiting.wait_until(check, timeout_seconds=TIMEOUT, message=what)

    def collected(name: str) -> bool:
        try:
            fleet.custom.get_cluster_custom_object(
                resources.GROUP, resources.VERSION, resources.GPUNODE_PLURAL, name
            )
        except client.ApiException as error:
            return error.status == 404
        return False

    try:
        fleet.policy(
            fleet.label,
            {
                "maxUnavailable": 1,
                "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
                "drain": {"timeoutSeconds": 30, "force": True},
            },
        )
        for name in names:
            fleet.add_node(name)
        wait(
            "every node labelled healthy",
            lambda: all(node(n)["metadata"]["labels"].get(keys.HEALTH_LABEL) == "healthy" for n in names),
        )
        fleet.report(replaced, gpunode_facts.agent_status(overrides={2: ECC}))
        wait(f"{replaced} cordoned", lambda: node(replaced)["spec"].get("unschedulable"))
        # The status counts 2 selected and none cordoned before it counts the third node's agent too: seen
        # counting the cordon first, its next 2 / 0 can only come from the deletion.
        wait("the cordon counted", lambda: _counted(fleet, selectedNodes=3, cordonedNodes=1))
        client.CoreV1Api(k8s).delete_node(replaced)
        wait(f"{replaced}'s GPUNode garbage-collected", lambda: collected(replaced))
        # The API server's deletion is not yet the operator's: until its watch delivers it, the ghost holds
        # the budget, and live labels the second node Pending before draining it (CI: Label, then Drain),
        # while the trace, ordered by the recorder's own watch, may free the budget before the fault.
        wait(f"the operator saw {replaced} go", lambda: _counted(fleet, selectedNodes=2, cordonedNodes=0))
        fleet.report(second, gpunode_facts.agent_status(overrides={5: ECC}))
        wait(
            f"{second} cordoned: the replaced node no longer holds the budget",
            lambda: node(second)["spec"].get("unschedulable"),
        )
        broken = gpunode_facts.agent_status(overrides={5: ECC})
        _heartbeats(fleet, recorder, {names[2]: gpunode_facts.agent_status(), second: broken})
    finally:
        recording.stop()
        policy = _policy(fleet)
        fleet.cleanup()

    with traces.open_trace(recording.trace) as (_, records):
        deletions = [(r["kind"], r["name"]) for r in records if r.get("deleted") and r["name"] in names]
    # Two watches, two streams: the garbage collector's GPUNode deletion may be recorded before the Node's.
    assert sorted(deletions) == [("gpunode", replaced), ("node", replaced)], deletions
    live = liveactions.actions(recording.seen.versions, fleet.label)
    did = liveactions.sequence(live)
    assert did[replaced][:2] == ["Label health=healthy", "Drain"], did
    assert "Drain" in did[second], did

    result = _replayed_as_live(recording.trace, policy, live, names)
    assert result.pending_nodes == set(), "no node waited for the budget in the replay"


def test_a_recording_begun_on_a_policys_cordon_replays_the_uncordon_live_made(
    operator: operator_harness.OperatorProcess,
    control_plane: local.ControlPlane,
    k8s: client.ApiClient,
    tmp_path: Path,
) -> None:
    # `record` is started on a fleet where the policy already holds a node drained (its GPU about to be
    # repaired) and another labelled thermal-throttled (and still hot): live, the policy uncordons the
    # first once healthy and leaves the label. The replay starts from the recording's first versions, the
    # policy's claim and conditions included: it must uncordon the first too, not leave it as a person's
    # cordon, and keep the label, not drop it for forSeconds as if the heat were new.
    fleet = operator_harness.Fleet(k8s, label=f"btm-{secrets.token_hex(3)}")
    names = [f"{fleet.label}-{i}" for i in range(3)]
    broken, hot = names[0], names[1]
    node = fleet.node

    def wait(what: str, check: Any) -> None:
        waiting.wait_until(check, timeout_seconds=TIMEOUT, message=what)

    recording = Recording(control_plane, k8s, tmp_path / "midway.jsonl.gz", names)
    try:
        fleet.policy(
            fleet.label,
            {
                "rules": [
                    {"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"},
                    {"name": "thermal", "condition": "ThermalThrottled", "action": "Label", "forSeconds": 2},
                ],
                "drain": {"timeoutSeconds": 30, "force": True},
                "recovery": {"uncordon": True, "healthyForSeconds": 2},
            },
        )
        for name in names:
            fleet.add_node(name)
        fleet.report(hot, gpunode_facts.agent_status(overrides={4: HOT}))
        wait(f"{hot} labelled", lambda: keys.THERMAL_LABEL in node(hot)["metadata"]["labels"])
        fleet.report(broken, gpunode_facts.agent_status(overrides={2: ECC}))
        wait(
            f"{broken} drained",
            lambda: (
                node(broken)["metadata"].get("annotations", {}).get(keys.CORDONED_BY_ANNOTATION)
                == fleet.label
            ),
        )
        recorder = recording.start()  # the recording begins here
        fleet.report(broken, gpunode_facts.agent_status())  # repaired: a driver reload reset the counter
        wait(f"{broken} uncordoned", lambda: not node(broken)["spec"].get("unschedulable"))

        def still_hot() -> dict[str, Any]:
            return {hot: gpunode_facts.agent_status(overrides={4: HOT})}  # a new heartbeat each time

        healthy = {name: gpunode_facts.agent_status() for name in (broken, names[2])}
        _heartbeats(fleet, recorder, {**healthy, **still_hot()})
        waiting.holds(
            lambda: keys.THERMAL_LABEL in node(hot)["metadata"]["labels"],
            seconds=3 * TICK,
            message=f"{hot} stays labelled while hot",
        )
        _heartbeats(fleet, recorder, still_hot())
    finally:
        recording.stop()
        policy = _policy(fleet)
        fleet.cleanup()

    live = liveactions.actions(recording.seen.versions, fleet.label)
    did = liveactions.sequence(live)
    assert did[broken] == ["Label health=healthy", "Uncordon"], did
    assert did.get(hot, []) == [], did
    result = _replayed_as_live(recording.trace, policy, live, names)
    assert result.max_cordoned_by_policy == 1 and result.gpu_hours_out > 0


AGENT_LABELS = dict(label.split("=") for label in settings.DEFAULT_AGENT_POD_SELECTOR.split(","))
"""The chart's agent pod labels: the operator's and record's default selector."""


AGENT_NAMESPACE = settings.Settings().agent_pod_namespace or "gpu-health"
"""The operator's agent namespace here (its --lease-namespace, no $POD_NAMESPACE): only a DaemonSet's pods
there are agents (`agent_pods.is_agent`)."""


def _agent_pod(core: client.CoreV1Api, namespace: str, node: str) -> str:
    """The node's agent pod (the agent DaemonSet's), Ready (kwok keeps the status the test writes, as a
    kubelet's probe would)."""
    selector = ",".join(f"{k}={v}" for k, v in AGENT_LABELS.items())
    name = agent_daemonset.pod_on(core, namespace, selector, node)
    _set_ready(core, namespace, name, True)
    return name


def _set_ready(core: client.CoreV1Api, namespace: str, pod: str, ready: bool) -> None:
    """What the kubelet writes when the readiness probe of the agent's /readyz passes or fails."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    value = "True" if ready else "False"
    conditions = [
        {"type": kind, "status": value, "lastTransitionTime": now} for kind in ("Ready", "ContainersReady")
    ]
    core.patch_namespaced_pod_status(
        pod, namespace, {"status": {"phase": "Running", "conditions": conditions}}
    )


def test_an_agent_whose_pod_dies_is_judged_stale_when_the_live_operator_judged_it(
    operator: operator_harness.OperatorProcess,
    control_plane: local.ControlPlane,
    k8s: client.ApiClient,
    namespace: str,
    tmp_path: Path,
) -> None:
    # Agents report every 5 minutes: by the heartbeat alone none turns stale during this test. Live,
    # the operator watches their pods, and a hung agent's NotReady pod (or a deleted one) makes its node
    # Unknown after a minute's grace (AgentStale; the Node keeps its labels: missing data moves nothing).
    # The replay says the same, at the same time, only if the trace holds the pods.
    fleet = operator_harness.Fleet(k8s, label=f"btp-{secrets.token_hex(3)}")
    names = [f"{fleet.label}-{i}" for i in range(3)]
    namespace = AGENT_NAMESPACE  # the agents run where the operator takes them for agents
    operator_harness.ensure_namespace(k8s, namespace)
    daemonset = f"agent-{fleet.label}"
    agent_daemonset.create(k8s, namespace, daemonset, AGENT_LABELS, {fleet.LABEL_KEY: fleet.label})
    hung, gone = names[0], names[1]
    recording = Recording(control_plane, k8s, tmp_path / "pods.jsonl.gz", names)
    recorder = recording.start()
    core = fleet.core

    def wait(what: str, check: Any, timeout: float = TIMEOUT) -> None:
        waiting.wait_until(check, timeout_seconds=timeout, message=what)

    def health(name: str) -> str | None:
        return (fleet.gpunode(name).get("status") or {}).get("health")

    def quiet() -> dict[str, Any]:
        return gpunode_facts.agent_status(heartbeat_seconds=300)

    try:
        fleet.policy(
            fleet.label,
            {"rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}]},
        )
        pods = {}
        for name in names:
            fleet.add_node(name, report=False)
            fleet.report(name, quiet())
            pods[name] = _agent_pod(core, namespace, name)
        wait("every node Healthy", lambda: all(health(n) == "Healthy" for n in names))
        _set_ready(core, namespace, pods[hung], False)  # its probe fails: a hung NVML call
        core.delete_namespaced_pod(pods[gone], namespace, grace_period_seconds=0)
        for name in (hung, gone):
            wait(f"{name} Unknown", lambda n=name: health(n) == "Unknown", timeout=120)
        # The replay's timer steps by TICK on the trace's clock, not in phase with the live one: the agent
        # must stay down for more than a tick after live judged it stale for the replay's timer to see it.
        waiting.holds(
            lambda: health(hung) == "Unknown", seconds=3 * TICK, message=f"{hung} stays Unknown while down"
        )
        _set_ready(core, namespace, pods[hung], True)  # the agent is back
        _heartbeats(fleet, recorder, {hung: quiet()})
        wait(f"{hung} Healthy again", lambda: health(hung) == "Healthy")
        _heartbeats(fleet, recorder, {names[2]: quiet()})
        # The Warnings: each stale agent's "AgentStale cleared" (Normal) follows once it is back (issue 45).
        said = {
            name: [e for e in fleet.events(name, "AgentStale") if e["type"] == "Warning"] for name in names
        }
    finally:
        recording.stop()
        policy = _policy(fleet)
        agent_daemonset.delete(k8s, namespace, daemonset)
        fleet.cleanup()

    with traces.open_trace(recording.trace) as (_, records):
        recorded = [(r["name"], r.get("ready"), r.get("deleted")) for r in records if r["kind"] == "agentpod"]
    assert (f"{namespace}/{pods[hung]}", False, None) in recorded, recorded
    assert (f"{namespace}/{pods[gone]}", None, True) in recorded, recorded
    live = liveactions.actions(recording.seen.versions, fleet.label)
    assert {name: len(events) for name, events in said.items()} == {hung: 1, gone: 1, names[2]: 0}

    result = _replayed_as_live(recording.trace, policy, live, names)
    replayed = {
        e["node"]: e["t"]
        for e in result.events
        if e["reason"] == "AgentStale" and " cleared: " not in e["message"]
    }
    assert replayed.keys() == {hung, gone}, result.events
    for name in (hung, gone):
        at = timestamps.parse(said[name][0].get("eventTime") or said[name][0]["firstTimestamp"])
        assert abs(at - recorder.started_at - replayed[name]) <= 2.0, (
            name,
            at - recorder.started_at,
            replayed,
        )


def _publish_slice(fleet: operator_harness.Fleet, node: str) -> None:
    """The node's ResourceSlice as the NVIDIA DRA driver publishes it (a device per GPU, by UUID)."""
    body = gpunode_facts.resource_slice(node, 8)
    fleet.custom.create_cluster_custom_object(dra.GROUP, dra.VERSION, "resourceslices", body)


def _delete_slice(fleet: operator_harness.Fleet, node: str) -> None:
    try:
        fleet.custom.delete_cluster_custom_object(
            dra.GROUP, dra.VERSION, "resourceslices", dra.slice_name(node)
        )
    except client.ApiException as error:
        if error.status != 404:
            raise


def test_the_backtest_isolates_the_gpu_the_live_operator_isolated_on_a_dra_node(
    operator: operator_harness.OperatorProcess,
    control_plane: local.ControlPlane,
    k8s: client.ApiClient,
    tmp_path: Path,
) -> None:
    fleet = operator_harness.Fleet(k8s, label=f"btd-{secrets.token_hex(3)}")
    gpu_node, plugin_node = f"{fleet.label}-dra", f"{fleet.label}-plugin"
    recording = Recording(control_plane, k8s, tmp_path / "dra.jsonl.gz", (gpu_node, plugin_node))
    recorder = recording.start()
    node = fleet.node

    def wait(what: str, check: Any) -> None:
        waiting.wait_until(check, timeout_seconds=TIMEOUT, message=what)

    def rules() -> list[dict[str, Any]]:
        listed = fleet.custom.list_cluster_custom_object(
            device_taints.GROUP,
            "v1beta2",
            device_taints.PLURAL,
            label_selector=f"{keys.NODE_LABEL}={gpu_node}",
        )
        return list(listed["items"])

    try:
        for name in (gpu_node, plugin_node):
            fleet.add_node(name)
        _publish_slice(fleet, gpu_node)
        fleet.policy(
            fleet.label,
            {
                "maxUnavailable": 1,
                "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "IsolateGPU"}],
                "isolation": {"maxGPUsPerNode": 2, "effect": "NoSchedule"},
                "drain": {"timeoutSeconds": 30, "force": True},
                "recovery": {"uncordon": True, "healthyForSeconds": 2},
            },
        )
        wait(
            "both nodes labelled healthy",
            lambda: all(
                node(n)["metadata"]["labels"].get(keys.HEALTH_LABEL) == "healthy" for n in fleet.names
            ),
        )
        for name in (gpu_node, plugin_node):
            fleet.report(name, gpunode_facts.agent_status(overrides={3: ECC}))
        wait(f"GPU 3 of {gpu_node} isolated", lambda: len(rules()) == 1)
        wait(f"{plugin_node} drained", lambda: node(plugin_node)["spec"].get("unschedulable"))
        assert not node(gpu_node)["spec"].get("unschedulable"), "the DRA node stays in service"
        for name in (gpu_node, plugin_node):
            fleet.report(name, gpunode_facts.agent_status())  # a driver reload reset the volatile counter
        wait(f"GPU 3 of {gpu_node} restored", lambda: rules() == [])
        wait(f"{plugin_node} uncordoned", lambda: not node(plugin_node)["spec"].get("unschedulable"))
        _heartbeats(fleet, recorder, {name: gpunode_facts.agent_status() for name in (gpu_node, plugin_node)})
    finally:
        recording.stop()
        policy = _policy(fleet)
        _delete_slice(fleet, gpu_node)
        fleet.cleanup()

    with traces.open_trace(recording.trace) as (_, records):
        recorded = list(records)
    assert any(r["kind"] == "resourceslice" and r["object"]["spec"]["nodeName"] == gpu_node for r in recorded)
    assert any(r["kind"] == "cluster" and r["deviceTaintRules"]["actedOn"] for r in recorded), recorded[:3]
    live = liveactions.from_trace(recorded, fleet.label)
    did = liveactions.sequence(live, health=False)
    assert did[gpu_node] == ["Isolate GPU 3", "Restore GPU 3"], did
    assert did[plugin_node] == ["Drain", "Uncordon"], did

    _replayed_as_live(recording.trace, policy, live, (gpu_node, plugin_node))


def test_record_ends_with_a_complete_trace_on_ctrl_c_and_at_its_bounds(
    crds: local.ControlPlane, k8s: client.ApiClient, tmp_path: Path
) -> None:
    fleet = operator_harness.Fleet(k8s, label=f"rec-{secrets.token_hex(3)}")
    script = Path(sys.executable).parent / "gpu-health-sim"
    record = [str(script), "record", "--kubeconfig", str(crds.kubeconfig), "--out"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*record, *args], check=False, capture_output=True, text=True, timeout=60)

    def read(path: Path) -> list[dict[str, Any]]:
        with traces.open_trace(path) as (_, records):
            return list(records)

    def read_growing() -> list[dict[str, Any]]:
        """The records of a recording in progress: each is flushed (a gzip sync flush) as written."""
        text = zlib.decompressobj(wbits=31).decompress((tmp_path / "i.jsonl.gz").read_bytes()).decode()
        lines = text.split("\n")[1:-1]  # after the header; the last piece is incomplete or empty
        return [json.loads(line) for line in lines]

    try:
        for i in range(2):
            fleet.add_node(f"{fleet.label}-{i}")
        timed = run(str(tmp_path / "t.jsonl.gz"), "--max-seconds", "2")
        assert timed.returncode == 0 and "(max-seconds)" in timed.stdout, timed.stderr
        names = {r["name"] for r in read(tmp_path / "t.jsonl.gz") if r["kind"] == "gpunode"}
        assert {f"{fleet.label}-{i}" for i in range(2)} <= names

        sized = run(str(tmp_path / "s.jsonl"), "--max-bytes", "1")
        assert sized.returncode == 0 and "1 records (max-bytes)" in sized.stdout, sized.stderr
        assert len(read(tmp_path / "s.jsonl")) == 1

        with subprocess.Popen(
            [*record, str(tmp_path / "i.jsonl.gz")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        ) as process:
            assert process.stderr is not None and "recording to" in process.stderr.readline()
            fleet.report(f"{fleet.label}-0", gpunode_facts.agent_status(overrides={1: ECC}))
            waiting.wait_until(
                lambda: any(r.get("name") == f"{fleet.label}-0" and "patch" in r for r in read_growing()),
                timeout_seconds=TIMEOUT,
                message="the new report recorded",
            )
            process.send_signal(signal.SIGINT)
            out, _ = process.communicate(timeout=30)
        assert process.returncode == 0 and "(stopped)" in out
        patches = [r["patch"] for r in read(tmp_path / "i.jsonl.gz") if "patch" in r]
        assert {"ecc": {"uncorrectedVolatile": 1}}.items() <= patches[-1]["gpus"]["1"].items()
    finally:
        fleet.cleanup()
