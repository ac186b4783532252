"""Drain parity with `kubectl drain --ignore-daemonsets --delete-emptydir-data`, on the real control plane.

One operator process serves the module. The table test gives every case its
own kwok Node, pods and policy (selecting only that Node), faults all Nodes at
once and then checks, per case, what a cluster user sees: which pods left the
Node, which stayed, the GPUNode's `status.action` and the drain's Event.
Pods "with a controller" belong to a real ReplicaSet pinned to the Node by a
nodeSelector, so an evicted one comes back Pending (the Node is cordoned).
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

import apiserver_requests
import gpunode_facts
import namespaces
import operator_fixtures
import operator_harness
from gpuhealth_sim import waiting

pytestmark = pytest.mark.integration

TIMEOUT = 40.0
CASE_LABEL = "gpuhealth.io/drain-case"
HOLD_FINALIZER = "gpuhealth.io/test-hold"
"""Keeps an evicted pod Terminating, as a kubelet honouring a long grace period would."""
KWOK_STATUS = "kwok.x-k8s.io/status"
ECC = {"ecc": {"uncorrectedVolatile": 1}}
PAUSE = [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]


operator = operator_fixtures.operator_fixture("drain-it")
fleet = operator_fixtures.fleet_fixture("drain")


@dataclasses.dataclass
class Setting:
    """Where one case's pods go: its Node, the test namespace and a second one."""

    k8s: client.ApiClient
    node: str
    case: str
    namespace: str
    other_namespace: str

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.k8s)


def bare_pod(
    setting: Setting,
    name: str,
    *,
    namespace: str | None = None,
    status: dict[str, Any] | None = None,
    **spec: Any,
) -> None:
    """A pod bound to the Node, with no controller (`kubectl run`); kwok leaves a given `status` alone."""
    name = f"{name}-{setting.case}"
    metadata: dict[str, Any] = {"name": name, "namespace": namespace or setting.namespace}
    metadata.update(spec.pop("metadata", {}))
    if status is not None:
        metadata["annotations"] = {KWOK_STATUS: "custom", **metadata.get("annotations", {})}
    body = {
        "metadata": metadata,
        "spec": {"nodeName": setting.node, "containers": PAUSE, "terminationGracePeriodSeconds": 0, **spec},
    }
    setting.core.create_namespaced_pod(metadata["namespace"], body)
    if status is not None:
        setting.core.patch_namespaced_pod_status(name, metadata["namespace"], {"status": status})


def controlled_pods(
    setting: Setting, name: str, *, labels: dict[str, str] | None = None, **spec: Any
) -> None:
    """A one-replica ReplicaSet whose pod the scheduler puts on the Node (and nowhere else)."""
    selector = {"app": name, CASE_LABEL: setting.case}
    body = {
        "metadata": {"name": f"{name}-{setting.case}", "namespace": setting.namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": {**selector, **(labels or {})}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": setting.node},
                    "containers": PAUSE,
                    "terminationGracePeriodSeconds": 0,
                    **spec,
                },
            },
        },
    }
    client.AppsV1Api(setting.k8s).create_namespaced_replica_set(setting.namespace, body)


def daemonset(setting: Setting, name: str) -> None:
    labels = {"app": name, CASE_LABEL: setting.case}
    body = {
        "metadata": {"name": name, "namespace": setting.namespace},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"nodeSelector": {CASE_LABEL: setting.case}, "containers": PAUSE},
            },
        },
    }
    client.AppsV1Api(setting.k8s).create_namespaced_daemon_set(setting.namespace, body)


def pdb(setting: Setting, name: str, app: str) -> None:
    body = {
        "metadata": {"name": name, "namespace": setting.namespace},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"guard": app}}},
    }
    client.PolicyV1Api(setting.k8s).create_namespaced_pod_disruption_budget(setting.namespace, body)


def with_daemonset_and_mirror_pod(s: Setting) -> None:
    controlled_pods(s, "web")
    daemonset(s, "agent")
    bare_pod(s, "static", metadata={"annotations": {"kubernetes.io/config.mirror": "0123abcd"}})


def with_bare_pod(s: Setting) -> None:
    controlled_pods(s, "web")
    bare_pod(s, "notebook")


def with_empty_dir(s: Setting) -> None:
    controlled_pods(s, "scratch", volumes=[{"name": "tmp", "emptyDir": {}}])


def with_finished_pods(s: Setting) -> None:
    controlled_pods(s, "web")
    terminated = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    bare_pod(
        s,
        "done",
        restartPolicy="Never",
        status={
            "phase": "Succeeded",
            "containerStatuses": [
                {
                    "name": "main",
                    "image": "pause",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": terminated,
                }
            ],
        },
    )
    failed = {"terminated": {"exitCode": 1, "reason": "Error"}}
    bare_pod(
        s,
        "crashed",
        restartPolicy="Never",
        status={
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "main",
                    "image": "pause",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": failed,
                }
            ],
        },
    )


def with_two_pdbs(s: Setting) -> None:
    app = f"guarded-{s.case}"
    controlled_pods(s, "guarded", labels={"guard": app})
    pdb(s, "guard-a", app)
    pdb(s, "guard-b", app)


def with_long_grace_period(s: Setting) -> None:
    bare_pod(s, "slow", terminationGracePeriodSeconds=86_400, metadata={"finalizers": [HOLD_FINALIZER]})


def with_excluded_namespace(s: Setting) -> None:
    controlled_pods(s, "web")
    bare_pod(s, "site-agent", namespace=s.other_namespace)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    setup: Callable[[Setting], None]
    drain: dict[str, Any]
    evicted: tuple[str, ...]
    """Pods (by name prefix, in the test namespace) that must leave the Node."""
    kept: tuple[str, ...]
    """Pods (by name prefix, any namespace) that must still be on the Node once the drain ended."""
    action: str
    event: str
    says: tuple[str, ...] = ()
    """Text the Event's message must contain ({ns} and {other} stand for the namespaces)."""


CASES = [
    Case(
        "ds-mirror",
        with_daemonset_and_mirror_pod,
        {},
        ("web",),
        ("agent", "static"),
        "Drained",
        "NodeDrained",
    ),
    Case(
        "bare",
        with_bare_pod,
        {},
        ("web",),
        ("notebook",),
        "Cordoned",
        "DrainFailed",
        ("{ns}/notebook", "no controller", "drain.force"),
    ),
    Case("bare-forced", with_bare_pod, {"force": True}, ("web", "notebook"), (), "Drained", "NodeDrained"),
    Case("emptydir", with_empty_dir, {}, ("scratch",), (), "Drained", "NodeDrained"),
    Case("finished", with_finished_pods, {}, ("web",), ("done", "crashed"), "Drained", "NodeDrained"),
    Case(
        "two-pdbs",
        with_two_pdbs,
        {"timeoutSeconds": 6},
        (),
        ("guarded",),
        "Cordoned",
        "DrainFailed",
        ("{ns}/guarded", "more than one PodDisruptionBudget"),
    ),
    Case(
        "long-grace",
        with_long_grace_period,
        {"timeoutSeconds": 6, "force": True},
        (),
        ("slow",),
        "Cordoned",
        "DrainFailed",
        ("{ns}/slow", "terminating"),
    ),
    Case(
        "excluded-ns",
        with_excluded_namespace,
        {"force": True, "excludeNamespaces": ["{other}"]},
        ("web",),
        ("site-agent",),
        "Drained",
        "NodeDrained",
        ("{other}/site-agent", "excluded namespace"),
    ),
]


def pods_on(k8s: client.ApiClient, node: str) -> list[dict[str, Any]]:
    """Pods bound to `node`, as {namespace, name, terminating}."""
    items = client.CoreV1Api(k8s).list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    return [
        {
            "namespace": p.metadata.namespace,
            "name": p.metadata.name,
            "terminating": bool(p.metadata.deletion_timestamp),
        }
        for p in items
    ]


def on_node(k8s: client.ApiClient, node: str, prefix: str, namespace: str | None = None) -> bool:
    return any(
        p["name"].startswith(prefix) and (namespace is None or p["namespace"] == namespace)
        for p in pods_on(k8s, node)
    )


@contextlib.contextmanager
def other_namespace(k8s: client.ApiClient) -> Iterator[str]:
    with namespaces.created(k8s, f"drain-other-{secrets.token_hex(3)}") as name:
        try:
            yield name
        finally:
            release_held_pods(k8s, name)


def release_held_pods(k8s: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(k8s)
    for pod in core.list_namespaced_pod(namespace).items:
        if HOLD_FINALIZER in (pod.metadata.finalizers or []):
            with contextlib.suppress(client.ApiException):
                core.patch_namespaced_pod(pod.metadata.name, namespace, {"metadata": {"finalizers": None}})


def case_policy(fleet: operator_harness.Fleet, case: str, drain: dict[str, Any]) -> None:
    fleet.policy(
        f"{fleet.label}-{case}",
        {
            "nodeSelector": {
                "matchLabels": {operator_harness.Fleet.LABEL_KEY: fleet.label, CASE_LABEL: case}
            },
            "maxUnavailable": 1,
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
            "drain": {"timeoutSeconds": 60, **drain},
            "recovery": {"uncordon": False},
        },
    )


def test_drain_matches_kubectl_drain(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, namespace: str
) -> None:
    with other_namespace(k8s) as other:
        try:
            run_cases(fleet, k8s, namespace, other)
        finally:
            release_held_pods(k8s, namespace)


def run_cases(fleet: operator_harness.Fleet, k8s: client.ApiClient, namespace: str, other: str) -> None:
    fill = {"ns": namespace, "other": other}
    settings: dict[str, Setting] = {}
    for case in CASES:
        node = f"{fleet.label}-{case.name}"
        fleet.add_node(node, labels={CASE_LABEL: case.name})
        drain = {
            k: [x.format(**fill) for x in v] if isinstance(v, list) else v for k, v in case.drain.items()
        }
        case_policy(fleet, case.name, drain)
        settings[case.name] = Setting(k8s, node, case.name, namespace, other)
        case.setup(settings[case.name])
    for case in CASES:
        node = settings[case.name].node
        expected = case.evicted + case.kept
        waiting.wait_until(
            lambda node=node, expected=expected: all(on_node(k8s, node, p) for p in expected),
            timeout_seconds=TIMEOUT,
            message=f"{case.name}: pods {expected} on the node",
        )
    for case in CASES:
        fleet.report(settings[case.name].node, gpunode_facts.agent_status(overrides={0: ECC}))

    failures = []
    for case in CASES:
        node = settings[case.name].node
        try:
            events = waiting.wait_until(
                lambda node=node, case=case: fleet.events(node, case.event),
                timeout_seconds=TIMEOUT,
                message=f"{case.name}: Event {case.event}",
            )
            waiting.wait_until(
                lambda node=node, case=case: (
                    (fleet.gpunode(node).get("status") or {}).get("action") == case.action
                ),
                timeout_seconds=TIMEOUT,
                message=f"{case.name}: action {case.action}",
            )
            message = events[0]["message"]
            for text in case.says:
                assert text.format(**fill) in message, f"{case.name}: {text!r} not in {message!r}"
            for prefix in case.evicted:
                waiting.wait_until(
                    lambda node=node, prefix=prefix: not on_node(k8s, node, prefix, namespace),
                    timeout_seconds=TIMEOUT,
                    message=f"{case.name}: {prefix} evicted",
                )
            for prefix in case.kept:
                assert on_node(k8s, node, prefix), f"{case.name}: {prefix} must stay on the node"
        except (AssertionError, TimeoutError) as error:
            failures.append(str(error))
    assert not failures, "\n".join(failures)


def test_waiting_for_a_terminating_pod_backs_off(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, namespace: str
) -> None:
    node = f"{fleet.label}-wait"
    fleet.add_node(node, labels={CASE_LABEL: "wait"})
    case_policy(fleet, "wait", {"force": True, "timeoutSeconds": 120})
    setting = Setting(k8s, node, "wait", namespace, namespace)
    try:
        with_long_grace_period(setting)
        waiting.wait_until(
            lambda: on_node(k8s, node, "slow"), timeout_seconds=TIMEOUT, message="pod on the node"
        )
        fleet.report(node, gpunode_facts.agent_status(overrides={0: ECC}))
        waiting.wait_until(
            lambda: any(p["terminating"] for p in pods_on(k8s, node)),
            timeout_seconds=TIMEOUT,
            message="the pod evicted, terminating",
        )
        time.sleep(3)  # not synchronisation: the drain's first, quick looks are allowed
        before, started = apiserver_requests.pod_lists(k8s), time.monotonic()
        time.sleep(12)  # the window measured
        lists = apiserver_requests.pod_lists(k8s) - before
        elapsed = time.monotonic() - started
        # Polling every 0.5 s would be ~24 lists here; backing off to 5 s, at most a handful.
        assert lists <= 6, f"{lists:g} pod lists in {elapsed:.0f}s while one pod terminates"
        assert (fleet.gpunode(node).get("status") or {}).get("action") == "Draining"
    finally:
        release_held_pods(k8s, namespace)
