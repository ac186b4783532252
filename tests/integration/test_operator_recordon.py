"""A human's uncordon and re-cordon while the operator was down is theirs: never lifted (issue 24, item 12).

gpu-health cordons a faulty node and is stopped. Meanwhile a human uncordons
the node and cordons it again (`kubectl uncordon`, `kubectl cordon`: patches of
`spec.unschedulable` only, our annotations untouched). The GPU is then reset
(healthy). The operator that starts again never saw the node schedulable: the
flag and `cordoned-by` look like its own cordon, which its recovery rules would
lift. The Node's managedFields say otherwise (the flag's owner is the human's
client, not the writer of our `cordoned-at`): the claim is dropped
(OverriddenByUser) and the human's cordon stays. The control: without the
human, the restarted operator lifts its own cordon.
"""

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

import gpunode_facts
import operator_harness
from gpuhealth_api import keys
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

TIMEOUT = 20.0
ARGS = [
    "--lease-duration-seconds=2",
    "--lease-renew-seconds=0.5",
    "--lease-retry-seconds=0.5",
    "--tick-seconds=0.5",
]
CORDONED_AT = "gpuhealth.io/cordoned-at"


@pytest.fixture
def fleet(k8s: client.ApiClient) -> Iterator[operator_harness.Fleet]:
    with operator_harness.Fleet(k8s, label=f"recordon-{secrets.token_hex(3)}") as nodes:
        yield nodes


def operator(crds: local.ControlPlane, log: Path, lease: str) -> operator_harness.OperatorProcess:
    return operator_harness.OperatorProcess(
        kubeconfig=Path(crds.kubeconfig), log_path=log, lease_name=lease, identity="recordon", extra_args=ARGS
    ).start()


def ecc(count: int) -> dict[str, Any]:
    return gpunode_facts.agent_status(overrides={0: {"ecc": {"uncorrectedVolatile": count}}})


def cordoned(fleet: operator_harness.Fleet, name: str) -> bool:
    return bool(fleet.node(name)["spec"].get("unschedulable"))


def annotations(fleet: operator_harness.Fleet, name: str) -> dict[str, str]:
    return fleet.node(name)["metadata"].get("annotations") or {}


@pytest.mark.parametrize("human", [True, False], ids=["recordoned-by-a-human", "control"])
def test_a_restarted_operator_never_lifts_a_cordon_a_human_made_while_it_was_down(
    crds: local.ControlPlane,
    k8s: client.ApiClient,
    fleet: operator_harness.Fleet,
    tmp_path: Path,
    human: bool,
) -> None:
    operator_harness.ensure_namespace(k8s, "gpu-health")
    lease = f"gpu-health-operator-recordon-{secrets.token_hex(2)}"
    name = f"{fleet.label}-n"
    fleet.add_node(name)
    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": 1,
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}],
            "recovery": {"uncordon": True, "healthyForSeconds": 1},
        },
    )
    first = operator(crds, tmp_path / "first.log", lease)
    try:
        fleet.report(name, ecc(1))
        waiting.wait_until(lambda: cordoned(fleet, name), timeout_seconds=TIMEOUT, message="cordoned")
        waiting.wait_until(
            lambda: CORDONED_AT in annotations(fleet, name), timeout_seconds=TIMEOUT, message="stamped"
        )
    finally:
        first.stop()
        print(f"--- first\n{first.log()[-5000:]}")

    if human:  # what `kubectl uncordon` then `kubectl cordon` send, while no operator runs
        fleet.core.patch_node(name, {"spec": {"unschedulable": False}})
        fleet.core.patch_node(name, {"spec": {"unschedulable": True}})
    assert annotations(fleet, name).get(keys.CORDONED_BY_ANNOTATION) == fleet.label
    fleet.report(name, ecc(0))  # the GPU was reset: healthy, past healthyForSeconds soon

    second = operator(crds, tmp_path / "second.log", lease)
    try:
        if not human:
            waiting.wait_until(
                lambda: not cordoned(fleet, name), timeout_seconds=TIMEOUT, message="our own cordon lifted"
            )
            return
        waiting.wait_until(
            lambda: fleet.events(name, "OverriddenByUser"),
            timeout_seconds=TIMEOUT,
            message="OverriddenByUser",
        )
        waiting.wait_until(
            lambda: keys.CORDONED_BY_ANNOTATION not in annotations(fleet, name),
            timeout_seconds=TIMEOUT,
            message="claim dropped",
        )
        waiting.wait_until(
            lambda: (fleet.gpunode(name).get("status") or {}).get("health") == "Healthy",
            timeout_seconds=TIMEOUT,
            message="healthy",
        )
        waiting.holds(
            lambda: cordoned(fleet, name),
            seconds=4,
            interval_seconds=0.2,
            message="the human's cordon is never lifted",
        )
        assert not fleet.events(name, "NodeUncordoned")
        (event,) = fleet.events(name, "OverriddenByUser")
        assert "cordoned again" in event["message"], event["message"]
    finally:
        second.stop()
        print(f"--- second\n{second.log()[-5000:]}")
