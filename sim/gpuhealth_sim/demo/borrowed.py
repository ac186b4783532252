"""The demo on a cluster the user already has: what it may create there, and its removal.

Before anything is created (`preflight`) the demo refuses a cluster where its objects would meet
someone else's: gpu-health already installed (its CRDs; an installed operator would judge the demo's
nodes too), a Node, namespace or DeviceClass of the same name that the demo did not make. Leftovers
of an earlier demo (interrupted hard) carry `MANAGED_BY` and are adopted, then removed.

`clean` removes everything the demo created, in an order that lets kwok (still running) finish the
pods' deletions: the namespaces (the training pods, the repair Jobs), the policy and its
DeviceTaintRules, then the Nodes with their GPUNodes, Leases, ResourceSlices and Events, and last the
CRDs. `leftovers` lists what is still there, for the demo's last line and for tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any, Final, Protocol

from kubernetes import client

from gpuhealth_api import resources
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local
from gpuhealth_sim.demo import checkstory, operands, workload
from gpuhealth_sim.fleet import dra, fleetfile, repairs

MANAGED_BY: Final = ("app.kubernetes.io/managed-by", "gpu-health-demo")
"""On the CRDs and namespaces the demo creates on a borrowed cluster."""
CRDS: Final = (
    f"{resources.GPUNODE_PLURAL}.{resources.GROUP}",
    f"{resources.POLICY_PLURAL}.{resources.GROUP}",
)
NAMESPACES: Final = (workload.NAMESPACE, repairs.DEFAULT_NAMESPACE, operands.NAMESPACE)
NODE_LEASE_NAMESPACE: Final = "kube-node-lease"
GONE_SECONDS: Final = 120.0
"""How long `clean` waits for namespaces and CRDs to go (a real cluster finalises them in seconds)."""


class Kubectl(Protocol):
    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> Any: ...


@dataclasses.dataclass(frozen=True)
class Plan:
    spec: fleetfile.Fleet
    """The fleet to run: the demo's, less its DRA nodes where the cluster cannot have them."""
    problems: tuple[str, ...]
    """Why the demo must not run here; empty: go."""
    notes: tuple[str, ...]
    """What the demo changed of its story for this cluster."""
    device_class: bool
    """The demo creates (so removes) the DeviceClass of its fake DRA driver."""


def _ours(metadata: client.V1ObjectMeta | None) -> bool:
    labels = (metadata.labels if metadata else None) or {}
    return labels.get(MANAGED_BY[0]) == MANAGED_BY[1]


def _exists(read: Callable[..., Any], *args: Any) -> Any | None:
    try:
        return read(*args)
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise


def preflight(api: client.ApiClient, spec: fleetfile.Fleet) -> Plan:
    core, extensions = client.CoreV1Api(api), client.ApiextensionsV1Api(api)
    custom = client.CustomObjectsApi(api)
    problems, notes = [], []
    for name in CRDS:
        crd = _exists(extensions.read_custom_resource_definition, name)
        if crd is not None and not _ours(crd.metadata):
            problems.append(
                f"CRD {name} exists: gpu-health is installed here, and its operator would judge the demo's "
                "nodes too; run the demo on a cluster without it (or the local one: make demo)"
            )
    for name in NAMESPACES:
        found = _exists(core.read_namespace, name)
        if found is not None and not _ours(found.metadata):
            problems.append(f"namespace {name} exists and is not the demo's")
    for plan in spec.nodes:
        node = _exists(core.read_node, plan.name)
        annotations = (node.metadata.annotations if node and node.metadata else None) or {}
        if (
            node is not None
            and annotations.get(local.KWOK_NODE_ANNOTATION) != local.KWOK_NODE_ANNOTATION_VALUE
        ):
            problems.append(f"Node {plan.name} exists and is not a kwok node: the demo would take its name")
    device_class = False
    if any(plan.dra for plan in spec.nodes):
        try:
            existing = _exists(
                custom.get_cluster_custom_object, dra.GROUP, dra.VERSION, "deviceclasses", dra.DEVICE_CLASS
            )
            served = True
        except client.ApiException:
            existing, served = None, False
        if served and existing is None:
            device_class = True
        else:
            why = (
                "serves no resource.k8s.io/v1"
                if not served
                else f"has a DeviceClass {dra.DEVICE_CLASS} already"
            )
            notes.append(f"the cluster {why}: the demo runs without its DRA node")
            spec = dataclasses.replace(spec, nodes=tuple(plan for plan in spec.nodes if not plan.dra))
    return Plan(spec, tuple(problems), tuple(notes), device_class)


def mark_crds(cluster: Kubectl) -> None:
    """Label the CRDs the demo just applied as its own (what `preflight` and `clean` look for)."""
    cluster.kubectl("label", "--overwrite", "crd", *CRDS, *label_args())


def labels() -> dict[str, str]:
    return {MANAGED_BY[0]: MANAGED_BY[1]}


def label_args() -> list[str]:
    return [f"{MANAGED_BY[0]}={MANAGED_BY[1]}"]


def _delete(what: Callable[..., Any], *args: Any) -> None:
    try:
        what(*args)
    except client.ApiException as error:
        if error.status != 404:
            raise


def clean(
    cluster: Kubectl, api: client.ApiClient, plan: Plan, policy: str, say: Callable[[str], None]
) -> None:
    """Remove everything the demo created; waits until the namespaces and CRDs are gone."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    extensions, coordination = client.ApiextensionsV1Api(api), client.CoordinationV1Api(api)
    names = [p.name for p in plan.spec.nodes]
    for namespace in NAMESPACES:
        _delete(core.delete_namespace, namespace)
    cluster.kubectl("delete", "ghp", policy, "--ignore-not-found", "--wait=false", check=False)
    # Not served on every cluster: then there is none to delete.
    cluster.kubectl(
        "delete", "devicetaintrules", "-l", f"gpuhealth.io/policy={policy}", "--ignore-not-found", check=False
    )
    waiting.wait_until(
        lambda: all(_exists(core.read_namespace, n) is None for n in NAMESPACES),
        timeout_seconds=GONE_SECONDS,
        interval_seconds=0.5,
        message=f"namespaces {', '.join(NAMESPACES)} deleted",
    )
    for name in names:
        _delete(core.delete_node, name)
        _delete(coordination.delete_namespaced_lease, name, NODE_LEASE_NAMESPACE)
        gpunode = (resources.GROUP, resources.VERSION, resources.GPUNODE_PLURAL, name)
        _delete(custom.delete_cluster_custom_object, *gpunode)
    dra.delete(api, [p.name for p in plan.spec.nodes if p.dra])
    if plan.device_class:
        deviceclass = (dra.GROUP, dra.VERSION, "deviceclasses", dra.DEVICE_CLASS)
        _delete(custom.delete_cluster_custom_object, *deviceclass)
    _delete_events(core, {*names, policy})
    scheduling = client.SchedulingV1Api(api)
    found = _exists(scheduling.read_priority_class, checkstory.PRIORITY_CLASS)
    if found is not None and _ours(found.metadata):  # made by the demo (else someone's: left alone)
        _delete(scheduling.delete_priority_class, checkstory.PRIORITY_CLASS)
    for name in CRDS:
        crd = _exists(extensions.read_custom_resource_definition, name)
        if crd is not None and _ours(crd.metadata):
            _delete(extensions.delete_custom_resource_definition, name)
    waiting.wait_until(
        lambda: not leftovers(api, plan, policy),
        timeout_seconds=GONE_SECONDS,
        interval_seconds=0.5,
        message="everything the demo created removed",
    )
    say(f"removed what the demo created: {len(names)} Nodes and their GPUNodes, namespaces "
        f"{', '.join(NAMESPACES)}, policy {policy}, the CRDs")  # fmt: skip


def _delete_events(core: client.CoreV1Api, involved: Iterable[str]) -> None:
    """Events about cluster-scoped objects (Nodes, GPUNodes, the policy) live in `default`."""
    wanted = set(involved)
    for event in core.list_namespaced_event("default").items:
        if event.involved_object is not None and event.involved_object.name in wanted and event.metadata:
            _delete(core.delete_namespaced_event, event.metadata.name, "default")


def leftovers(api: client.ApiClient, plan: Plan, policy: str) -> list[str]:
    """What the demo created that is still in the cluster, one short line each."""
    core, extensions = client.CoreV1Api(api), client.ApiextensionsV1Api(api)
    found = [f"namespace {n}" for n in NAMESPACES if _exists(core.read_namespace, n) is not None]
    found += [f"Node {p.name}" for p in plan.spec.nodes if _exists(core.read_node, p.name) is not None]
    found += [
        f"CRD {name}"
        for name in CRDS
        if (crd := _exists(extensions.read_custom_resource_definition, name)) is not None
        and _ours(crd.metadata)
    ]
    return found
