"""An API-server outage longer than the Lease: the operator stops, campaigns again and finishes the work.

The real kube-apiserver is stopped for OUTAGE_SECONDS (20 s, longer than the
production lease duration of 15 s that the operator runs with here; the 60 s
of the issue only makes CI slower, the operator's behaviour is the same once
the outage outlasts the Lease). Meanwhile a GPU on one node suffers a
double-bit ECC error and another node's thermal episode ends. The agents
cannot write during the outage; like the real agent (its reporter keeps the
latest facts and retries with a backoff) they write them as soon as the API
server answers again. After that the DBE node must be cordoned and drained
and the thermal label removed, by the same operator process (no restart),
with one Event per action, within one lease duration of the API server's
return.
"""

import datetime
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

import gpunode_facts
import operator_fixtures
import operator_harness
from gpuhealth_api import keys
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

TIMEOUT = 30.0
OUTAGE_SECONDS = 20.0
LEASE_DURATION_SECONDS = 15.0
"""The production defaults: 15 s lease, 10 s renew deadline, 2 s retry."""
ECC = {3: {"ecc": {"uncorrectedVolatile": 1}}}
HOT = {4: {"temperatureCelsius": 93, "clockEventReasons": ["HwThermalSlowdown"], "smClockMHz": 1400}}


@pytest.fixture
def fleet(k8s: client.ApiClient) -> Iterator[operator_harness.Fleet]:
    with operator_harness.Fleet(k8s, label=f"outage-{secrets.token_hex(3)}") as nodes:
        yield nodes


operator = operator_fixtures.operator_fixture(
    "outage", ["--tick-seconds=0.5"], scope="function", log_tail=15000
)


Milestones = dict[str, Callable[[operator_harness.Fleet], bool]]


class Returning:
    """In a thread: notice the API server's return at once, write what the agents kept, time the milestones.

    The main thread is busy restarting the API server and its dependents
    meanwhile; timing from here measures from the moment it answers.
    """

    def __init__(
        self,
        plane: local.ControlPlane,
        label: str,
        facts: dict[str, dict[str, Any]],
        milestones: Milestones,
    ) -> None:
        self.plane = plane
        self.label = label
        self.facts = facts
        self.milestones = milestones
        self.after: dict[str, float] = {}
        """milestone → seconds from the API server's return until it was first seen."""
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Returning":
        self._thread.start()
        return self

    def join(self) -> None:
        self._thread.join(OUTAGE_SECONDS + 2 * TIMEOUT)
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        api = self.plane.api_client()
        try:
            version = client.VersionApi(api)
            while True:
                try:
                    version.get_code(_request_timeout=1)
                    break
                except Exception:
                    time.sleep(0.05)
            ready_at = time.monotonic()
            agents = operator_harness.Fleet(api, label=self.label)
            for name, status in self.facts.items():
                waiting.wait_until(
                    lambda name=name, status=status: _tries(agents.report, name, status),
                    timeout_seconds=TIMEOUT,
                    message=f"the agent of {name} writes",
                )
            deadline = ready_at + TIMEOUT
            while len(self.after) < len(self.milestones) and time.monotonic() < deadline:
                for milestone, reached in self.milestones.items():
                    if milestone not in self.after and _quietly(reached, agents):
                        self.after[milestone] = time.monotonic() - ready_at
                time.sleep(0.05)
        except BaseException as error:
            self.error = error
        finally:
            api.close()  # type: ignore[no-untyped-call]


def _quietly(reached: Callable[[operator_harness.Fleet], bool], fleet: operator_harness.Fleet) -> bool:
    try:
        return reached(fleet)
    except client.ApiException:
        return False


def _tries(report: Any, name: str, status: dict[str, Any]) -> bool:
    """One write of an agent that retries: True once it went through."""
    try:
        report(name, status)
    except client.ApiException:
        return False
    return True


def test_an_api_outage_longer_than_the_lease_costs_no_restart_and_loses_no_action(
    crds: local.ControlPlane,
    k8s: client.ApiClient,
    operator: operator_harness.OperatorProcess,
    fleet: operator_harness.Fleet,
    namespace: str,
) -> None:
    dbe, hot = f"{fleet.label}-dbe", f"{fleet.label}-hot"
    for name in (dbe, hot):
        fleet.add_node(name)
    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": 2,
            "rules": [
                {"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"},
                {"name": "thermal", "condition": "ThermalThrottled", "action": "Label", "forSeconds": 0},
            ],
            "drain": {"timeoutSeconds": 30, "force": True},  # the workload is a bare pod
            "recovery": {"uncordon": True, "healthyForSeconds": 1},
        },
    )
    core = client.CoreV1Api(k8s)
    pod = client.V1Pod.from_dict(
        {
            "metadata": {"name": "workload", "namespace": namespace},
            "spec": {
                "nodeName": dbe,
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                "terminationGracePeriodSeconds": 0,
            },
        }
    )
    assert pod is not None
    core.create_namespaced_pod(namespace, pod)
    fleet.report(hot, gpunode_facts.agent_status(overrides=HOT))
    waiting.wait_until(
        lambda: labels(fleet, hot).get(keys.THERMAL_LABEL) == "true",
        timeout_seconds=TIMEOUT,
        message="thermal label",
    )
    waiting.wait_until(
        lambda: labels(fleet, dbe).get(keys.HEALTH_LABEL) == "healthy",
        timeout_seconds=TIMEOUT,
        message="dbe judged",
    )
    waiting.wait_until(
        lambda: getattr(core.read_namespaced_pod("workload", namespace).status, "phase", None) == "Running",
        timeout_seconds=TIMEOUT,
        message="the workload runs",
    )
    pid = operator.process.pid if operator.process else None
    waiting.wait_until(
        lambda: "gpuhealth_operator_nodes{" in operator.metrics(),
        timeout_seconds=TIMEOUT,
        message="the leader exports the fleet gauges",
    )
    assert re.search(r"^gpuhealth_operator_passes_waiting \d", operator.metrics(), re.M), "passes waiting"

    crds.stop_apiserver()
    restarted = False
    try:
        stopped_at = time.monotonic()
        # What the agents see during the outage, stamped when seen; they keep it until they can write.
        seen = gpunode_facts.rfc3339(datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=2))
        facts = {
            dbe: gpunode_facts.agent_status(overrides=ECC, observed=seen),
            hot: gpunode_facts.agent_status(observed=seen),
        }
        waiting.wait_until(
            lambda: not operator.is_leading(),
            timeout_seconds=LEASE_DURATION_SECONDS,
            message="the leader stops acting at its renew deadline",
        )
        stopped_leading_after = time.monotonic() - stopped_at
        assert operator.alive(), "losing the Lease costs no restart"
        assert operator.healthz(), "health and metrics keep serving while it campaigns"
        # Its last term's counts are stale: summed with a new leader's they would double-count.
        scraped = operator.metrics()
        assert "gpuhealth_operator_leader 0.0" in scraped, scraped
        assert "gpuhealth_operator_nodes{" not in scraped, "a standby exports no fleet gauges"
        assert "gpuhealth_operator_passes_waiting 0.0" in scraped, "a standby has no passes waiting"
        # The outage itself lasts this long (a scenario duration, not a synchronisation).
        time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - stopped_at)))

        milestones: Milestones = {
            "leading again": lambda _: operator.is_leading(),
            "DBE node cordoned": lambda nodes: cordoned(nodes, dbe),
            "thermal label removed": lambda nodes: keys.THERMAL_LABEL not in labels(nodes, hot),
            "DBE node drained": lambda nodes: bool(nodes.events(dbe, "NodeDrained")),
        }
        returning = Returning(crds, fleet.label, facts, milestones).start()
        crds.start_apiserver()
        restarted = True
    finally:
        if not restarted:  # the control plane is shared: never leave it down
            crds.start_apiserver()
    returning.join()
    print(
        f"outage {OUTAGE_SECONDS:g}s: stopped acting {stopped_leading_after:.1f}s into it; after the API "
        "server's return: " + ", ".join(f"{m} {s:.1f}s" for m, s in returning.after.items())
    )
    assert set(returning.after) == set(milestones), f"reached only {returning.after}"
    cordoned_after = returning.after["DBE node cordoned"]
    assert cordoned_after < LEASE_DURATION_SECONDS
    assert returning.after["leading again"] < LEASE_DURATION_SECONDS
    assert operator.alive()
    assert operator.process is not None and operator.process.pid == pid
    assert "campaigning again" in operator.log()
    assert [p.metadata.name for p in core.list_namespaced_pod(namespace).items if p.metadata] == []
    for name, reason in (
        (dbe, "NodeCordoned"),
        (dbe, "NodeDrained"),
        (dbe, "EccUncorrectable"),
        (hot, "ThermalThrottled"),
    ):
        events = [e for e in fleet.events(name, reason) if "cleared" not in e["message"]]
        assert [e["count"] for e in events] == [1], f"{reason} on {name}: {events}"
    # The hot node cooled during the outage: its clearing is a decision of its own, said once.
    cleared = [e for e in fleet.events(hot, "ThermalThrottled") if "cleared" in e["message"]]
    assert [(e["type"], e["count"]) for e in cleared] == [("Normal", 1)], cleared


def labels(fleet: operator_harness.Fleet, name: str) -> dict[str, str]:
    return fleet.node(name)["metadata"].get("labels") or {}


def cordoned(fleet: operator_harness.Fleet, name: str) -> bool:
    return bool(fleet.node(name)["spec"].get("unschedulable"))
