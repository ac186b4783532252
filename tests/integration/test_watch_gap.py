"""A Node deleted while the operator's watches were cut gives its budget place back.

The gap is made for real: the operator is paused (SIGSTOP), the API server
restarts (so its watch cache no longer holds the history the operator's
watches would resume from), and while the operator still sleeps a cordoned
Node, its GPUNode and a second policy are deleted. When the operator wakes
its watches resume with 410 Gone and kopf lists again, which says nothing of
the deleted objects. The operator must notice by itself (resync after a
re-list; the periodic resync is set far beyond the test), free the place the
deleted node held under maxUnavailable=1, and cordon the node that waited.
The Lease is long here so that the pause does not end the term: a new term
lists the cluster into its cache before it acts, which would hide the gap.
"""

import secrets
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

import gpunode_facts
import operator_fixtures
import operator_harness
from gpuhealth_api import resources
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

TIMEOUT = 30.0
ECC = {3: {"ecc": {"uncorrectedVolatile": 1}}}


@pytest.fixture
def fleet(k8s: client.ApiClient) -> Iterator[operator_harness.Fleet]:
    with operator_harness.Fleet(k8s, label=f"gap-{secrets.token_hex(3)}") as nodes:
        yield nodes


def _resume(process: operator_harness.OperatorProcess) -> None:
    """A test that froze the operator (SIGSTOP) and failed leaves it frozen: thaw it so it can stop."""
    if process.process is not None:
        process.process.signal(signal.SIGCONT)


operator = operator_fixtures.operator_fixture(
    "gap",
    [
        "--tick-seconds=0.5",
        "--resync-seconds=3600",
        "--lease-duration-seconds=180",
        "--lease-renew-deadline-seconds=150",
    ],
    scope="function",
    log_tail=15000,
    before_stop=_resume,
)


def policy_status(fleet: operator_harness.Fleet, name: str) -> dict[str, Any]:
    body = fleet.custom.get_cluster_custom_object(
        resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, name
    )
    return dict(body.get("status") or {})  # type: ignore[union-attr]


def cordoned(fleet: operator_harness.Fleet, name: str) -> bool:
    return bool(fleet.node(name)["spec"].get("unschedulable"))


def test_a_node_deleted_during_a_watch_gap_frees_its_budget_place(
    crds: local.ControlPlane,
    operator: operator_harness.OperatorProcess,
    fleet: operator_harness.Fleet,
) -> None:
    first, waiter, healthy = (f"{fleet.label}-{n}" for n in ("first", "waiter", "healthy"))
    for name in (first, waiter, healthy):
        fleet.add_node(name)
    rules = [{"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}]
    fleet.policy(fleet.label, {"maxUnavailable": 1, "rules": rules})
    doomed = f"{fleet.label}-doomed"
    fleet.policy(doomed, {"dryRun": True, "rules": rules})
    waiting.wait_until(
        lambda: policy_status(fleet, fleet.label).get("selectedNodes") == 3,
        timeout_seconds=TIMEOUT,
        message="the policy selects the three nodes",
    )
    fleet.report(first, gpunode_facts.agent_status(overrides=ECC))
    waiting.wait_until(lambda: cordoned(fleet, first), timeout_seconds=TIMEOUT, message="first cordoned")
    fleet.report(waiter, gpunode_facts.agent_status(overrides=ECC))
    waiting.wait_until(
        lambda: policy_status(fleet, fleet.label).get("pendingNodes") == 1,
        timeout_seconds=TIMEOUT,
        message="the second faulty node waits for the budget",
    )
    assert not cordoned(fleet, waiter)

    assert operator.process is not None
    operator.process.signal(signal.SIGSTOP)
    try:
        crds.stop_apiserver()
        crds.start_apiserver()
        fleet.core.delete_node(first)
        fleet.custom.delete_cluster_custom_object(
            resources.GROUP, resources.VERSION, resources.GPUNODE_PLURAL, first
        )
        fleet.custom.delete_cluster_custom_object(
            resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, doomed
        )
    finally:
        operator.process.signal(signal.SIGCONT)

    waiting.wait_until(
        lambda: cordoned(fleet, waiter),
        timeout_seconds=TIMEOUT,
        message="the waiting node is cordoned once the deleted node's place is free",
    )
    waiting.wait_until(
        lambda: policy_status(fleet, fleet.label).get("selectedNodes") == 2,
        timeout_seconds=TIMEOUT,
        message="the deleted node is no longer counted as selected",
    )
    log = operator.log()
    # The watches did not report the deletions: the resync found them (else nothing is tested here).
    assert f"resync: pruned what was deleted while no watch saw it: nodes {first}" in log
    assert f"policies {doomed}" in log
    assert operator.is_leading(), "the same term went on across the gap"
    assert "campaigning again" not in log
    assert not cordoned(fleet, healthy)
