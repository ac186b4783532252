"""A lost Lease and the next term: nothing decided is lost, nothing done is done twice.

The operator keeps its cache when its term ends and lists into it again when
it leads again (`priming`). Here its Lease is taken by another holder that
never renews: the operator stops acting and campaigns again. While it does
not lead, a cordoned node is deleted (it held the policy's only budget
place) and another node turns faulty. The next term must see both: the
deleted node's place is free (a complete list lacked it), so the faulty node
is cordoned, once, with one Event; the node cordoned in the first term is
neither patched nor announced again.
"""

import contextlib
import datetime
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

import gpunode_facts
import operator_harness
from gpuhealth_api import resources
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

TIMEOUT = 30.0
LEASE = [
    "--lease-duration-seconds=4",
    "--lease-renew-deadline-seconds=2",
    "--lease-renew-seconds=0.5",
    "--lease-retry-seconds=0.5",
    "--tick-seconds=0.5",
]
ECC = {0: {"ecc": {"uncorrectedVolatile": 1}}}


@pytest.fixture
def fleet(k8s: client.ApiClient) -> Iterator[operator_harness.Fleet]:
    with operator_harness.Fleet(k8s, label=f"term-{secrets.token_hex(3)}") as nodes:
        yield nodes


def take_lease(api: client.ApiClient, name: str) -> None:
    """Another holder takes the Lease and never renews it (3 s): the operator's term ends."""
    coordination = client.CoordinationV1Api(api)
    for _ in range(20):  # the operator renews between our read and our write: 409, read again
        lease = coordination.read_namespaced_lease(name, "gpu-health")
        lease.spec.holder_identity = "someone-else"
        lease.spec.lease_duration_seconds = 3
        lease.spec.renew_time = datetime.datetime.now(datetime.UTC)
        try:
            coordination.replace_namespaced_lease(name, "gpu-health", lease)
            return
        except client.ApiException as error:
            if error.status != 409:
                raise
    raise AssertionError(f"could not take Lease {name}: 20 conflicts with its holder's renewals")


def node_patches(plane: local.ControlPlane, since: datetime.datetime, node: str) -> list[str]:
    """Writes to the Node itself (cordon, labels, taint; not its status) since `since`, by the operator."""
    found = []
    for line in plane.audit_log.read_text().splitlines():
        entry: dict[str, Any] = json.loads(line)
        if entry.get("stage") != "ResponseComplete" or entry.get("verb") not in ("patch", "update"):
            continue
        if datetime.datetime.fromisoformat(entry["requestReceivedTimestamp"]) < since:
            continue
        ref = entry.get("objectRef") or {}
        ours = str(entry.get("userAgent", "")).startswith("gpu-health-operator")
        if ours and ref.get("resource") == "nodes" and ref.get("name") == node and not ref.get("subresource"):
            found.append(entry["verb"])
    return found


def test_the_next_term_keeps_every_decision_and_repeats_no_action(
    crds: local.ControlPlane, k8s: client.ApiClient, fleet: operator_harness.Fleet, tmp_path: Path
) -> None:
    operator_harness.ensure_namespace(k8s, "gpu-health")
    lease = f"gpu-health-term-{secrets.token_hex(2)}"
    operator = operator_harness.OperatorProcess(
        kubeconfig=Path(crds.kubeconfig),
        log_path=tmp_path / "operator.log",
        lease_name=lease,
        identity=f"term-{secrets.token_hex(2)}",
        extra_args=LEASE,
    ).start()
    try:
        waiting.wait_until(operator.is_leading, timeout_seconds=TIMEOUT, message="the operator leads")
        rule = {"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}
        # Two budget places: once `first` and `deleted` are cordoned, `later` can be cordoned only
        # when `deleted`'s place is free again.
        fleet.policy(fleet.label, {"maxUnavailable": 2, "rules": [rule]})
        first, deleted, later = (f"{fleet.label}-{n}" for n in ("first", "deleted", "later"))
        for name in (first, deleted, later):
            fleet.add_node(name)
        for name in (first, deleted):
            fleet.report(name, gpunode_facts.agent_status(overrides=ECC))
            waiting.wait_until(
                lambda name=name: fleet.node(name)["spec"].get("unschedulable"),
                timeout_seconds=TIMEOUT,
                message=f"{name} cordoned in the first term",
            )
        waiting.wait_until(
            lambda: fleet.events(first, "NodeCordoned"), timeout_seconds=TIMEOUT, message="Event"
        )

        since = datetime.datetime.now(datetime.UTC)
        take_lease(k8s, lease)
        waiting.wait_until(
            lambda: "campaigning again" in operator.log(), timeout_seconds=TIMEOUT, message="the term ends"
        )
        assert not operator.is_leading()
        # Unseen by the operator: a cordoned node goes away, another one turns faulty.
        client.CoreV1Api(k8s).delete_node(deleted)
        with contextlib.suppress(client.ApiException):  # the garbage collector may be first
            fleet.custom.delete_cluster_custom_object(
                resources.GROUP, resources.VERSION, resources.GPUNODE_PLURAL, deleted
            )
        fleet.report(later, gpunode_facts.agent_status(overrides=ECC))

        waiting.wait_until(operator.is_leading, timeout_seconds=TIMEOUT, message="the operator leads again")
        waiting.wait_until(
            lambda: fleet.node(later)["spec"].get("unschedulable"),
            timeout_seconds=TIMEOUT,
            message="the fault reported between the terms is acted on",
        )
        events = waiting.wait_until(
            lambda: fleet.events(later, "NodeCordoned"), timeout_seconds=TIMEOUT, message="its Event"
        )
        assert [e["count"] for e in events] == [1]
        assert [e["count"] for e in fleet.events(first, "NodeCordoned")] == [1]
        assert node_patches(crds, since, first) == [], "the first term's cordon is not redone"
        assert fleet.node(first)["spec"].get("unschedulable")
        assert operator.log().count("cache primed") >= 2, "the new term listed into the cache again"
    finally:
        operator.stop()
        print(operator.log()[-8000:])
