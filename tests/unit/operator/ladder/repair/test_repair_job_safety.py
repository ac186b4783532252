"""Issue 45, items 6, 9 and 10: what a repair step's Job may carry, whatever the agent reports or the
template says, and that it goes with its Node.

On the in-memory cluster: a node with an uncorrectable ECC error on GPU 0 is cordoned and drained by a
policy with `spec.repair`; the operator then creates the ResetGPU step's Job from the templates
ConfigMap (served by this test). The tests look at the Jobs created and the Events said.

- Item 9: a GPU UUID the agent wrote that is not NVML's form (`GPU-` and a UUID) never reaches a Job's
  environment: the step fails with an Event naming the refused UUID.
- Item 6: a step Job is owned by its Node; the operator deletes one whose Node was deleted, or
  re-created under the same name, also after a restart (here, with no garbage collector: the real
  one is tested in tests/integration/test_operator_repair.py).
- Item 10: a step Job runs as the namespace's `default` ServiceAccount with no token, whatever the
  template says; a template naming a ServiceAccount (the operator's, say) is refused with an Event.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

import yaml

import gpunode_facts
import handling
import operator_context
from gpuhealth_api import resources
from gpuhealth_operator.client import kube
from gpuhealth_operator.runtime import handlers, ticker
from gpuhealth_operator.shared import context, settings
from gpuhealth_sim.backtest import memcluster

T0 = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)
NODE = "gpu-node-1"
NAMESPACE = "gpu-health"
CONFIGMAP = "repair-templates"
OPERATOR_SA = "gpu-health-operator"
EVIL = "GPU-1;nsenter -t 1 -m -u -i -n -p -- sh -c id"


def template(**pod: Any) -> dict[str, Any]:
    """A Job template whose command reads the UUIDs from the environment (never spliced into sh -c)."""
    spec: dict[str, Any] = {
        "containers": [
            {"name": "step", "image": "registry.k8s.io/pause:3.10", "command": ["/step"]},
        ]
    }
    spec.update(pod)
    return {"apiVersion": "batch/v1", "kind": "Job", "spec": {"template": {"spec": spec}}}


def synchronously(test: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    @functools.wraps(test)
    def run() -> None:
        asyncio.run(test())  # type: ignore[arg-type]

    return run


class Cluster(memcluster.MemoryKube):
    """The in-memory cluster, also serving the templates ConfigMap."""

    def __init__(self, templates: Mapping[str, Mapping[str, Any]]) -> None:
        super().__init__()
        self.configmap = {
            "metadata": {"name": CONFIGMAP, "namespace": NAMESPACE},
            "data": {key: yaml.safe_dump(dict(value)) for key, value in templates.items()},
        }

    def _get(self, path: str, query: Mapping[str, str] | None) -> kube.JsonObject:
        if path == f"/api/v1/namespaces/{NAMESPACE}/configmaps/{CONFIGMAP}":
            return copy.deepcopy(self.configmap)
        return super()._get(path, query)


class Fleet:
    def __init__(self, reset: Mapping[str, Any], *, uuid0: str | None = None) -> None:
        templates = {"ResetGPU": reset, "RebootNode": template(), "Validation": template()}
        self.cluster: Any = cast(Any, Cluster(templates))
        self.cluster.clock = self.epoch  # a Job's creationTimestamp
        self.now = T0
        self.ctx = self.operator()
        self.uuid0 = uuid0
        self.policy: dict[str, Any] = {}

    def epoch(self) -> float:
        return self.now.timestamp()

    def operator(self) -> context.Context:
        """A new operator process on the same cluster."""
        config = settings.Settings(repair_templates=f"{NAMESPACE}/{CONFIGMAP}", repair_namespace=NAMESPACE)
        ctx = operator_context.new_context(self.cluster, config=config, clock=lambda: self.now)
        return ctx

    async def restart(self) -> None:
        """The operator restarts: a new process lists the policy and the Nodes."""
        self.ctx = self.operator()
        await handlers.on_policy({"type": "ADDED", "object": self.policy}, memo=self.ctx)  # type: ignore[typeddict-item]
        for node in self.cluster.nodes.values():
            await handling.handle(
                handlers.on_node, {"type": "ADDED", "object": copy.deepcopy(node)}, self.ctx
            )
        for gpunode in self.cluster.gpunodes.values():
            await handling.handle(
                handlers.on_gpunode, {"type": "ADDED", "object": copy.deepcopy(gpunode)}, self.ctx
            )

    async def add_node(self, uid: str, *, tell: bool = True) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": NODE,
                "uid": uid,
                "labels": {"pool": "gpu"},
                "creationTimestamp": gpunode_facts.rfc3339(self.now),
            },
            "spec": {},
        }
        stored = self.cluster.put_node(copy.deepcopy(node))
        if tell:
            await handling.handle(
                handlers.on_node, {"type": "ADDED", "object": copy.deepcopy(stored)}, self.ctx
            )

    async def delete_node(self, *, tell: bool = True) -> None:
        """`kubectl delete node`; the GPUNode it owns goes with it (the garbage collector)."""
        node = self.cluster.delete_node(NODE)
        gpunode = self.cluster.delete_gpunode(NODE)
        if tell:
            await handling.handle(handlers.on_node, {"type": "DELETED", "object": node}, self.ctx)
            await handling.handle(handlers.on_gpunode, {"type": "DELETED", "object": gpunode}, self.ctx)

    async def start(self, *, steps: list[dict[str, Any]] | None = None) -> None:
        spec = {
            "nodeSelector": {"matchLabels": {"pool": "gpu"}},
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
            "maxUnavailable": "100%",
            "recovery": {"healthyForSeconds": 3600, "uncordon": True},
            "repair": {
                "steps": steps or [{"name": "reset", "action": "ResetGPU", "timeoutSeconds": 300}],
                "validation": {"timeoutSeconds": 300},
                "maxConcurrent": 1,
            },
        }
        self.policy = {"apiVersion": resources.API_VERSION, "kind": resources.POLICY_KIND}
        self.policy |= {"metadata": {"name": "p", "generation": 1}, "spec": spec}
        await handlers.on_policy({"type": "ADDED", "object": self.policy}, memo=self.ctx)  # type: ignore[typeddict-item]
        await self.add_node("uid-1")
        await self.report(faulty=False)

    async def report(self, *, faulty: bool) -> None:
        overrides: dict[int, dict[str, Any]] = {0: {"ecc": {"uncorrectedVolatile": 2}}} if faulty else {}
        if self.uuid0 is not None:
            overrides.setdefault(0, {})["uuid"] = self.uuid0
        status = gpunode_facts.agent_status(
            heartbeat=gpunode_facts.rfc3339(self.now),
            observed=gpunode_facts.rfc3339(self.now),
            overrides=overrides,
        )
        stored = self.cluster.put_gpunode(NODE, status)
        await handling.handle(
            handlers.on_gpunode, {"type": "MODIFIED", "object": copy.deepcopy(stored)}, self.ctx
        )

    async def tick(self, seconds: float = 1.0) -> None:
        self.now += datetime.timedelta(seconds=seconds)
        await ticker.tick(self.ctx, full=True)

    async def fault_and_drain(self) -> None:
        await self.report(faulty=True)
        for _ in range(5):
            await self.tick()

    def standing(self) -> list[str]:
        """The Jobs in the cluster now (by name)."""
        return [j["metadata"]["name"] for j in self.cluster.jobs.values()]

    def jobs(self) -> list[dict[str, Any]]:
        return [copy.deepcopy(j) for j in self.cluster.job_log]

    def messages(self, reason: str) -> list[str]:
        return [str(e.get("message")) for e in self.cluster.event_log if e.get("reason") == reason]


# --- item 9: GPU UUIDs ------------------------------------------------------------------------------


@synchronously
async def test_a_uuid_that_is_not_nvmls_never_reaches_a_job() -> None:
    fleet = Fleet(template(), uuid0=EVIL)
    await fleet.start()
    await fleet.fault_and_drain()
    assert not any(EVIL in yaml.safe_dump(job) for job in fleet.jobs()), "the agent's text reached a Job"
    failed = fleet.messages("RepairFailed")
    assert failed, f"no RepairFailed Event (Jobs created: {[j['metadata']['name'] for j in fleet.jobs()]})"
    assert "not an NVML GPU UUID" in failed[0] and repr(EVIL) in failed[0], failed[0]


@synchronously
async def test_a_reboot_never_passes_the_agents_text_either() -> None:
    """RebootNode (and validation) get every GPU the agent lists: one bad UUID fails those too."""
    fleet = Fleet(template(), uuid0=EVIL)
    await fleet.start(steps=[{"name": "reboot", "action": "RebootNode", "timeoutSeconds": 300}])
    await fleet.fault_and_drain()
    assert fleet.jobs() == []
    assert any("not an NVML GPU UUID" in m for m in fleet.messages("RepairFailed")), fleet.messages(
        "RepairFailed"
    )
    assert fleet.messages("NodeRetired"), "no step left: retired, for a human"


@synchronously
async def test_nvml_uuids_reach_the_job_as_an_environment_variable() -> None:
    fleet = Fleet(template())
    await fleet.start()
    await fleet.fault_and_drain()
    (job,) = fleet.jobs()
    env = {e["name"]: e["value"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GPUHEALTH_GPU_UUIDS"] == gpunode_facts.healthy_gpu(0)["uuid"]


# --- item 10: ServiceAccount and token --------------------------------------------------------------


@synchronously
async def test_a_template_naming_the_operators_service_account_is_refused() -> None:
    fleet = Fleet(template(serviceAccountName=OPERATOR_SA, automountServiceAccountToken=True))
    await fleet.start()
    await fleet.fault_and_drain()
    assert fleet.jobs() == [], "a Job ran as the operator's ServiceAccount"
    failed = fleet.messages("RepairFailed")
    assert failed and OPERATOR_SA in failed[0] and "ServiceAccount" in failed[0], failed


@synchronously
async def test_a_template_naming_the_deprecated_service_account_field_is_refused() -> None:
    fleet = Fleet(template(serviceAccount=OPERATOR_SA))
    await fleet.start()
    await fleet.fault_and_drain()
    assert fleet.jobs() == []
    assert any(OPERATOR_SA in m for m in fleet.messages("RepairFailed")), fleet.messages("RepairFailed")


@synchronously
async def test_a_step_job_carries_no_token_whatever_the_template_says() -> None:
    token = {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}}
    reset = template(
        automountServiceAccountToken=True,
        volumes=[
            {"name": "kube-token", "projected": {"sources": [token]}},
            {"name": "scratch", "emptyDir": {}},
        ],
    )
    container = reset["spec"]["template"]["spec"]["containers"][0]
    container["volumeMounts"] = [
        {"name": "kube-token", "mountPath": "/var/run/secrets/tokens"},
        {"name": "scratch", "mountPath": "/scratch"},
    ]
    fleet = Fleet(reset)
    await fleet.start()
    await fleet.fault_and_drain()
    (job,) = fleet.jobs()
    pod = job["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == "default"
    assert "serviceAccount" not in pod
    assert [v["name"] for v in pod["volumes"]] == ["scratch"]
    assert [m["name"] for m in pod["containers"][0]["volumeMounts"]] == ["scratch"]


# --- item 6: a Node deleted mid-repair ----------------------------------------------------------------


@synchronously
async def test_a_step_job_is_owned_by_its_node() -> None:
    fleet = Fleet(template())
    await fleet.start()
    await fleet.fault_and_drain()
    (job,) = fleet.jobs()
    assert job["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "uid-1"}
    ]


@synchronously
async def test_a_node_deleted_mid_repair_takes_its_job_and_its_new_self_starts_nothing() -> None:
    fleet = Fleet(template())
    await fleet.start()
    await fleet.fault_and_drain()
    assert len(fleet.standing()) == 1, "the ResetGPU step runs"
    await fleet.delete_node()
    await fleet.add_node("uid-2")  # a new machine registers under the name
    await fleet.tick()
    assert fleet.standing() == [], "the deleted Node's privileged Job would run on the new machine"
    (said,) = fleet.messages("RemediationPaused")
    assert "is gone" in said or "re-created" in said, said
    await fleet.report(faulty=False)
    for _ in range(5):
        await fleet.tick()
    assert len(fleet.jobs()) == 1 and fleet.standing() == [], "no step on the re-created node"
    assert not fleet.cluster.nodes[NODE]["spec"].get("unschedulable")


@synchronously
async def test_a_node_re_created_while_no_operator_ran_loses_its_old_job_at_the_restart() -> None:
    fleet = Fleet(template())
    await fleet.start()
    await fleet.fault_and_drain()
    assert len(fleet.standing()) == 1
    await fleet.delete_node(tell=False)  # while the operator is down
    await fleet.add_node("uid-2", tell=False)
    await fleet.restart()
    await fleet.tick()
    assert fleet.standing() == [], "the old Node's Job survived the restart"
    assert any("re-created" in m for m in fleet.messages("RemediationPaused")), fleet.messages(
        "RemediationPaused"
    )


@synchronously
async def test_a_restart_keeps_the_job_of_a_node_that_is_still_the_same() -> None:
    fleet = Fleet(template())
    await fleet.start()
    await fleet.fault_and_drain()
    (name,) = fleet.standing()
    await fleet.restart()
    await fleet.tick()
    assert fleet.standing() == [name], "a restart must adopt the running step, not delete it"


@synchronously
async def test_a_job_without_an_owner_made_before_its_node_goes() -> None:
    """A step Job made before Jobs had owners (an older operator) names no Node UID: one created before
    its Node was is an earlier Node's, whatever the name says."""
    fleet = Fleet(template())
    await fleet.start()
    await fleet.fault_and_drain()
    (key,) = fleet.cluster.jobs
    fleet.cluster.jobs[key]["metadata"].pop("ownerReferences")
    await fleet.restart()
    await fleet.tick()
    assert list(fleet.cluster.jobs) == [key], "the same Node: its Job stays"
    await fleet.delete_node(tell=False)
    fleet.now += datetime.timedelta(seconds=60)
    await fleet.add_node("uid-2", tell=False)
    await fleet.restart()
    await fleet.tick()
    assert fleet.standing() == [], "an earlier Node's Job survived"


def kubelet_admits(job: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """A kubelet's admission of a pod bound to its Node (GeneralPredicates): the pod's nodeSelector must
    match the Node's labels, or the pod fails (reason NodeAffinity) and never runs."""
    labels = node["metadata"].get("labels") or {}
    selector = job["spec"]["template"]["spec"].get("nodeSelector") or {}
    return all(labels.get(key) == value for key, value in selector.items())


@synchronously
async def test_a_kubelet_of_a_re_created_node_refuses_the_old_nodes_step_pod() -> None:
    """Without the garbage collector (kube-controller-manager down) and before the operator's sweep, the
    old Node's pod still exists, bound to the name: the new machine's kubelet must refuse it."""
    fleet = Fleet(template())
    await fleet.start()
    await fleet.fault_and_drain()
    (job,) = fleet.jobs()
    assert kubelet_admits(job, fleet.cluster.nodes[NODE]), "the node under repair runs its step"
    await fleet.delete_node(tell=False)
    await fleet.add_node("uid-2", tell=False)  # a kubelet registers a new Node under the name
    assert not kubelet_admits(job, fleet.cluster.nodes[NODE]), "the new machine would run the old step"


@synchronously
async def test_the_nodes_repair_label_goes_when_the_node_returns() -> None:
    fleet = Fleet(template())
    await fleet.start()
    await fleet.fault_and_drain()
    (reset,) = fleet.jobs()
    fleet.cluster.end_job(reset["metadata"]["name"], True, fleet.now.timestamp())
    for _ in range(3):
        await fleet.tick()
        await fleet.report(faulty=False)
    names = [j["metadata"]["name"] for j in fleet.jobs()]
    assert len(names) == 2, names  # the validation Job
    validation = fleet.jobs()[1]
    assert kubelet_admits(validation, fleet.cluster.nodes[NODE])
    fleet.cluster.end_job(names[1], True, fleet.now.timestamp())
    for _ in range(3):
        await fleet.tick()
    node = fleet.cluster.nodes[NODE]
    assert not node["spec"].get("unschedulable"), "validated: back in service"
    assert not [k for k in node["metadata"].get("labels") or {} if k.startswith("gpuhealth.io/repair")], node


@synchronously
async def test_a_cycle_written_without_the_label_writes_it_before_its_job() -> None:
    """A cycle an older operator wrote (the annotation, no label) and whose Job was never created: the
    new operator writes the label first, or the kubelet of the very node under repair would refuse it."""
    fleet = Fleet(template())
    await fleet.start()
    await fleet.fault_and_drain()
    (key,) = fleet.cluster.jobs
    del fleet.cluster.jobs[key]  # written, never created
    node = copy.deepcopy(fleet.cluster.nodes[NODE])
    del node["metadata"]["labels"]["gpuhealth.io/repair-node-uid"]
    fleet.cluster.put_node(node)
    fleet.cluster.gpunodes[NODE]["status"].pop("repairs", None)  # no Started entry
    await fleet.restart()
    await fleet.tick()
    (job,) = [j for j in fleet.cluster.jobs.values()]
    assert kubelet_admits(job, fleet.cluster.nodes[NODE]), "the node under repair would refuse its step"
