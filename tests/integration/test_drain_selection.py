"""A drain stops when its policy stops selecting the node, as for the exclude label (issue 24, item 4).

A node is being drained (its pod's PodDisruptionBudget refuses the eviction,
so the drain keeps retrying) when someone relabels it out of the policy's
`nodeSelector`. Within 2 s the drain stops (Event `RemediationPaused` saying
the policy no longer selects the node), no eviction request follows, and the
cordon stays.
"""

import time

import pytest
from kubernetes import client

import gpunode_facts
import operator_fixtures
import operator_harness
from gpuhealth_sim import waiting

pytestmark = pytest.mark.integration

TIMEOUT = 20.0
ECC = {"ecc": {"uncorrectedVolatile": 1}}


operator = operator_fixtures.operator_fixture("selection")
fleet = operator_fixtures.fleet_fixture("sel")


def guarded_pod(k8s: client.ApiClient, namespace: str, pod: str, node: str) -> None:
    """A running pod on `node` that a PodDisruptionBudget (minAvailable 1) forbids evicting."""
    body = client.V1Pod.from_dict(
        {
            "metadata": {"name": pod, "namespace": namespace, "labels": {"app": pod}},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                "terminationGracePeriodSeconds": 0,
            },
        }
    )
    assert body is not None
    client.CoreV1Api(k8s).create_namespaced_pod(namespace, body)
    pdb = client.V1PodDisruptionBudget.from_dict(
        {
            "metadata": {"name": pod, "namespace": namespace},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": pod}}},
        }
    )
    assert pdb is not None
    client.PolicyV1Api(k8s).create_namespaced_pod_disruption_budget(namespace, pdb)
    waiting.wait_until(
        lambda: (
            (s := client.PolicyV1Api(k8s).read_namespaced_pod_disruption_budget(pod, namespace).status)
            and s.current_healthy == 1
        ),
        timeout_seconds=TIMEOUT,
        message="the PDB sees the pod",
    )


def eviction_attempts(operator: operator_harness.OperatorProcess) -> float:
    """Eviction requests the operator has sent so far (every result), from its /metrics."""
    total = 0.0
    for line in operator.metrics().splitlines():
        if line.startswith("gpuhealth_operator_evictions_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def cordoned(fleet: operator_harness.Fleet, name: str) -> bool:
    return bool(fleet.node(name)["spec"].get("unschedulable"))


def test_a_node_relabelled_out_of_the_policy_stops_its_drain_within_2s_and_keeps_the_cordon(
    fleet: operator_harness.Fleet,
    k8s: client.ApiClient,
    namespace: str,
    operator: operator_harness.OperatorProcess,
) -> None:
    name = f"{fleet.label}-n"
    fleet.add_node(name)
    guarded_pod(k8s, namespace, "guarded", name)
    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": 1,
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
            "drain": {"timeoutSeconds": 600, "force": True},
        },
    )
    before = eviction_attempts(operator)
    fleet.report(name, gpunode_facts.agent_status(overrides={0: ECC}))
    waiting.wait_until(
        lambda: eviction_attempts(operator) >= before + 2,
        timeout_seconds=TIMEOUT,
        message="the drain retries the refused eviction",
    )

    fleet.core.patch_node(name, {"metadata": {"labels": {fleet.LABEL_KEY: f"{fleet.label}-elsewhere"}}})
    relabelled = time.monotonic()
    paused = waiting.wait_until(
        lambda: fleet.events(name, "RemediationPaused"),
        timeout_seconds=TIMEOUT,
        message="RemediationPaused Event: the drain stopped",
    )
    assert time.monotonic() - relabelled < 2.5, "the drain stops within 2 s"
    assert "no longer selects the node" in " ".join(e["message"] for e in paused)
    attempts = eviction_attempts(operator)
    waiting.holds(
        lambda: eviction_attempts(operator) == attempts and cordoned(fleet, name),
        seconds=8,
        interval_seconds=0.5,
        message="no eviction request after the relabel, and the node stays cordoned",
    )
