"""Leader election: of two operator replicas exactly one acts, and the other takes over when it dies."""

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from gpuhealth_api import keys
from gpuhealth_operator import testing
from gpuhealth_sim import controlplane

pytestmark = pytest.mark.integration

TIMEOUT = 20.0
LEASE = [
    "--lease-duration-seconds=3",
    "--lease-renew-seconds=1",
    "--lease-retry-seconds=0.5",
    "--tick-seconds=0.5",
]


@pytest.fixture
def replicas(
    crds: controlplane.ControlPlane, k8s: client.ApiClient, tmp_path: Path
) -> Iterator[list[testing.OperatorProcess]]:
    testing.ensure_namespace(k8s, "gpu-health")
    lease = f"gpu-health-operator-leader-{secrets.token_hex(2)}"
    processes = [
        testing.OperatorProcess(
            kubeconfig=Path(crds.kubeconfig),
            log_path=tmp_path / f"replica-{i}.log",
            lease_name=lease,
            identity=f"replica-{i}",
            extra_args=LEASE,
        ).start()
        for i in range(2)
    ]
    try:
        yield processes
    finally:
        for process in processes:
            process.stop()
            print(f"--- {process.identity}\n{process.log()[-10000:]}")


@pytest.fixture
def fleet(k8s: client.ApiClient) -> Iterator[testing.Fleet]:
    nodes = testing.Fleet(k8s, label=f"leader-{secrets.token_hex(3)}")
    try:
        yield nodes
    finally:
        nodes.cleanup()


def leaders(processes: list[testing.OperatorProcess]) -> list[testing.OperatorProcess]:
    return [p for p in processes if p.alive() and p.is_leading()]


def test_exactly_one_replica_acts_and_the_other_takes_over_when_it_dies(
    replicas: list[testing.OperatorProcess], fleet: testing.Fleet
) -> None:
    testing.wait_for(lambda: all(p.healthz() for p in replicas), TIMEOUT, "both replicas serve /healthz")
    testing.wait_for(lambda: len(leaders(replicas)) == 1, TIMEOUT, "one leader")
    first = leaders(replicas)[0]
    standby = next(p for p in replicas if p is not first)

    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": 5,
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}],
        },
    )
    a = f"{fleet.label}-a"
    fleet.add_node(a)
    fleet.report(a, testing.agent_status(overrides={0: {"ecc": {"uncorrectedVolatile": 1}}}))
    testing.wait_for(lambda: fleet.node(a)["spec"].get("unschedulable"), TIMEOUT, "cordoned by the leader")
    events = testing.wait_for(lambda: fleet.events(a, "NodeCordoned"), TIMEOUT, "NodeCordoned")
    assert len(events) == 1
    assert events[0]["count"] == 1
    assert events[0]["reportingInstance"] == first.identity
    assert len(leaders(replicas)) == 1
    assert not standby.is_leading()

    first.kill()
    testing.wait_for(standby.is_leading, 15, "standby takes over after the lease expires")

    b = f"{fleet.label}-b"
    fleet.add_node(b)
    fleet.report(b, testing.agent_status(overrides={0: {"ecc": {"uncorrectedVolatile": 1}}}))
    testing.wait_for(
        lambda: fleet.node(b)["spec"].get("unschedulable"), TIMEOUT, "cordoned by the new leader"
    )
    events = testing.wait_for(lambda: fleet.events(b, "NodeCordoned"), TIMEOUT, "NodeCordoned")
    assert events[0]["reportingInstance"] == standby.identity
    assert fleet.node(b)["metadata"]["annotations"][keys.CORDONED_BY_ANNOTATION] == fleet.label
    # The node cordoned before the takeover was not acted on twice.
    assert len(fleet.events(a, "NodeCordoned")) == 1
    assert fleet.events(a, "NodeCordoned")[0]["count"] == 1
