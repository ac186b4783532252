"""The local control plane behaves like a real cluster where gpu-health needs it to.

kwok keeps fake Nodes Ready and runs their Pods; the scheduler places Pods;
the controller manager computes PodDisruptionBudgets (so evictions honour
them), runs DaemonSets and garbage-collects dependents of deleted Nodes;
service-account tokens authenticate and RBAC authorizes them.

Nodes here carry the label NODE_LABEL with a value unique to this run, and
every selector in this module selects on it, so other tests' Nodes are never
touched.
"""

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

NODE_LABEL = "gpuhealth.io/test-controlplane"
IMAGE = "registry.invalid/gpu-health/placeholder:1"  # kwok never pulls it


def kwok_node(name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A Node kwok manages; capacity is set at creation as a kubelet would register it."""
    capacity = {"cpu": "32", "memory": "256Gi", "pods": "110"}
    return {
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, **labels},
            "annotations": {local.KWOK_NODE_ANNOTATION: local.KWOK_NODE_ANNOTATION_VALUE},
        },
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def pod(name: str, *, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": IMAGE}], **spec},
    }


def is_ready(node: client.V1Node) -> bool:
    conditions = (node.status.conditions or []) if node.status else []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def phase(core: client.CoreV1Api, name: str, namespace: str) -> str | None:
    status = core.read_namespaced_pod(name, namespace).status
    return status.phase if status else None


def gone(read: Any, *args: str) -> bool:
    """True once reading the object answers 404."""
    try:
        read(*args)
    except client.ApiException as error:
        if error.status == 404:
            return True
        raise
    return False


@pytest.fixture(scope="module")
def run_id() -> str:
    return secrets.token_hex(3)


@pytest.fixture(scope="module")
def nodes(k8s: client.ApiClient, run_id: str) -> Iterator[list[str]]:
    """Two Ready kwok Nodes labelled NODE_LABEL=run_id."""
    core = client.CoreV1Api(k8s)
    names = [f"controlplane-{run_id}-{i}" for i in range(2)]
    for name in names:
        core.create_node(kwok_node(name, {NODE_LABEL: run_id}))
    try:
        for name in names:
            waiting.wait_until(
                lambda name=name: is_ready(core.read_node(name)),
                timeout_seconds=30,
                message=f"kwok marks Node {name} Ready",
            )
        yield names
    finally:
        for name in names:
            core.delete_node(name)


def test_kwok_node_is_ready_and_keeps_its_lease_renewed(k8s: client.ApiClient, nodes: list[str]) -> None:
    coordination = client.CoordinationV1Api(k8s)
    core = client.CoreV1Api(k8s)
    name = nodes[0]
    first = waiting.wait_until(
        lambda: coordination.read_namespaced_lease(name, "kube-node-lease").spec.renew_time,
        timeout_seconds=30,
        message=f"kwok creates the Lease of Node {name}",
    )

    waiting.wait_until(
        lambda: coordination.read_namespaced_lease(name, "kube-node-lease").spec.renew_time > first,
        timeout_seconds=60,
        interval_seconds=0.5,
        message=f"kwok renews the Lease of Node {name}",
    )

    assert is_ready(core.read_node(name))


def test_pod_bound_to_kwok_node_runs_and_its_deletion_completes(
    k8s: client.ApiClient, nodes: list[str], namespace: str
) -> None:
    core = client.CoreV1Api(k8s)
    core.create_namespaced_pod(namespace, pod("bound", nodeName=nodes[0]))

    waiting.wait_until(
        lambda: phase(core, "bound", namespace) == "Running",
        timeout_seconds=30,
        message="pod bound to a kwok node becomes Running",
    )
    core.delete_namespaced_pod("bound", namespace)

    waiting.wait_until(
        lambda: gone(core.read_namespaced_pod, "bound", namespace),
        timeout_seconds=30,
        message="deleted pod disappears",
    )


def test_scheduler_places_pod_on_kwok_node_by_node_selector(
    k8s: client.ApiClient, nodes: list[str], namespace: str, run_id: str
) -> None:
    core = client.CoreV1Api(k8s)
    core.create_namespaced_pod(namespace, pod("scheduled", nodeSelector={NODE_LABEL: run_id}))

    waiting.wait_until(
        lambda: phase(core, "scheduled", namespace) == "Running",
        timeout_seconds=30,
        message="scheduled pod becomes Running",
    )

    assert core.read_namespaced_pod("scheduled", namespace).spec.node_name in nodes


def test_eviction_honours_pod_disruption_budgets(
    k8s: client.ApiClient, nodes: list[str], namespace: str
) -> None:
    core = client.CoreV1Api(k8s)
    policy = client.PolicyV1Api(k8s)
    # Integer minAvailable works for bare pods (percentages and maxUnavailable need a controller).
    budgets = {"protected": 1, "spare": 0}
    for app, min_available in budgets.items():
        core.create_namespaced_pod(namespace, pod(app, labels={"app": app}, nodeName=nodes[0]))
        policy.create_namespaced_pod_disruption_budget(
            namespace,
            {
                "metadata": {"name": app},
                "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}},
            },
        )

    def computed(name: str) -> client.V1PodDisruptionBudget | None:
        budget = policy.read_namespaced_pod_disruption_budget(name, namespace)
        status = budget.status
        current = status is not None and status.observed_generation == budget.metadata.generation
        return budget if current and status.current_healthy == 1 else None

    for app in budgets:
        waiting.wait_until(
            lambda app=app: computed(app),
            timeout_seconds=30,
            message=f"disruption controller computes PDB {app}",
        )
    assert (
        policy.read_namespaced_pod_disruption_budget("protected", namespace).status.disruptions_allowed == 0
    )
    assert policy.read_namespaced_pod_disruption_budget("spare", namespace).status.disruptions_allowed == 1

    def evict(name: str) -> None:
        core.create_namespaced_pod_eviction(
            name, namespace, {"metadata": {"name": name, "namespace": namespace}}
        )

    with pytest.raises(client.ApiException) as refused:
        evict("protected")
    assert refused.value.status == 429
    evict("spare")

    waiting.wait_until(
        lambda: gone(core.read_namespaced_pod, "spare", namespace),
        timeout_seconds=30,
        message="evicted pod disappears",
    )
    assert phase(core, "protected", namespace) == "Running"


def test_daemonset_runs_a_pod_on_each_selected_kwok_node(
    k8s: client.ApiClient, nodes: list[str], namespace: str, run_id: str
) -> None:
    apps = client.AppsV1Api(k8s)
    core = client.CoreV1Api(k8s)
    labels = {"app": "per-node"}
    template = pod("unused", labels=labels, nodeSelector={NODE_LABEL: run_id})
    del template["metadata"]["name"]
    apps.create_namespaced_daemon_set(
        namespace,
        {
            "metadata": {"name": "per-node"},
            "spec": {"selector": {"matchLabels": labels}, "template": template},
        },
    )

    def ready() -> bool:
        status = apps.read_namespaced_daemon_set("per-node", namespace).status
        return status is not None and status.desired_number_scheduled == 2 and status.number_ready == 2

    waiting.wait_until(ready, timeout_seconds=30, message="DaemonSet pods Ready on both test nodes")

    placed = sorted(
        p.spec.node_name for p in core.list_namespaced_pod(namespace, label_selector="app=per-node").items
    )
    assert placed == sorted(nodes)


def test_deleting_a_node_garbage_collects_its_dependents(
    k8s: client.ApiClient, namespace: str, run_id: str
) -> None:
    core = client.CoreV1Api(k8s)
    name = f"controlplane-{run_id}-gc"
    node = core.create_node(kwok_node(name, {NODE_LABEL: f"{run_id}-gc"}))
    owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node.metadata.uid}
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "owned", "ownerReferences": [owner]}})

    core.delete_node(name)

    waiting.wait_until(
        lambda: gone(core.read_namespaced_config_map, "owned", namespace),
        timeout_seconds=60,
        message="garbage collector deletes the ConfigMap owned by the deleted Node",
    )


def test_service_account_token_authenticates_and_rbac_authorizes_it(
    control_plane: local.ControlPlane, k8s: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(k8s)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    token = core.create_namespaced_service_account_token(
        "reader", namespace, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    configuration = client.Configuration(host=control_plane.server)
    configuration.ssl_ca_cert = str(control_plane.ca_cert)
    configuration.api_key = {"BearerToken": token}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}

    with client.ApiClient(configuration) as as_reader:
        review = client.AuthenticationV1Api(as_reader).create_self_subject_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        )
        assert review.status.user_info.username == f"system:serviceaccount:{namespace}:reader"

        with pytest.raises(client.ApiException) as forbidden:
            client.CoreV1Api(as_reader).list_namespaced_pod(namespace)
        assert forbidden.value.status == 403

        rbac = client.RbacAuthorizationV1Api(k8s)
        rbac.create_namespaced_role(
            namespace,
            {
                "metadata": {"name": "pod-reader"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
            },
        )
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "pod-reader"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
            },
        )

        waiting.wait_until(
            lambda: client.CoreV1Api(as_reader).list_namespaced_pod(namespace),
            timeout_seconds=30,
            message="the RoleBinding lets the service account list pods",
        )


def test_apiserver_outage_and_restart_keep_address_and_data(
    control_plane: local.ControlPlane,
    k8s: client.ApiClient,
    namespace: str,
    nodes: list[str],
    run_id: str,
) -> None:
    core = client.CoreV1Api(k8s)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "survivor"}, "data": {"k": "v"}})
    server = control_plane.server

    control_plane.stop_apiserver()
    try:
        refused = control_plane.kubectl("get", "namespaces", check=False, timeout=30)
        assert refused.returncode != 0
        assert "refused" in refused.stderr
    finally:
        control_plane.start_apiserver()

    assert control_plane.server == server
    assert core.read_namespaced_config_map("survivor", namespace).data == {"k": "v"}
    # kwok, the scheduler and the controller manager are back: Leases renewed, a new pod placed and run.
    waiting.wait_until(
        lambda: client.CoordinationV1Api(k8s).read_namespaced_lease(nodes[0], "kube-node-lease"),
        timeout_seconds=30,
        message="kwok holds the node Lease again after the outage",
    )
    core.create_namespaced_pod(namespace, pod("after-outage", nodeSelector={NODE_LABEL: run_id}))
    waiting.wait_until(
        lambda: phase(core, "after-outage", namespace) == "Running",
        timeout_seconds=60,
        message="a pod created after the outage is scheduled and Running",
    )


def test_kubectl_and_helm_run_as_the_administrator(control_plane: local.ControlPlane) -> None:
    whoami = control_plane.kubectl("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
    assert whoami.stdout == local.ADMIN_USER

    releases = control_plane.helm("list", "--all-namespaces", "--output", "json")
    assert releases.stdout.strip().startswith("[")

    with pytest.raises(local.CommandError, match="NotFound"):
        control_plane.kubectl("get", "namespace", "no-such-namespace")


def test_deployment_rolls_out_on_kwok_nodes(
    k8s: client.ApiClient, nodes: list[str], namespace: str, run_id: str
) -> None:
    apps = client.AppsV1Api(k8s)
    labels = {"app": "web"}
    template = pod("unused", labels=labels, nodeSelector={NODE_LABEL: run_id})
    del template["metadata"]["name"]
    apps.create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": "web"},
            "spec": {"replicas": 3, "selector": {"matchLabels": labels}, "template": template},
        },
    )

    def available() -> bool:
        status = apps.read_namespaced_deployment("web", namespace).status
        return status is not None and status.available_replicas == 3

    waiting.wait_until(available, timeout_seconds=30, message="Deployment web has 3 available replicas")


def test_deleting_a_namespace_removes_it_and_its_pods(
    k8s: client.ApiClient, nodes: list[str], run_id: str
) -> None:
    core = client.CoreV1Api(k8s)
    name = f"controlplane-{run_id}-doomed"
    core.create_namespace({"metadata": {"name": name}})
    waiting.wait_until(
        lambda: core.read_namespaced_service_account("default", name),
        timeout_seconds=30,
        message="default service account in the new namespace",
    )
    core.create_namespaced_pod(name, pod("resident", nodeName=nodes[0]))
    waiting.wait_until(
        lambda: phase(core, "resident", name) == "Running", timeout_seconds=30, message="pod runs"
    )

    core.delete_namespace(name)

    waiting.wait_until(
        lambda: gone(core.read_namespace, name),
        timeout_seconds=60,
        message="namespace controller removes the namespace once its pod is gone",
    )


def test_validating_admission_policy_is_enforced(k8s: client.ApiClient, namespace: str, run_id: str) -> None:
    admission = client.AdmissionregistrationV1Api(k8s)
    core = client.CoreV1Api(k8s)
    name = f"controlplane-{run_id}-no-forbidden-data"
    admission.create_validating_admission_policy(
        {
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["configmaps"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": "!has(object.data) || !('forbidden' in object.data)",
                        "message": "no forbidden key",
                    }
                ],
            },
        }
    )
    admission.create_validating_admission_policy_binding(
        {
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        }
    )
    try:

        def rejected() -> bool:
            try:
                core.create_namespaced_config_map(
                    namespace, {"metadata": {"generateName": "probe-"}, "data": {"forbidden": "x"}}
                )
            except client.ApiException as error:
                if error.status == 422 and "no forbidden key" in str(error.body):
                    return True
                raise
            return False

        waiting.wait_until(
            rejected, timeout_seconds=30, message="the ValidatingAdmissionPolicy rejects the ConfigMap"
        )
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "allowed"}, "data": {"fine": "x"}})
    finally:
        admission.delete_validating_admission_policy_binding(name)
        admission.delete_validating_admission_policy(name)
