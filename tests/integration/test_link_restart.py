"""An NVLink or NIC port still down after an operator restart keeps its taint (issue 45, item 7).

Against a real API server: the first operator sees the link go down and taints the node, then dies
(SIGKILL); the second one, a new process with none of the first's memory, lists the cluster and must
judge the link and the port as still down from what the node reports, not lift the taint after
`healthyForSeconds`.
"""

import secrets
import time
from collections.abc import Callable, Iterator
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

TIMEOUT = 30.0
UP = {"linksUp": 18, "linksDown": 0, "crcErrors": 0, "replayErrors": 0, "recoveryErrors": 0}
PORT = {"name": "mlx5_0", "port": 1, "state": "ACTIVE", "physState": "LinkUp", "rateGbps": 400.0}


@pytest.fixture
def fleet(k8s: client.ApiClient) -> Iterator[operator_harness.Fleet]:
    with operator_harness.Fleet(k8s, label=f"links-{secrets.token_hex(3)}") as nodes:
        yield nodes


def facts(*, link_down: bool, port_down: bool) -> dict[str, Any]:
    links = {i: {"nvlink": dict(UP)} for i in range(8)}
    if link_down:
        links[3] = {"nvlink": {**UP, "linksUp": 17, "linksDown": 1}}
    status = gpunode_facts.agent_status(overrides=links)
    status["nics"] = [{**PORT, "state": "DOWN", "physState": "Polling"} if port_down else PORT]
    return status


def taint(fleet: operator_harness.Fleet, name: str) -> str | None:
    for item in fleet.node(name)["spec"].get("taints") or []:
        if item["key"] == keys.UNHEALTHY_TAINT:
            return str(item["value"])
    return None


def reporting(fleet: operator_harness.Fleet, name: str, body: dict[str, Any]) -> Callable[[], None]:
    """The agent, reporting every second as a real one does."""
    last = [0.0]

    def beat() -> None:
        if time.monotonic() - last[0] >= 1.0:
            fresh = dict(body)
            fresh["agent"] = {**body["agent"], "lastHeartbeatTime": gpunode_facts.rfc3339()}
            fleet.report(name, fresh)
            last[0] = time.monotonic()

    return beat


def test_a_link_and_a_port_still_down_after_a_restart_keep_their_taints(
    crds: local.ControlPlane, k8s: client.ApiClient, fleet: operator_harness.Fleet, tmp_path: Path
) -> None:
    links, port = f"{fleet.label}-links", f"{fleet.label}-port"
    for name in (links, port):
        fleet.add_node(name, report=False)
        fleet.report(name, facts(link_down=False, port_down=False))
    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": "100%",
            "rules": [
                {"name": "nvlink", "condition": "NvLinkDegraded", "action": "Taint"},
                {"name": "nic", "condition": "NicDegraded", "action": "Taint"},
            ],
            "recovery": {"uncordon": True, "healthyForSeconds": 2},
        },
    )
    lease = f"links-{secrets.token_hex(2)}"
    with operator_harness.leading_operator(crds.kubeconfig, k8s, tmp_path / "first.log", lease) as first:
        waiting.wait_until(
            lambda: fleet.gpunode(links).get("status", {}).get("health") == "Healthy",
            timeout_seconds=TIMEOUT,
            message="judged healthy",
        )
        fleet.report(links, facts(link_down=True, port_down=False))
        fleet.report(port, facts(link_down=False, port_down=True))
        waiting.wait_until(
            lambda: taint(fleet, links) == "NvLinkDegraded", timeout_seconds=TIMEOUT, message="link"
        )
        waiting.wait_until(
            lambda: taint(fleet, port) == "NicDegraded", timeout_seconds=TIMEOUT, message="port"
        )
        first.kill()  # a crash: the next operator has none of its memory
    beats = [
        reporting(fleet, links, facts(link_down=True, port_down=False)),
        reporting(fleet, port, facts(link_down=False, port_down=True)),
    ]
    with operator_harness.leading_operator(crds.kubeconfig, k8s, tmp_path / "second.log", lease):

        def still_tainted() -> bool:
            for beat in beats:
                beat()
            return taint(fleet, links) == "NvLinkDegraded" and taint(fleet, port) == "NicDegraded"

        # healthyForSeconds is 2: a taint lifted on forgotten memory goes within seconds.
        waiting.holds(still_tainted, seconds=8, message="the taints of a link and a port still down stay")
        fleet.report(links, facts(link_down=False, port_down=False))
        waiting.wait_until(
            lambda: taint(fleet, links) is None, timeout_seconds=TIMEOUT, message="link back up"
        )
