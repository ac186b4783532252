"""Leader election: of two operator replicas exactly one acts, and the other takes over when it dies."""

import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

import gpunode_facts
import operator_harness
from gpuhealth_api import keys
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

TIMEOUT = 20.0
LEASE = [
    "--lease-duration-seconds=3",
    "--lease-renew-seconds=1",
    "--lease-retry-seconds=0.5",
    "--tick-seconds=0.5",
]


LONG_LEASE = ["--lease-duration-seconds=30", *LEASE[1:]]
"""A Lease that outlasts the test's bounds: a standby leading sooner had it released, not expired."""
EXIT_SECONDS = 3.0
"""How soon a SIGTERMed operator exits (0.3 s measured beside a Go build; kopf alone made it 5.3 s): a rolling
update or a node drain must not wait on it."""


@pytest.fixture(params=[LEASE], ids=["short-lease"])
def replicas(
    crds: local.ControlPlane, k8s: client.ApiClient, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[list[operator_harness.OperatorProcess]]:
    operator_harness.ensure_namespace(k8s, "gpu-health")
    lease = f"gpu-health-operator-leader-{secrets.token_hex(2)}"
    processes = [
        operator_harness.OperatorProcess(
            kubeconfig=Path(crds.kubeconfig),
            log_path=tmp_path / f"replica-{i}.log",
            lease_name=lease,
            identity=f"replica-{i}",
            extra_args=request.param,
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
def fleet(k8s: client.ApiClient) -> Iterator[operator_harness.Fleet]:
    with operator_harness.Fleet(k8s, label=f"leader-{secrets.token_hex(3)}") as nodes:
        yield nodes


def leaders(processes: list[operator_harness.OperatorProcess]) -> list[operator_harness.OperatorProcess]:
    return [p for p in processes if p.alive() and p.is_leading()]


def test_exactly_one_replica_acts_and_the_other_takes_over_when_it_dies(
    replicas: list[operator_harness.OperatorProcess], fleet: operator_harness.Fleet
) -> None:
    waiting.wait_until(
        lambda: all(p.healthz() for p in replicas),
        timeout_seconds=TIMEOUT,
        message="both replicas serve /healthz",
    )
    waiting.wait_until(lambda: len(leaders(replicas)) == 1, timeout_seconds=TIMEOUT, message="one leader")
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
    fleet.report(a, gpunode_facts.agent_status(overrides={0: {"ecc": {"uncorrectedVolatile": 1}}}))
    waiting.wait_until(
        lambda: fleet.node(a)["spec"].get("unschedulable"),
        timeout_seconds=TIMEOUT,
        message="cordoned by the leader",
    )
    events = waiting.wait_until(
        lambda: fleet.events(a, "NodeCordoned"), timeout_seconds=TIMEOUT, message="NodeCordoned"
    )
    assert len(events) == 1
    assert events[0]["count"] == 1
    assert events[0]["reportingInstance"] == first.identity
    assert len(leaders(replicas)) == 1
    assert not standby.is_leading()

    first.kill()
    waiting.wait_until(
        standby.is_leading, timeout_seconds=15, message="standby takes over after the lease expires"
    )

    b = f"{fleet.label}-b"
    fleet.add_node(b)
    fleet.report(b, gpunode_facts.agent_status(overrides={0: {"ecc": {"uncorrectedVolatile": 1}}}))
    waiting.wait_until(
        lambda: fleet.node(b)["spec"].get("unschedulable"),
        timeout_seconds=TIMEOUT,
        message="cordoned by the new leader",
    )
    events = waiting.wait_until(
        lambda: fleet.events(b, "NodeCordoned"), timeout_seconds=TIMEOUT, message="NodeCordoned"
    )
    assert events[0]["reportingInstance"] == standby.identity
    assert fleet.node(b)["metadata"]["annotations"][keys.CORDONED_BY_ANNOTATION] == fleet.label
    # The node cordoned before the takeover was not acted on twice.
    assert len(fleet.events(a, "NodeCordoned")) == 1
    assert fleet.events(a, "NodeCordoned")[0]["count"] == 1


@pytest.mark.parametrize("replicas", [LONG_LEASE], ids=["long-lease"], indirect=True)
def test_a_sigtermed_leader_exits_at_once_and_hands_its_lease_over(
    replicas: list[operator_harness.OperatorProcess], fleet: operator_harness.Fleet
) -> None:
    """A rolling update SIGTERMs the leader: it stops acting and exits within EXIT_SECONDS, its work
    done so far kept, and releases the Lease, so the standby leads long before the Lease would expire
    and acts on the next fault."""
    waiting.wait_until(lambda: len(leaders(replicas)) == 1, timeout_seconds=TIMEOUT, message="one leader")
    first = leaders(replicas)[0]
    standby = next(p for p in replicas if p is not first)
    fleet.policy(
        fleet.label,
        {"maxUnavailable": 5, "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}]},
    )
    ecc = {0: {"ecc": {"uncorrectedVolatile": 1}}}
    a, b = f"{fleet.label}-a", f"{fleet.label}-b"
    fleet.add_node(a)
    fleet.report(a, gpunode_facts.agent_status(overrides=ecc))
    fleet.said(a, "NodeDrained", timeout_seconds=TIMEOUT)  # the leader's timer, watches and drains ran

    assert first.process is not None
    first.process.signal(signal.SIGTERM)
    signalled = time.monotonic()
    waiting.wait_until(lambda: not first.alive(), timeout_seconds=15, message="the leader exits")
    exited = time.monotonic() - signalled
    assert exited <= EXIT_SECONDS, f"the leader took {exited:.1f}s to exit on SIGTERM"
    assert first.process.returncode() == 0, first.log()[-3000:]
    waiting.wait_until(
        standby.is_leading, timeout_seconds=10, message="the standby leads: the Lease was released"
    )

    fleet.add_node(b)
    fleet.report(b, gpunode_facts.agent_status(overrides=ecc))
    waiting.wait_until(
        lambda: fleet.node(b)["spec"].get("unschedulable"),
        timeout_seconds=TIMEOUT,
        message="cordoned by the new leader",
    )
    assert fleet.node(a)["spec"].get("unschedulable"), "the first leader's cordon is kept"
    assert len(fleet.events(a, "NodeCordoned")) == 1
