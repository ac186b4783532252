"""Issue 45 leftover A: a policy with `spec.repair` where the operator may not create Jobs.

The chart's `repair.enabled=false` grants no right to create Jobs, so each create meets 403 (404: no
namespace). That is the install's state, not the node's failure. On the in-memory cluster (its Job API
answering 403 or 404): a node with an uncorrectable ECC error is cordoned and drained; the test looks
at what a user sees — the Node stays cordoned and claimed, never retired; GPUNode `status.action`
Drained; no RepairFailed/NodeRetired Event and no `status.repairs[]` Failed entry; the policy's
`RepairPermitted=False` condition with the API server's words and one Event naming `repair.enabled`,
not said again after a restart; and once the rights appear, the repair starts.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import repair_memory
from gpuhealth_api import keys
from gpuhealth_operator.client import kube

NODE = repair_memory.NODE
FORBIDDEN = (
    'jobs.batch is forbidden: User "system:serviceaccount:gpu-health:gpu-health-operator" cannot create '
    'resource "jobs" in API group "batch" in the namespace "gpu-health"'
)


class Cluster(repair_memory.Cluster):
    """The in-memory cluster whose Job API refuses creates while `refusing` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.refusing: int | None = 403
        self.refused = 0
        self.message: str | None = None
        """The 403's message (default: RBAC's)."""

    def _jobs(self, method: str, path: str, body: object) -> kube.JsonObject:
        if method == "POST" and self.refusing is not None:
            self.refused += 1
            reason = "Forbidden" if self.refusing == 403 else "NotFound"
            message = (
                self.message or FORBIDDEN if self.refusing == 403 else 'namespaces "gpu-health" not found'
            )
            raise kube.ApiError(self.refusing, reason, json.dumps({"kind": "Status", "message": message}))
        return super()._jobs(method, path, body)


class Fleet(repair_memory.Fleet):
    """The shared repair fleet (`repair_memory`) on a cluster whose Job API refuses, with an agent of
    before issue 48 (not asked to release), the fault there all along."""

    def __init__(self, refusing: int) -> None:
        cluster = Cluster()
        cluster.refusing = refusing
        super().__init__(cluster=cluster, can_release=False)
        self.cluster: Cluster = cluster

    def node(self) -> dict[str, Any]:
        return self.cluster.nodes[NODE]

    def reasons(self) -> list[str]:
        return [str(e.get("reason")) for e in self.cluster.event_log]

    def naming_repair_enabled(self) -> list[str]:
        return [
            str(e.get("message")) for e in self.cluster.event_log if "repair.enabled" in str(e.get("message"))
        ]

    def permitted(self) -> dict[str, Any]:
        conditions = (self.cluster.policies.get("p") or {}).get("status", {}).get("conditions") or []
        return next((c for c in conditions if c.get("type") == "RepairPermitted"), {})


def test_a_403_of_admission_is_the_steps_failure_as_before() -> None:
    """A ResourceQuota exceeded (or a webhook) also answers 403, but it is no missing right: the step
    fails with the API server's words and the cycle moves on (tests/integration/test_operator_repair.py
    has it against the real API server)."""

    async def story() -> None:
        fleet = Fleet(403)
        fleet.cluster.message = (
            'jobs.batch "x" is forbidden: exceeded quota: no-jobs, requested: count/jobs.batch=1'
        )
        await fleet.start()
        await fleet.tick(times=10)
        assert "RepairFailed" in fleet.reasons() and "NodeRetired" in fleet.reasons(), fleet.reasons()
        assert fleet.naming_repair_enabled() == []

    run(story)


def run(test: Any) -> None:
    asyncio.run(test())


@pytest.mark.parametrize("status", [403, 404])
def test_a_refused_job_create_leaves_the_node_drained_and_the_policy_says_so_once(status: int) -> None:
    async def story() -> None:
        fleet = Fleet(status)
        await fleet.start()
        await fleet.tick(times=10)
        await fleet.tick(seconds=30, times=6)  # three minutes: past RETRY_SECONDS, short of any deadline
        node = fleet.node()
        assert node["spec"].get("unschedulable") is True, "the node was returned"
        annotations = node["metadata"].get("annotations") or {}
        assert annotations.get(keys.CORDONED_BY_ANNOTATION) == "p", "our claim on the node went"
        assert keys.NEEDS_REPAIR_LABEL not in (node["metadata"].get("labels") or {}), "the node was retired"
        assert keys.REPAIR_ANNOTATION not in annotations, "a repair state holds a maxConcurrent place"
        assert keys.REPAIR_CYCLES_ANNOTATION not in annotations, "a refused create counted a cycle"
        gpunode = fleet.cluster.gpunodes[NODE]["status"]
        assert gpunode.get("action") == "Drained", gpunode.get("action")
        assert not [r for r in gpunode.get("repairs") or [] if r.get("result") == "Failed"], gpunode[
            "repairs"
        ]
        assert "RepairFailed" not in fleet.reasons() and "NodeRetired" not in fleet.reasons(), fleet.reasons()
        said = fleet.naming_repair_enabled()
        assert len(said) == 1, said
        assert fleet.cluster.refused >= 2, "not tried again"
        condition = fleet.permitted()
        assert condition.get("status") == "False", condition
        assert str(status) in condition["message"] and "repair.enabled" in condition["message"], condition

        await fleet.restart()  # a new process: what was said is in the cluster
        await fleet.tick(seconds=30, times=4)
        assert len(fleet.naming_repair_enabled()) == 1, fleet.naming_repair_enabled()
        assert fleet.permitted().get("status") == "False"

        fleet.cluster.refusing = None  # the chart upgraded with repair.enabled=true
        await fleet.tick(seconds=30, times=3)
        assert [j["metadata"]["name"] for j in fleet.cluster.job_log], "no repair started with the rights"
        assert "RepairStarted" in fleet.reasons(), fleet.reasons()
        assert fleet.permitted().get("status") == "True", fleet.permitted()
        assert fleet.cluster.gpunodes[NODE]["status"].get("action") == "Repairing"

    run(story)
