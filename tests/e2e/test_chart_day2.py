"""Day 2 with the chart: who may look, `helm test`, priority and tolerations.

- The chart aggregates read access to GPUNodes and policies into the built-in
  `view` ClusterRole, and policy writes into `edit` (and so `admin`): an
  on-call engineer bound to `view` can `kubectl get gpunodes` / `ghp`, one
  bound to `edit` can change a policy, neither can write a GPUNode. Proven on
  the local API server with its controller manager doing the aggregation.
- `helm test` runs one pod with the chart's image and the operator's
  ServiceAccount: both CRDs are served and readable, and an operator replica
  holds the Lease and renewed it recently. kwok fakes pods without running
  containers, so `helm test` cannot execute here; the pod is asserted as a
  valid test hook the API server accepts under Pod Security "restricted", and
  its script is run here as a process with a token of the operator's
  ServiceAccount (the chart's RBAC) against a fresh and a stale Lease.
- Priority classes and tolerations that fit GPU pools on EKS, GKE and AKS.
"""

from __future__ import annotations

import datetime
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.e2e

ROOT: Final = Path(__file__).resolve().parents[2]
CHART: Final = ROOT / "charts" / "gpu-health"
KUBE_VERSION: Final = "1.36.0"
AGGREGATE: Final = "rbac.authorization.k8s.io/aggregate-to-"
READ: Final = {"get", "list", "watch"}


def render(
    cp: local.ControlPlane, *args: str, release: str = "day2", namespace: str = "gpu-health"
) -> list[dict[str, Any]]:
    out = cp.helm(
        "template", release, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION, *args
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def aggregated(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The chart's ClusterRoles aggregated into built-in roles, by the role they join (view, edit, admin)."""
    roles: dict[str, dict[str, Any]] = {}
    for obj in objects:
        if obj["kind"] != "ClusterRole":
            continue
        for label, value in obj["metadata"]["labels"].items():
            if label.startswith(AGGREGATE) and value == "true":
                roles.setdefault(label.removeprefix(AGGREGATE), obj)
    return roles


def grants(role: dict[str, Any]) -> set[tuple[str, str]]:
    return {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}


def test_view_reads_and_edit_writes_policies_only(control_plane: local.ControlPlane) -> None:
    roles = aggregated(render(control_plane))
    assert set(roles) == {"view", "edit", "admin"}
    view = grants(roles["view"])
    for resource in ("gpunodes", "gpuhealthpolicies", "gpunodes/status", "gpuhealthpolicies/status"):
        assert {(resource, verb) for verb in READ} <= view, resource
    assert {verb for _, verb in view} == READ
    edit = grants(roles["edit"])
    assert {("gpuhealthpolicies", v) for v in ("create", "update", "patch", "delete")} <= edit
    # GPUNodes are the agents' and the operator's to write, never a human's.
    assert not {resource for resource, _ in edit} & {
        "gpunodes",
        "gpunodes/status",
        "gpuhealthpolicies/status",
    }
    assert roles["admin"] is roles["edit"]


def test_aggregation_can_be_turned_off(control_plane: local.ControlPlane) -> None:
    assert aggregated(render(control_plane, "--set", "rbac.aggregateToDefaultRoles=false")) == {}


@pytest.fixture
def bound_users(crds: local.ControlPlane) -> Iterator[dict[str, str]]:
    """The chart's aggregated roles applied; one user bound cluster-wide to each built-in role."""
    suffix = secrets.token_hex(3)
    roles = list(aggregated(render(crds, release=f"agg-{suffix}")).values())
    unique = {r["metadata"]["name"]: r for r in roles}
    users = {builtin: f"oncall-{builtin}-{suffix}" for builtin in ("view", "edit", "admin")}
    bindings = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": user},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": builtin},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
        for builtin, user in users.items()
    ]
    manifest = yaml.safe_dump_all([*unique.values(), *bindings])
    crds.kubectl("apply", "-f", "-", input=manifest)
    try:
        yield users
    finally:
        crds.kubectl("delete", "--ignore-not-found", "-f", "-", input=manifest, check=False)


def can(cp: local.ControlPlane, user: str, *args: str) -> bool:
    result = cp.kubectl("auth", "can-i", *args, "--as", user, check=False)
    return result.stdout.strip() == "yes"


def test_on_call_with_view_reads_and_with_edit_changes_policies(
    crds: local.ControlPlane, bound_users: dict[str, str]
) -> None:
    view, edit, admin = bound_users["view"], bound_users["edit"], bound_users["admin"]
    waiting.wait_until(
        lambda: (
            can(crds, view, "list", "gpunodes.gpuhealth.io")
            and can(crds, admin, "patch", "gpuhealthpolicies.gpuhealth.io")
        ),
        timeout_seconds=60,
        message="the controller manager aggregating the chart's roles into view, edit and admin",
    )
    # What the on-call engineer types, through the API server.
    crds.kubectl("get", "gpunodes", "--as", view)
    crds.kubectl("get", "ghp", "--as", view)
    assert not can(crds, view, "create", "gpuhealthpolicies.gpuhealth.io")
    # edit includes view, admin includes edit.
    assert can(crds, edit, "list", "gpunodes.gpuhealth.io")
    for verb in ("create", "update", "patch", "delete"):
        assert can(crds, edit, verb, "gpuhealthpolicies.gpuhealth.io"), verb
    for user in (view, edit, admin):
        assert not can(crds, user, "patch", "gpunodes.gpuhealth.io"), user
        assert not can(crds, user, "patch", "gpunodes.gpuhealth.io", "--subresource=status"), user


def helm_test_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (pod,) = [o for o in objects if o["kind"] == "Pod"]
    return pod


def test_helm_test_is_a_test_hook_with_the_charts_image_and_the_operators_account(
    control_plane: local.ControlPlane,
) -> None:
    objects = render(control_plane)
    pod = helm_test_pod(objects)
    annotations = pod["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "test"
    assert "before-hook-creation" in annotations["helm.sh/hook-delete-policy"]
    (operator,) = [o for o in objects if o["kind"] == "Deployment"]
    operator_pod = operator["spec"]["template"]["spec"]
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["serviceAccountName"] == operator_pod["serviceAccountName"]
    (container,) = spec["containers"]
    assert container["image"] == operator_pod["containers"][0]["image"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    (lease,) = [o for o in objects if o["kind"] == "Role" and "leases" in str(o["rules"])]
    assert env["LEASE_NAME"] in str(lease["rules"])


def test_helm_test_can_be_turned_off(control_plane: local.ControlPlane) -> None:
    assert [o for o in render(control_plane, "--set", "tests.enabled=false") if o["kind"] == "Pod"] == []


def test_the_helm_test_pod_passes_restricted_pod_security(crds: local.ControlPlane, namespace: str) -> None:
    crds.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted", "--overwrite"
    )
    objects = render(crds, namespace=namespace)
    pod = helm_test_pod(objects)
    # The pod's ServiceAccount must exist (the namespace goes with the test).
    (account,) = [
        o
        for o in objects
        if o["kind"] == "ServiceAccount" and o["metadata"]["name"] == pod["spec"]["serviceAccountName"]
    ]
    crds.kubectl("apply", "-f", "-", input=yaml.safe_dump(account))
    result = crds.kubectl(
        "apply", "--dry-run=server", "--server-side", "--field-manager=chart-test", "-f", "-",
        input=yaml.safe_dump(pod),
    )  # fmt: skip
    assert "serverside-applied" in result.stdout, result.stdout
    assert "would violate PodSecurity" not in result.stderr, result.stderr


def run_helm_test_script(
    cp: local.ControlPlane, namespace: str, release: str, directory: Path
) -> subprocess.CompletedProcess[str]:
    """The test pod's script as a process, as the operator's ServiceAccount of the rendered chart."""
    objects = render(cp, release=release, namespace=namespace)
    pod = helm_test_pod(objects)
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    token = cp.kubectl(
        "create", "token", pod["spec"]["serviceAccountName"], "-n", namespace, "--duration=10m"
    ).stdout.strip()
    kubeconfig = directory / "helm-test.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "l", "cluster": {"server": cp.server, "certificate-authority": str(cp.ca_cert)}}
                ],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "c", "context": {"cluster": "l", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    assert container["command"][:2] == ["python", "-c"]
    return subprocess.run(
        [sys.executable, "-c", container["command"][2]],
        env={**os.environ, **env, "KUBECONFIG": str(kubeconfig), "POD_NAMESPACE": namespace},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def chart_rbac(crds: local.ControlPlane, namespace: str) -> Iterator[str]:
    """The rendered chart's ServiceAccounts and RBAC applied in `namespace`; the release name."""
    release = f"ht-{secrets.token_hex(3)}"
    kinds = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    objects = [o for o in render(crds, release=release, namespace=namespace) if o["kind"] in kinds]
    manifest = yaml.safe_dump_all(objects)
    crds.kubectl("apply", "-f", "-", input=manifest)
    try:
        yield release
    finally:
        crds.kubectl("delete", "--ignore-not-found", "-f", "-", input=manifest, check=False)


def put_lease(cp: local.ControlPlane, namespace: str, name: str, renewed: datetime.datetime) -> None:
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "holderIdentity": "operator-0",
            "leaseDurationSeconds": 15,
            "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
    }
    cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump(lease))


def test_helm_test_passes_with_a_leading_operator_and_fails_without_one(
    crds: local.ControlPlane, namespace: str, chart_rbac: str, tmp_path: Path
) -> None:
    pod = helm_test_pod(render(crds, release=chart_rbac, namespace=namespace))
    lease = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}["LEASE_NAME"]
    now = datetime.datetime.now(datetime.UTC)

    # No Lease at all: no operator ever led.
    result = run_helm_test_script(crds, namespace, chart_rbac, tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"Lease {lease}" in result.stdout

    put_lease(crds, namespace, lease, now - datetime.timedelta(minutes=10))
    result = run_helm_test_script(crds, namespace, chart_rbac, tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "not renewed" in result.stdout

    put_lease(crds, namespace, lease, now)
    result = run_helm_test_script(crds, namespace, chart_rbac, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "gpunodes.gpuhealth.io served" in result.stdout
    assert "operator-0" in result.stdout


def test_default_priority_classes_and_the_quota_that_admits_them(
    control_plane: local.ControlPlane,
) -> None:
    objects = render(control_plane)
    (agent,) = [o for o in objects if o["kind"] == "DaemonSet"]
    (operator,) = [o for o in objects if o["kind"] == "Deployment"]
    assert agent["spec"]["template"]["spec"]["priorityClassName"] == "system-node-critical"
    assert operator["spec"]["template"]["spec"]["priorityClassName"] == "system-cluster-critical"
    # Where the API server admits the critical classes outside kube-system only
    # against a quota (GKE), the chart's quota is that allowance for both.
    (quota,) = [o for o in objects if o["kind"] == "ResourceQuota"]
    (expression,) = quota["spec"]["scopeSelector"]["matchExpressions"]
    assert expression["scopeName"] == "PriorityClass"
    assert sorted(expression["values"]) == ["system-cluster-critical", "system-node-critical"]


def test_the_quota_admits_only_classes_in_use(control_plane: local.ControlPlane) -> None:
    objects = render(control_plane, "--set", "operator.priorityClassName=")
    (quota,) = [o for o in objects if o["kind"] == "ResourceQuota"]
    assert quota["spec"]["scopeSelector"]["matchExpressions"][0]["values"] == ["system-node-critical"]
    objects = render(
        control_plane, "--set", "operator.priorityClassName=", "--set", "agent.priorityClassName="
    )
    assert [o for o in objects if o["kind"] == "ResourceQuota"] == []


def test_agents_tolerate_the_gpu_pool_taints_of_eks_gke_and_aks(
    control_plane: local.ControlPlane,
) -> None:
    objects = render(control_plane)
    (agent,) = [o for o in objects if o["kind"] == "DaemonSet"]
    tolerations = agent["spec"]["template"]["spec"]["tolerations"]

    def tolerated(key: str, value: str, effect: str) -> bool:
        return any(
            t.get("key") == key
            and (t.get("operator") == "Exists" or t.get("value") == value)
            and t.get("effect") in (None, effect)
            for t in tolerations
        )

    assert tolerated("nvidia.com/gpu", "present", "NoSchedule")  # GKE
    assert tolerated("nvidia.com/gpu", "true", "NoSchedule")  # EKS managed GPU node groups, GPU Operator docs
    assert tolerated("sku", "gpu", "NoSchedule")  # AKS GPU node pools
    assert tolerated("gpuhealth.io/unhealthy", "", "NoExecute")  # the operator's own taint
    # Nothing blanket: the agent must not land on every tainted node.
    assert all(t.get("key") for t in tolerations), tolerations
    (operator,) = [o for o in objects if o["kind"] == "Deployment"]
    assert all(t.get("key") for t in operator["spec"]["template"]["spec"].get("tolerations", []))
