"""`--node-selector`: an operator acts only on its pool's nodes, and on a node that joins the pool."""

import secrets
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

TIMEOUT = 30.0
ECC = {0: {"ecc": {"uncorrectedVolatile": 1}}}
POOL_KEY = "gpuhealth.io/pool"


@pytest.fixture
def fleet(k8s: client.ApiClient) -> Iterator[operator_harness.Fleet]:
    with operator_harness.Fleet(k8s, label=f"pool-{secrets.token_hex(3)}") as nodes:
        yield nodes


def test_an_operator_judges_only_the_nodes_of_its_pool(
    crds: local.ControlPlane, k8s: client.ApiClient, fleet: operator_harness.Fleet, tmp_path: Path
) -> None:
    operator_harness.ensure_namespace(k8s, "gpu-health")
    pool = f"a-{secrets.token_hex(2)}"
    mine, other, joining = (f"{fleet.label}-{n}" for n in ("mine", "other", "joining"))
    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": 3,
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}],
        },
    )
    fleet.add_node(mine, labels={POOL_KEY: pool})
    fleet.add_node(other, labels={POOL_KEY: "elsewhere"})
    fleet.add_node(joining, labels={POOL_KEY: "elsewhere"})
    for name in (mine, other, joining):
        fleet.report(name, gpunode_facts.agent_status(overrides=ECC))
    operator = operator_harness.OperatorProcess(
        kubeconfig=Path(crds.kubeconfig),
        log_path=tmp_path / "operator.log",
        lease_name=f"gpu-health-pool-{secrets.token_hex(2)}",
        identity=f"pool-{secrets.token_hex(2)}",
        extra_args=[f"--node-selector={POOL_KEY}={pool}", "--tick-seconds=0.5"],
    ).start()
    try:
        waiting.wait_until(
            lambda: fleet.node(mine)["spec"].get("unschedulable"),
            timeout_seconds=TIMEOUT,
            message="the pool's faulty node is cordoned",
        )
        # The faulty GPUNode of a Node that joins the pool (a relabel) is read and acted on.
        client.CoreV1Api(k8s).patch_node(joining, {"metadata": {"labels": {POOL_KEY: pool}}})
        waiting.wait_until(
            lambda: fleet.node(joining)["spec"].get("unschedulable"),
            timeout_seconds=TIMEOUT,
            message="the node that joined the pool is cordoned",
        )
        # By now the operator has judged its pool several times over (timer passes every 0.5 s).
        waiting.holds(
            lambda: not fleet.node(other)["spec"].get("unschedulable"),
            seconds=2,
            message="another pool's node is left alone",
        )
        assert not fleet.events(other)
        assert keys.HEALTH_LABEL not in (fleet.node(other)["metadata"].get("labels") or {})
        assert keys.HEALTH_LABEL in fleet.node(mine)["metadata"]["labels"]
    finally:
        operator.stop()
        print(operator.log()[-6000:])
