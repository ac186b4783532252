"""A drain with every Event refused still ends Drained, and its Event follows later (issue 24, item 11).

An admission policy refuses every Event in `default` (where Node Events go),
as an Event quota or a webhook would. The node is cordoned and drained
all the same, reaches `Drained` and stays there (it does not drain again every
pass, waiting for an Event to be accepted). Once the refusal is lifted, the
`NodeDrained` Event is said, once.
"""

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

import gpunode_facts
import operator_fixtures
import operator_harness
from gpuhealth_sim import waiting

pytestmark = pytest.mark.integration

TIMEOUT = 30.0
REFUSAL = "gpu-health-test-no-events"


operator = operator_fixtures.operator_fixture("events-refused")
fleet = operator_fixtures.fleet_fixture("noev")


@pytest.fixture
def events_refused(k8s: client.ApiClient) -> Iterator[None]:
    """No Event may be created in `default` while this admission policy stands (the API server says no).

    (An Event ResourceQuota would not do: the quota admission ignores Events.)
    """
    api = client.AdmissionregistrationV1Api(k8s)
    api.create_validating_admission_policy(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": REFUSAL},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["events"],
                        }
                    ]
                },
                "validations": [{"expression": "false", "message": "exceeded quota: events"}],
            },
        }
    )
    api.create_validating_admission_policy_binding(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": REFUSAL},
            "spec": {
                "policyName": REFUSAL,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "default"}}
                },
            },
        }
    )
    try:
        yield
    finally:
        lift(k8s)


def lift(k8s: client.ApiClient) -> None:
    api = client.AdmissionregistrationV1Api(k8s)
    for delete in (api.delete_validating_admission_policy_binding, api.delete_validating_admission_policy):
        try:
            delete(REFUSAL)
        except client.ApiException as error:
            if error.status != 404:
                raise


def event_refused(k8s: client.ApiClient) -> bool:
    """Whether an Event create in `default` is refused now."""
    body = client.CoreV1Event.from_dict(
        {
            "metadata": {"generateName": "probe-", "namespace": "default"},
            "involvedObject": {"kind": "Node", "name": "probe"},
            "reason": "Probe",
            "message": "probe",
        }
    )
    try:
        client.CoreV1Api(k8s).create_namespaced_event("default", body)
    except client.ApiException as error:
        if error.status in (403, 422):
            return True
        raise
    return False


def action(fleet: operator_harness.Fleet, name: str) -> Any:
    return (fleet.gpunode(name).get("status") or {}).get("action")


def test_a_drain_with_every_event_refused_ends_drained_and_the_event_follows(
    fleet: operator_harness.Fleet,
    k8s: client.ApiClient,
    namespace: str,
    events_refused: None,
) -> None:
    name = f"{fleet.label}-n"
    fleet.add_node(name)
    body = client.V1Pod.from_dict(
        {
            "metadata": {"name": "job", "namespace": namespace},
            "spec": {
                "nodeName": name,
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                "terminationGracePeriodSeconds": 0,
            },
        }
    )
    assert body is not None
    client.CoreV1Api(k8s).create_namespaced_pod(namespace, body)
    waiting.wait_until(lambda: event_refused(k8s), timeout_seconds=TIMEOUT, message="Events refused")
    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": 1,
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
            "drain": {"timeoutSeconds": 120, "force": True},  # the pod has no controller
        },
    )
    fleet.report(name, gpunode_facts.agent_status(overrides={0: {"ecc": {"uncorrectedVolatile": 1}}}))
    waiting.wait_until(
        lambda: action(fleet, name) == "Drained", timeout_seconds=TIMEOUT, message="Drained without Events"
    )
    waiting.holds(
        lambda: action(fleet, name) == "Drained",
        seconds=3,
        interval_seconds=0.2,
        message="stays Drained while Events are refused",
    )
    assert not fleet.events(name, "NodeDrained")

    lift(k8s)
    waiting.wait_until(lambda: not event_refused(k8s), timeout_seconds=TIMEOUT, message="Events accepted")
    waiting.wait_until(
        lambda: fleet.events(name, "NodeDrained"), timeout_seconds=TIMEOUT, message="NodeDrained said later"
    )
    (drained,) = fleet.events(name, "NodeDrained")
    assert drained["count"] == 1
    assert action(fleet, name) == "Drained"
