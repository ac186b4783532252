"""`helm install` of the chart into the local control plane, and RBAC proven with real tokens.

One release serves the module. It runs in a namespace that enforces Pod
Security "restricted", so its pods being admitted at all proves both
workloads pass it. Three kwok nodes carry a label unique to this module: two
are GPU nodes (`nvidia.com/gpu.present=true`), one is not; the agent's
nodeSelector adds the unique label to the chart's default so the DaemonSet
never lands on other tests' nodes.

RBAC is proven by acting, not by reading rules: tokens are requested for the
chart's service accounts (the agent's bound to its pod on a GPU node, so the
token carries that node's name) and kubectl runs as those identities.
kwok runs pods without containers, so the tests act as the operator and the
agent would, with their tokens; then the real processes run locally with
nothing but those tokens. The CRDs come from the chart (helm installs its
crds/ when they are absent, e.g. when this module runs first).
"""

import base64
import contextlib
import dataclasses
import datetime
import json
import re
import secrets
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import operator_harness
from gpuhealth_api import keys, resources
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpu-health"
TIMEOUT_SECONDS = 120.0
UNIQUE_LABEL = "e2e.gpuhealth.io/chart"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
SCENARIO = "gpus: 4\nmodel: NVIDIA H100 80GB HBM3\ndriverVersion: 570.124.06\n"
RESTRICTED_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "seccompProfile": {"type": "RuntimeDefault"},
}


@dataclasses.dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    suffix: str
    gpu_nodes: tuple[str, str]
    cpu_node: str
    policy: str
    fullname: str

    @property
    def operator_sa(self) -> str:
        return f"{self.fullname}-operator"

    @property
    def agent_sa(self) -> str:
        return f"{self.fullname}-agent"

    @property
    def lease(self) -> str:
        return f"{self.fullname}-operator"


@dataclasses.dataclass(frozen=True)
class Identity:
    """A service account: kubectl through a kubeconfig holding only its token, or raw API requests."""

    cp: local.ControlPlane
    kubeconfig: Path
    token: str

    def request(self, method: str, path: str, body: object, content_type: str = MERGE_PATCH) -> int:
        """Send one API request as this identity, as the operator's client does; the HTTP status."""
        request = urllib.request.Request(
            self.cp.server + path,
            data=json.dumps(body).encode(),
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": content_type},
        )
        tls = ssl.create_default_context(cafile=str(self.cp.ca_cert))
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=tls)
        )
        try:
            with opener.open(request, timeout=30) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            with error:
                return error.code

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.cp.binaries / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def allowed(self, *args: str, input: str | None = None) -> str:
        result = self.kubectl(*args, input=input)
        assert result.returncode == 0, f"expected allowed: kubectl {' '.join(args)}\n{result.stderr}"
        return result.stdout

    def denied(self, *args: str, input: str | None = None) -> str:
        result = self.kubectl(*args, input=input)
        assert result.returncode != 0, (
            f"expected denied, was allowed: kubectl {' '.join(args)}\n{result.stdout}"
        )
        assert "forbidden" in result.stderr.lower() or "denied" in result.stderr.lower(), result.stderr
        return result.stderr


def identity(cp: local.ControlPlane, token: str, directory: Path, name: str) -> Identity:
    path = directory / f"{name}.kubeconfig"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": cp.server, "certificate-authority": str(cp.ca_cert)}}
        ],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": "local", "user": name}}],
        "current-context": name,
    }
    path.write_text(yaml.safe_dump(config))
    return Identity(cp, path, token)


def token_claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    claims: dict[str, Any] = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return claims


def node_manifest(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
    }


def pods_of(cp: local.ControlPlane, namespace: str, component: str) -> list[dict[str, Any]]:
    out = cp.kubectl(
        "get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/component={component}", "-o", "json"
    ).stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def install_values(suffix: str, policy: str) -> dict[str, Any]:
    return {
        "operator": {"nodeSelector": {UNIQUE_LABEL: suffix}},
        "agent": {
            "nodeSelector": {keys.GPU_PRESENT_LABEL: "true", UNIQUE_LABEL: suffix},
            "backend": "sim",
            "sim": {"scenario": SCENARIO},
        },
        "defaultPolicy": {
            "enabled": True,
            "name": policy,
            "nodeSelector": {"matchLabels": {UNIQUE_LABEL: suffix}},
        },
    }


@contextlib.contextmanager
def namespace_and_nodes(cp: local.ControlPlane, suffix: str) -> Iterator[tuple[str, tuple[str, str], str]]:
    namespace = f"chart-e2e-{suffix}"
    gpu_nodes = (f"chart-{suffix}-gpu-0", f"chart-{suffix}-gpu-1")
    cpu_node = f"chart-{suffix}-cpu-0"
    cp.kubectl("create", "namespace", namespace)
    try:
        # Proves both workloads pass Pod Security "restricted": their pods are admitted.
        cp.kubectl(
            "label",
            "namespace",
            namespace,
            "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/enforce-version=latest",
        )
        manifests = [
            node_manifest(name, {keys.GPU_PRESENT_LABEL: "true", UNIQUE_LABEL: suffix}) for name in gpu_nodes
        ] + [node_manifest(cpu_node, {UNIQUE_LABEL: suffix})]
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(manifests))
        capacity = {"cpu": "64", "memory": "512Gi", "pods": "110"}
        for name in (*gpu_nodes, cpu_node):
            cp.kubectl(
                "patch",
                "node",
                name,
                "--subresource=status",
                "--type=merge",
                "-p",
                json.dumps({"status": {"capacity": capacity, "allocatable": capacity}}),
            )
        yield namespace, gpu_nodes, cpu_node
    finally:
        cp.kubectl("delete", "node", *gpu_nodes, cpu_node, "--ignore-not-found", "--wait=false")
        cp.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=false")


@pytest.fixture(scope="module")
def release(control_plane: local.ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    suffix = "r" + secrets.token_hex(3)  # never all digits or 1e5-like: YAML would make it a number
    name = f"chart-{suffix}"
    policy = f"chart-e2e-{suffix}"
    values = tmp_path_factory.mktemp("chart") / "values.yaml"
    values.write_text(yaml.safe_dump(install_values(suffix, policy)))
    with namespace_and_nodes(control_plane, suffix) as (namespace, gpu_nodes, cpu_node):
        control_plane.helm(
            "install", name, str(CHART), "--namespace", namespace, "-f", str(values), timeout=180
        )
        try:
            yield Release(name, namespace, suffix, gpu_nodes, cpu_node, policy, f"{name}-gpu-health")
        finally:
            control_plane.helm("uninstall", name, "--namespace", namespace, check=False, timeout=180)
            control_plane.kubectl(
                "delete", resources.GPUNODE_PLURAL, *gpu_nodes, "--ignore-not-found", "--wait=false"
            )


@pytest.fixture(scope="module")
def agent_pods(control_plane: local.ControlPlane, release: Release) -> dict[str, str]:
    """node name -> name of the agent pod running there, once every agent runs."""

    def running() -> dict[str, str] | None:
        pods = pods_of(control_plane, release.namespace, "agent")
        placed = {
            p["spec"].get("nodeName"): p["metadata"]["name"]
            for p in pods
            if p["status"].get("phase") == "Running"
        }
        return placed if len(placed) == len(release.gpu_nodes) else None

    placed: dict[str, str] = waiting.wait_until(
        running, timeout_seconds=TIMEOUT_SECONDS, message="an agent pod running on each GPU node"
    )
    return placed


@pytest.fixture(scope="module")
def operator_pod(control_plane: local.ControlPlane, release: Release) -> str:
    def running() -> str | None:
        pods = [
            p
            for p in pods_of(control_plane, release.namespace, "operator")
            if p["status"].get("phase") == "Running"
        ]
        return pods[0]["metadata"]["name"] if pods else None

    pod: str = waiting.wait_until(running, timeout_seconds=TIMEOUT_SECONDS, message="a running operator pod")
    return pod


@pytest.fixture(scope="module")
def as_operator(
    control_plane: local.ControlPlane,
    release: Release,
    operator_pod: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Identity:
    token = control_plane.kubectl(
        "create", "token", release.operator_sa, "-n", release.namespace,
        "--bound-object-kind=Pod", f"--bound-object-name={operator_pod}", "--duration=30m",
    ).stdout.strip()  # fmt: skip
    return identity(control_plane, token, tmp_path_factory.mktemp("operator-identity"), "operator")


@pytest.fixture(scope="module")
def as_agent(
    control_plane: local.ControlPlane,
    release: Release,
    agent_pods: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Identity:
    """The agent of the first GPU node, with a token bound to its pod there."""
    token = control_plane.kubectl(
        "create", "token", release.agent_sa, "-n", release.namespace,
        "--bound-object-kind=Pod", f"--bound-object-name={agent_pods[release.gpu_nodes[0]]}",
        "--duration=30m",
    ).stdout.strip()  # fmt: skip
    claims = token_claims(token)
    assert claims["kubernetes.io"]["node"]["name"] == release.gpu_nodes[0], claims
    return identity(control_plane, token, tmp_path_factory.mktemp("agent-identity"), "agent")


@pytest.fixture(scope="module")
def victim(control_plane: local.ControlPlane, release: Release) -> Iterator[str]:
    """A plain pod on the first GPU node, for eviction attempts."""
    name = "victim"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": release.namespace},
        "spec": {
            "nodeName": release.gpu_nodes[0],
            "securityContext": RESTRICTED_SECURITY,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/workload:1",
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(pod))
    yield name
    control_plane.kubectl(
        "delete", "pod", name, "-n", release.namespace, "--ignore-not-found", "--wait=false"
    )


def apply_args(field_manager: str, *, status: bool = False) -> list[str]:
    """kubectl arguments for a server-side apply from stdin, as the agent and operator write."""
    return [
        "apply",
        "--server-side",
        f"--field-manager={field_manager}",
        *(["--subresource=status"] * status),
        "-f",
        "-",
    ]


def gpunode(name: str, node_uid: str | None = None) -> str:
    meta: dict[str, Any] = {"name": name}
    if node_uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}]
    return json.dumps({"apiVersion": resources.API_VERSION, "kind": resources.GPUNODE_KIND, "metadata": meta})


def apply_gpunode_as_admin(control_plane: local.ControlPlane, name: str) -> None:
    """Make sure node `name` has a GPUNode owned by its Node (the admin applies it, as a fixture)."""
    control_plane.kubectl(
        "apply",
        "--server-side",
        "--field-manager=e2e",
        "-f",
        "-",
        input=gpunode(name, node_uid(control_plane, name)),
    )


def gpunode_status(name: str, status: dict[str, Any]) -> str:
    return json.dumps(
        {
            "apiVersion": resources.API_VERSION,
            "kind": resources.GPUNODE_KIND,
            "metadata": {"name": name},
            "status": status,
        }
    )


def agent_status() -> dict[str, Any]:
    return {
        "agent": {"version": "0.1.0", "backend": "sim", "lastHeartbeatTime": now(), "heartbeatSeconds": 60},
        "summary": {"gpuCount": 4, "model": "NVIDIA H100 80GB HBM3", "maxTemperatureCelsius": 42},
    }


def node_uid(cp: local.ControlPlane, name: str) -> str:
    return cp.kubectl("get", "node", name, "-o", "jsonpath={.metadata.uid}").stdout


# -- the install -------------------------------------------------------------------------------------


def test_crds_are_established(control_plane: local.ControlPlane, release: Release) -> None:
    for plural in (resources.GPUNODE_PLURAL, resources.POLICY_PLURAL):
        status = control_plane.kubectl(
            "get",
            "crd",
            f"{plural}.{resources.GROUP}",
            "-o",
            "jsonpath={.status.conditions[?(@.type=='Established')].status}",
        ).stdout
        assert status == "True"


def test_install_creates_workloads_rbac_and_admission_policy(
    control_plane: local.ControlPlane, release: Release
) -> None:
    ns = ["-n", release.namespace]
    names = {
        ("deployment", release.fullname + "-operator", True),
        ("daemonset", release.fullname + "-agent", True),
        ("serviceaccount", release.operator_sa, True),
        ("serviceaccount", release.agent_sa, True),
        ("service", release.fullname + "-operator-metrics", True),
        ("service", release.fullname + "-agent-metrics", True),
        ("poddisruptionbudget", release.fullname + "-operator", True),
        ("role", release.fullname + "-operator-leader-election", True),
        ("rolebinding", release.fullname + "-operator-leader-election", True),
        ("configmap", release.fullname + "-agent-scenario", True),
        ("clusterrole", release.fullname + "-operator", False),
        ("clusterrolebinding", release.fullname + "-operator", False),
        ("clusterrole", release.fullname + "-agent", False),
        ("clusterrolebinding", release.fullname + "-agent", False),
        ("validatingadmissionpolicy", release.fullname + "-agent-own-node", False),
        ("validatingadmissionpolicybinding", release.fullname + "-agent-own-node", False),
    }
    for kind, name, namespaced in sorted(names):
        control_plane.kubectl("get", kind, name, *(ns if namespaced else []))
    control_plane.kubectl("get", "role,rolebinding", release.fullname + "-operator-events", "-n", "default")


def test_agents_run_on_gpu_nodes_only(
    control_plane: local.ControlPlane, release: Release, agent_pods: dict[str, str]
) -> None:
    assert set(agent_pods) == set(release.gpu_nodes)
    placed = {p["spec"].get("nodeName") for p in pods_of(control_plane, release.namespace, "agent")}
    assert release.cpu_node not in placed
    daemonset = json.loads(
        control_plane.kubectl(
            "get", "daemonset", release.fullname + "-agent", "-n", release.namespace, "-o", "json"
        ).stdout
    )
    assert daemonset["status"]["desiredNumberScheduled"] == len(release.gpu_nodes)


def test_both_workloads_pass_pod_security_restricted(
    control_plane: local.ControlPlane, release: Release, agent_pods: dict[str, str], operator_pod: str
) -> None:
    # The pods above exist in a namespace enforcing "restricted"; a privileged pod does not get in.
    privileged = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "privileged", "namespace": release.namespace},
        "spec": {"containers": [{"name": "c", "image": "x", "securityContext": {"privileged": True}}]},
    }
    result = control_plane.kubectl("apply", "-f", "-", input=json.dumps(privileged), check=False)
    assert result.returncode != 0
    assert "violates PodSecurity" in result.stderr

    def ready_operators() -> bool:
        deployment = control_plane.kubectl(
            "get", "deployment", release.fullname + "-operator", "-n", release.namespace, "-o", "json"
        )
        return json.loads(deployment.stdout)["status"].get("readyReplicas") == 2

    waiting.wait_until(
        ready_operators, timeout_seconds=TIMEOUT_SECONDS, message="both operator replicas ready"
    )


def test_default_policy_applies_cleanly(control_plane: local.ControlPlane, release: Release) -> None:
    policy = json.loads(
        control_plane.kubectl("get", resources.POLICY_PLURAL, release.policy, "-o", "json").stdout
    )
    assert policy["spec"]["dryRun"] is True
    # The chart's default selects every node with an agent (no labels); this module's label narrows it.
    assert policy["spec"]["nodeSelector"] == {"matchLabels": {UNIQUE_LABEL: release.suffix}}
    assert {r["name"] for r in policy["spec"]["rules"]} >= {"ecc", "xid", "lost"}


# -- the operator's permissions ---------------------------------------------------------------------


def test_operator_can_watch_and_change_nodes(
    control_plane: local.ControlPlane, as_operator: Identity, release: Release
) -> None:
    node = release.gpu_nodes[1]
    as_operator.allowed("get", "nodes", "-l", f"{UNIQUE_LABEL}={release.suffix}")
    as_operator.allowed("get", "--raw", "/api/v1/nodes?watch=1&timeoutSeconds=1")
    # The agents' liveness: their pods' readiness, watched by label selector.
    agents = "app.kubernetes.io/component%3Dagent"
    as_operator.allowed("get", "--raw", f"/api/v1/pods?watch=1&timeoutSeconds=1&labelSelector={agents}")
    as_operator.allowed("label", "node", node, f"{keys.HEALTH_LABEL}=unhealthy", "--overwrite")
    as_operator.allowed(
        "annotate", "node", node, f"{keys.CORDONED_BY_ANNOTATION}={release.policy}", "--overwrite"
    )
    as_operator.allowed(
        "taint", "node", node, f"{keys.UNHEALTHY_TAINT}=EccUncorrectable:NoSchedule", "--overwrite"
    )
    # Cordon and the Node condition as the operator sends them (kubectl cordon exits 0 even when
    # forbidden, and kubectl patch --subresource reads the subresource first).
    assert as_operator.request("PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True}}) == 200
    assert control_plane.kubectl("get", "node", node, "-o", "jsonpath={.spec.unschedulable}").stdout == "true"
    assert as_operator.request("PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": None}}) == 200
    as_operator.allowed("taint", "node", node, f"{keys.UNHEALTHY_TAINT}-")
    condition = {
        "type": keys.NODE_CONDITION_TYPE,
        "status": "False",
        "reason": "EccUncorrectable",
        "message": "e2e",
        "lastTransitionTime": now(),
        "lastHeartbeatTime": now(),
    }
    status_path = f"/api/v1/nodes/{node}/status"
    body = {"status": {"conditions": [condition]}}
    assert as_operator.request("PATCH", status_path, body, STRATEGIC_MERGE_PATCH) == 200
    conditions = control_plane.kubectl(
        "get", "node", node, "-o", "jsonpath={.status.conditions[*].type}"
    ).stdout
    assert keys.NODE_CONDITION_TYPE in conditions.split()


def test_operator_can_drain_through_evictions_only(
    control_plane: local.ControlPlane, as_operator: Identity, release: Release, victim: str
) -> None:
    node = release.gpu_nodes[0]
    waiting.wait_until(
        lambda: (
            "Running"
            in control_plane.kubectl(
                "get", "pod", victim, "-n", release.namespace, "-o", "jsonpath={.status.phase}"
            ).stdout
        ),
        timeout_seconds=TIMEOUT_SECONDS,
        message="the victim pod runs",
    )
    listed = as_operator.allowed(
        "get", "pods", "-A", "--field-selector", f"spec.nodeName={node}", "-o", "name"
    )
    assert f"pod/{victim}" in listed
    as_operator.denied("delete", "pod", victim, "-n", release.namespace)
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": victim, "namespace": release.namespace},
    }
    as_operator.allowed(
        "create", "--raw", f"/api/v1/namespaces/{release.namespace}/pods/{victim}/eviction", "-f", "-",
        input=json.dumps(eviction),
    )  # fmt: skip
    waiting.wait_until(
        lambda: (
            control_plane.kubectl(
                "get", "pod", victim, "-n", release.namespace, "--ignore-not-found", "-o", "name"
            ).stdout
            == ""
        ),
        timeout_seconds=TIMEOUT_SECONDS,
        message="the evicted pod is gone",
    )


def test_operator_can_post_and_bump_node_events(as_operator: Identity, release: Release) -> None:
    name = f"{release.gpu_nodes[0]}.gpuhealth.e2e"
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": release.gpu_nodes[0]},
        "reason": "EccUncorrectable",
        "message": "e2e",
        "type": "Warning",
        "source": {"component": "gpu-health-operator"},
        "firstTimestamp": now(),
        "lastTimestamp": now(),
        "count": 1,
    }
    try:
        as_operator.allowed("create", "-f", "-", input=json.dumps(event))
        as_operator.allowed("get", "event", name, "-n", "default")
        # The query NOTES.txt and docs/chart.md give users finds it.
        found = as_operator.cp.kubectl(
            "get", "events", "-A", "--field-selector", "source=gpu-health-operator", "-o", "name"
        ).stdout
        assert f"event/{name}" in found
        as_operator.allowed("patch", "event", name, "-n", "default", "--type=merge", "-p", '{"count": 2}')
        as_operator.denied(
            "create",
            "-f",
            "-",
            input=json.dumps({**event, "metadata": {"name": name, "namespace": release.namespace}}),
        )
    finally:
        as_operator.cp.kubectl("delete", "event", name, "-n", "default", "--ignore-not-found")


def test_operator_can_read_facts_and_write_verdicts(
    control_plane: local.ControlPlane, as_operator: Identity, release: Release
) -> None:
    name = release.gpu_nodes[1]
    apply_gpunode_as_admin(control_plane, name)
    as_operator.allowed("get", resources.GPUNODE_PLURAL)
    as_operator.allowed(
        "get", "--raw", f"/apis/{resources.API_VERSION}/{resources.GPUNODE_PLURAL}?watch=1&timeoutSeconds=1"
    )
    verdict = {"health": "Unhealthy", "issues": "EccUncorrectable", "action": "DryRun"}
    as_operator.allowed(
        *apply_args(resources.OPERATOR_FIELD_MANAGER, status=True), input=gpunode_status(name, verdict)
    )
    as_operator.allowed("get", resources.POLICY_PLURAL, release.policy)
    policy_status = {
        "apiVersion": resources.API_VERSION,
        "kind": resources.POLICY_KIND,
        "metadata": {"name": release.policy},
        "status": {"selectedNodes": 2, "unhealthyNodes": 1, "cordonedNodes": 0, "pendingNodes": 0},
    }
    as_operator.allowed(
        *apply_args(resources.OPERATOR_FIELD_MANAGER, status=True), input=json.dumps(policy_status)
    )
    # The facts are the agent's: the operator cannot rewrite or delete the objects.
    as_operator.denied("delete", resources.GPUNODE_PLURAL, name)
    as_operator.denied("delete", resources.POLICY_PLURAL, release.policy)


def test_operator_holds_only_its_own_lease(
    control_plane: local.ControlPlane, as_operator: Identity, release: Release
) -> None:
    def lease(name: str, holder: str, version: str | None = None) -> str:
        meta: dict[str, Any] = {"name": name, "namespace": release.namespace}
        if version:
            meta["resourceVersion"] = version
        spec = {
            "holderIdentity": holder,
            "leaseDurationSeconds": 15,
            "renewTime": now().replace("Z", ".000000Z"),
        }
        return json.dumps(
            {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}
        )

    ns = ["-n", release.namespace]
    as_operator.allowed("create", "-f", "-", input=lease(release.lease, "replica-a"))
    version = as_operator.allowed(
        "get", "lease", release.lease, *ns, "-o", "jsonpath={.metadata.resourceVersion}"
    )
    as_operator.allowed("replace", "-f", "-", input=lease(release.lease, "replica-b", version))
    other = f"{release.name}-someone-else"
    control_plane.kubectl("create", "-f", "-", input=lease(other, "someone"))
    version = control_plane.kubectl(
        "get", "lease", other, *ns, "-o", "jsonpath={.metadata.resourceVersion}"
    ).stdout
    as_operator.denied("replace", "-f", "-", input=lease(other, "replica-a", version))
    as_operator.denied("get", "lease", other, *ns)


def test_operator_has_nothing_else(as_operator: Identity, release: Release) -> None:
    as_operator.denied("get", "secrets", "-n", release.namespace)
    as_operator.denied("create", "configmap", "x", "-n", release.namespace)
    as_operator.denied("delete", "node", release.cpu_node)
    as_operator.denied("get", "namespaces")


# -- the agent's permissions ------------------------------------------------------------------------


def test_agent_writes_its_own_gpunode(
    control_plane: local.ControlPlane, as_agent: Identity, release: Release
) -> None:
    own = release.gpu_nodes[0]
    as_agent.allowed("get", "node", own)
    as_agent.allowed(
        *apply_args(resources.AGENT_FIELD_MANAGER), input=gpunode(own, node_uid(control_plane, own))
    )
    as_agent.allowed(
        *apply_args(resources.AGENT_FIELD_MANAGER, status=True), input=gpunode_status(own, agent_status())
    )
    as_agent.allowed("get", resources.GPUNODE_PLURAL, own)
    stored = json.loads(control_plane.kubectl("get", resources.GPUNODE_PLURAL, own, "-o", "json").stdout)
    assert stored["status"]["summary"]["gpuCount"] == 4


def test_agent_is_denied_another_nodes_gpunode(
    control_plane: local.ControlPlane, as_agent: Identity, release: Release
) -> None:
    other = release.gpu_nodes[1]
    apply_gpunode_as_admin(control_plane, other)
    message = as_agent.denied(
        *apply_args(resources.AGENT_FIELD_MANAGER, status=True), input=gpunode_status(other, agent_status())
    )
    assert f"may write only GPUNode {release.gpu_nodes[0]}, not {other}" in message
    as_agent.denied(
        "patch", resources.GPUNODE_PLURAL, other, "--type=merge", "-p", '{"metadata":{"labels":{"x":"y"}}}'
    )
    control_plane.kubectl("delete", resources.GPUNODE_PLURAL, other)
    message = as_agent.denied("create", "-f", "-", input=gpunode(other, node_uid(control_plane, other)))
    assert "may write only GPUNode" in message
    # Issue 48: an agent watches its own GPUNode for the operator's release ask (list/watch by
    # metadata.name; RBAC cannot narrow it to the caller's node, so it may read, never write, others).
    own = release.gpu_nodes[0]
    as_agent.allowed(
        "get",
        "--raw",
        f"/apis/{resources.API_VERSION}/{resources.GPUNODE_PLURAL}?fieldSelector=metadata.name%3D{own}"
        "&watch=1&timeoutSeconds=1",
    )


def test_agent_cannot_touch_nodes_or_pods(as_agent: Identity, release: Release, victim: str) -> None:
    own = release.gpu_nodes[0]
    as_agent.denied("label", "node", own, "x=y")
    assert as_agent.request("PATCH", f"/api/v1/nodes/{own}", {"spec": {"unschedulable": True}}) == 403
    assert as_agent.request("PATCH", f"/api/v1/nodes/{own}/status", {"status": {"conditions": []}}) == 403
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": victim, "namespace": release.namespace},
    }
    as_agent.denied(
        "create", "--raw", f"/api/v1/namespaces/{release.namespace}/pods/{victim}/eviction", "-f", "-",
        input=json.dumps(eviction),
    )  # fmt: skip
    as_agent.denied("delete", resources.GPUNODE_PLURAL, own)
    as_agent.denied("get", "pods", "-n", release.namespace)


def test_agent_token_without_a_node_is_denied(
    control_plane: local.ControlPlane, release: Release, tmp_path: Path
) -> None:
    # A token not bound to a pod carries no node name: the admission policy fails closed.
    token = control_plane.kubectl(
        "create", "token", release.agent_sa, "-n", release.namespace, "--duration=10m"
    ).stdout.strip()
    unbound = identity(control_plane, token, tmp_path, "unbound-agent")
    own = release.gpu_nodes[0]
    message = unbound.denied(
        *apply_args(resources.AGENT_FIELD_MANAGER, status=True), input=gpunode_status(own, agent_status())
    )
    assert "token bound to a pod" in message


# -- the real processes with the chart's identities ---------------------------------------------------

FAULTY_SCENARIO = (
    "gpus: 4\nmodel: NVIDIA H100 80GB HBM3\ndriverVersion: 570.124.06\n"
    "timeline:\n- {after: 0s, gpu: 1, set: {eccUncorrectedVolatile: 1}}\n"
)


def gpunode_status_of(cp: local.ControlPlane, name: str) -> dict[str, Any]:
    result = cp.kubectl("get", resources.GPUNODE_PLURAL, name, "--ignore-not-found", "-o", "json")
    body: dict[str, Any] = json.loads(result.stdout) if result.stdout.strip() else {}
    status: dict[str, Any] = body.get("status", {})
    return status


def test_real_agent_and_operator_work_with_the_chart_permissions(
    control_plane: local.ControlPlane,
    release: Release,
    as_agent: Identity,
    as_operator: Identity,
    tmp_path: Path,
) -> None:
    """`gpu-health-agent` and `gpu-health-operator` themselves, each with only its chart token.

    The agent (simulated GPUs, one with an uncorrectable ECC error) recreates
    its node's GPUNode and reports; the operator takes the Lease, judges the
    node under the chart's dry-run policy and records its verdict. Any
    permission the code needs and the chart lacks fails this test.
    """
    own = release.gpu_nodes[0]
    control_plane.kubectl("delete", resources.GPUNODE_PLURAL, own, "--ignore-not-found")
    control_plane.kubectl("delete", "lease", release.lease, "-n", release.namespace, "--ignore-not-found")
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(FAULTY_SCENARIO)
    agent_log = (tmp_path / "agent.log").open("wb")
    agent = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "gpu-health-agent"), "run", f"--node-name={own}",
            "--backend=sim", f"--sim-scenario={scenario}", f"--kubeconfig={as_agent.kubeconfig}",
            "--interval=0.5", "--heartbeat=30", "--metrics-port=0",
        ],
        stdout=agent_log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    operator = operator_harness.OperatorProcess(
        kubeconfig=as_operator.kubeconfig,
        log_path=tmp_path / "operator.log",
        lease_namespace=release.namespace,
        lease_name=release.lease,
        identity="chart-e2e",
        extra_args=["--tick-seconds=0.5"],
    )
    try:
        reported = waiting.wait_until(
            lambda: gpunode_status_of(control_plane, own).get("summary", {}).get("gpuCount") == 4,
            timeout_seconds=TIMEOUT_SECONDS,
            message=f"the real agent reports GPUNode {own}",
        )
        assert reported
        operator.start()
        waiting.wait_until(operator.is_leading, timeout_seconds=TIMEOUT_SECONDS, message="the operator leads")
        judged = waiting.wait_until(
            lambda: (s := gpunode_status_of(control_plane, own)).get("action") == "DryRun" and s,
            timeout_seconds=TIMEOUT_SECONDS,
            message=f"the operator's dry-run verdict on GPUNode {own}",
        )
        assert judged["health"] == "Unhealthy"
        assert "EccUncorrectable" in judged["issues"]
        holder = control_plane.kubectl(
            "get", "lease", release.lease, "-n", release.namespace, "-o", "jsonpath={.spec.holderIdentity}"
        ).stdout
        assert holder == "chart-e2e"
        # Dry-run: the node is judged, not touched.
        assert control_plane.kubectl("get", "node", own, "-o", "jsonpath={.spec.unschedulable}").stdout == ""
        fire_drill(control_plane, own)
    finally:
        operator.stop()
        agent.terminate()
        try:
            agent.wait(timeout=15)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
        agent_log.close()
        print("--- agent log ---\n" + (tmp_path / "agent.log").read_text()[-5000:])
        print("--- operator log ---\n" + (tmp_path / "operator.log").read_text()[-5000:])
    forbidden = [
        line
        for log in ("agent.log", "operator.log")
        for line in (tmp_path / log).read_text().splitlines()
        if denied(line)
    ]
    assert forbidden == [], forbidden


def fire_drill(control_plane: local.ControlPlane, node: str) -> None:
    """The documented drill under the chart's RBAC: the operator starts it, says it, ends it at its TTL.

    "Drill started" is said only once the operator wrote `drill-started` on the GPUNode, and the end
    removes the drill's annotations: both need the chart's `patch` on gpunodes.
    """
    control_plane.kubectl(
        "annotate", resources.GPUNODE_PLURAL, node, "gpuhealth.io/drill=GPULost", "gpuhealth.io/drill-ttl=6s"
    )

    def said() -> str:
        return control_plane.kubectl(
            "get", "events", "-n", "default", "--field-selector", f"reason=Drill,involvedObject.name={node}",
            "-o", "jsonpath={range .items[*]}{.message}{'\\n'}{end}",
        ).stdout  # fmt: skip

    def annotations() -> str:
        return control_plane.kubectl(
            "get", resources.GPUNODE_PLURAL, node, "-o", "jsonpath={.metadata.annotations}"
        ).stdout

    waiting.wait_until(
        lambda: "Drill started: GPULost" in said(),
        timeout_seconds=TIMEOUT_SECONDS,
        message="the drill starts",
    )
    waiting.wait_until(
        lambda: "Drill ended: its TTL of 6s" in said() and "gpuhealth.io/drill" not in annotations(),
        timeout_seconds=TIMEOUT_SECONDS,
        message="the drill ends at its TTL (annotations removed with the chart's permissions)",
    )
    assert control_plane.kubectl("get", "node", node, "-o", "jsonpath={.spec.unschedulable}").stdout == ""


def denied(log_line: str) -> bool:
    """A log line that reports an API denial, judged without its timestamp (``…,403`` is a millisecond)."""
    message = LOG_TIMESTAMP.sub("", log_line, count=1)
    return re.search(r"\b403\b", message) is not None or "forbidden" in message.lower()


LOG_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")


# -- uninstall ----------------------------------------------------------------------------------------

CHART_KINDS = (
    "deployments,daemonsets,services,serviceaccounts,configmaps,roles,rolebindings,poddisruptionbudgets,"
    "resourcequotas"
)
CLUSTER_KINDS = (
    "clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings"
)


def test_upgrade_then_uninstall_leaves_only_the_crds(
    control_plane: local.ControlPlane, tmp_path: Path
) -> None:
    suffix = "r" + secrets.token_hex(3)  # never all digits or 1e5-like: YAML would make it a number
    name, policy = f"chart-un-{suffix}", f"chart-un-{suffix}"
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(install_values(suffix, policy)))
    with namespace_and_nodes(control_plane, suffix) as (namespace, _gpu_nodes, _cpu_node):
        control_plane.helm(
            "install", name, str(CHART), "--namespace", namespace, "-f", str(values), timeout=180
        )
        # The step NOTES.txt suggests once the dry-run Events look right.
        upgrade = control_plane.helm(
            "upgrade", name, str(CHART), "--namespace", namespace, "--reuse-values",
            "--set", "defaultPolicy.dryRun=false", timeout=180,
        )  # fmt: skip
        assert "STATUS: deployed" in upgrade.stdout
        dry_run = control_plane.kubectl(
            "get", resources.POLICY_PLURAL, policy, "-o", "jsonpath={.spec.dryRun}"
        ).stdout
        assert dry_run == "false"
        selector = f"app.kubernetes.io/instance={name}"
        assert control_plane.kubectl("get", CHART_KINDS, "-A", "-l", selector, "-o", "name").stdout.strip()
        control_plane.helm("uninstall", name, "--namespace", namespace, "--wait", timeout=180)

        def leftovers() -> str:
            return "".join(
                control_plane.kubectl("get", kinds, *scope, "-l", selector, "-o", "name").stdout
                for kinds, scope in (
                    (CHART_KINDS, ["-A"]),
                    (CLUSTER_KINDS, []),
                    (resources.POLICY_PLURAL, []),
                )
            ).strip()

        assert waiting.wait_until(
            lambda: leftovers() == "", timeout_seconds=TIMEOUT_SECONDS, message="no objects left"
        )
        for plural in (resources.GPUNODE_PLURAL, resources.POLICY_PLURAL):
            control_plane.kubectl("get", "crd", f"{plural}.{resources.GROUP}")


def test_a_log_line_is_a_denial_by_its_message_not_its_timestamp() -> None:
    assert not denied(
        "2026-11-22 07:48:09,403 INFO gpuhealth_operator.runtime.leader: waiting for leader Lease ns/l"
    )
    assert not denied("2026-11-22 07:48:08,209 INFO reporter: created GPUNode n owned by Node uid a4031-0403")
    assert denied("2026-11-22 07:48:09,500 ERROR reporter: (403) Reason: Forbidden")
    assert denied("2026-11-22 07:48:09,500 WARNING kopf: APIForbiddenError: nodes is forbidden")
