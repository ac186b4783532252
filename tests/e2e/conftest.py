"""Fixtures for the mission tests: the chart installed, the operator and the agents as real processes.

`mission_release` runs `helm install` of charts/gpu-health into the local
control plane, so the CRDs, RBAC, the admission policy and the service
accounts are the chart's own. Its pods land on kwok nodes and never really
run; the product runs beside them as real processes from the installed
console scripts, with the command line and environment the chart's pod
specs declare (only ports, mounted files and the credentials substituted),
each with a kubeconfig holding only a TokenRequest token of the chart's
service account, bound to the chart's pod on the right node. So
every request the operator and the agents make is checked against the
chart's RBAC and, for agents, the ValidatingAdmissionPolicy reading the node
name from the token: if the chart forgets a permission, a mission test fails.

`mission_operator` is one operator process for the module. `mission` gives a
test its own kwok GPU nodes (with a label only its policy selects), starts one
agent per node with a scenario file, and on teardown stops the agents and
deletes what the test made. A failed test's report carries what the cluster
shows for each of its nodes (cordon, our keys, GPUNode verdict, Events) and
the operator's and agents' log tails.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import re
import secrets
import subprocess
import sys
import urllib.request
from collections.abc import Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import pytest
import yaml
from kubernetes import client

from gpuhealth_api import keys, resources
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import kubeconfigs, local, ports, processes

ROOT: Final = Path(__file__).resolve().parents[2]
CHART: Final = ROOT / "charts" / "gpu-health"
BIN: Final = Path(sys.executable).parent
"""Where the project's console scripts are installed (the venv running pytest)."""

RELEASE: Final = "mission"
NAMESPACE: Final = "gpu-health-e2e-mission"
FULLNAME: Final = f"{RELEASE}-gpu-health"
WORKLOAD_NAMESPACE: Final = "gpu-health-e2e-mission-workload"
MISSION_LABEL: Final = "e2e.gpuhealth.io/mission"
"""On every node of this module: the chart's agent DaemonSet selects it, so it never lands elsewhere."""
TEST_LABEL: Final = "e2e.gpuhealth.io/mission-test"
"""Unique per test: that test's policy selects only its own nodes."""
MODEL: Final = "NVIDIA H100 80GB HBM3"
DRIVER: Final = "570.124.06"
SETUP_TIMEOUT_SECONDS: Final = 60.0
TOKEN_DURATION: Final = "2h"
AGENT_INTERVAL_SECONDS: Final = 1
AGENT_HEARTBEAT_SECONDS: Final = 10
HEALTHY_SCENARIO: Final = (
    f"description: healthy, busy node\ngpus: 8\nmodel: {MODEL}\ndriverVersion: {DRIVER}\n"
    "defaults: {temperatureCelsius: 45, smClockMHz: 1980, maxSmClockMHz: 1980, powerWatts: 520,"
    " utilizationPercent: 96}\ntimeline: []\n"
)
NODE_CAPACITY: Final = {"cpu": "64", "memory": "512Gi", "pods": "110"}
LOG_TAIL_LINES: Final = 60


# -- the release -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Release:
    """The chart installed for this module, and how to act as its service accounts."""

    cp: local.ControlPlane
    suffix: str
    """Value of MISSION_LABEL on this module's nodes."""
    system_node: str
    """A non-GPU kwok node where the chart's operator pod lands."""

    @property
    def operator_sa(self) -> str:
        return f"{FULLNAME}-operator"

    @property
    def agent_sa(self) -> str:
        return f"{FULLNAME}-agent"

    @property
    def lease(self) -> str:
        return f"{FULLNAME}-operator"

    def pods(self, component: str) -> list[dict[str, Any]]:
        out = self.cp.kubectl(
            "get", "pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/component={component}", "-o", "json"
        ).stdout
        items: list[dict[str, Any]] = json.loads(out)["items"]
        return items

    def pod_on(self, component: str, node: str) -> dict[str, Any] | None:
        """The chart's running `component` pod on `node`, if there is one yet."""
        for pod in self.pods(component):
            if pod["spec"].get("nodeName") == node and pod["status"].get("phase") == "Running":
                return pod
        return None

    def kubeconfig(self, service_account: str, pod: str, node: str, path: Path) -> Path:
        """A kubeconfig holding only a token of `service_account` bound to `pod` on `node`."""
        token = self.cp.kubectl(
            "create", "token", service_account, "-n", NAMESPACE,
            "--bound-object-kind=Pod", f"--bound-object-name={pod}", f"--duration={TOKEN_DURATION}",
        ).stdout.strip()  # fmt: skip
        # What the agents' admission policy reads: the token names the node its pod runs on.
        assert token_node(token) == node, f"token bound to {pod} does not name node {node}"
        return kubeconfigs.write(
            path, server=self.cp.server, ca_cert=self.cp.ca_cert, user=service_account, token=token
        )


def token_node(token: str) -> str | None:
    """The node name in a pod-bound service-account token's claims."""
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    name = claims.get("kubernetes.io", {}).get("node", {}).get("name")
    return name if isinstance(name, str) else None


def node_manifest(name: str, labels: Mapping[str, str], *, gpus: int | None) -> dict[str, Any]:
    gpu_labels = (
        {
            keys.GPU_PRESENT_LABEL: "true",
            keys.GPU_PRODUCT_LABEL: MODEL.replace(" ", "-"),
            keys.GPU_COUNT_LABEL: str(gpus),
        }
        if gpus
        else {}
    )
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "type": "kwok", **gpu_labels, **labels},
            "annotations": {local.KWOK_NODE_ANNOTATION: local.KWOK_NODE_ANNOTATION_VALUE},
        },
    }


def create_nodes(cp: local.ControlPlane, manifests: Sequence[dict[str, Any]]) -> None:
    """Create kwok nodes with their capacity; they join the chart's selection (MISSION_LABEL) once Ready.

    A real kubelet registers its Node, Ready and with its capacity, before any pod is bound to it. Here
    the Node is created bare, and kwok and the status patch below fill it in: a DaemonSet pod created in
    that instant once stayed Pending past the 60 s wait (CI, 2026-11-25), while every other agent pod ran
    within 0.15 s. So the label the chart's DaemonSets select on is added only after kwok reports the
    nodes Ready with their capacity.
    """
    joining = {m["metadata"]["name"]: m["metadata"]["labels"].get(MISSION_LABEL) for m in manifests}
    bare = [
        {**m, "metadata": {**m["metadata"], "labels": _without(m["metadata"]["labels"], MISSION_LABEL)}}
        for m in manifests
    ]
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(bare))
    for manifest in manifests:
        gpus = manifest["metadata"]["labels"].get(keys.GPU_COUNT_LABEL)
        capacity = {**NODE_CAPACITY, **({keys.GPU_RESOURCE: gpus} if gpus else {})}
        cp.kubectl(
            "patch", "node", manifest["metadata"]["name"], "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"capacity": capacity, "allocatable": capacity}}),
        )  # fmt: skip
    names = [f"node/{name}" for name in joining]
    cp.kubectl(
        "wait", "--for=condition=Ready", f"--timeout={SETUP_TIMEOUT_SECONDS:g}s", *names,
        timeout=SETUP_TIMEOUT_SECONDS + 30,
    )  # fmt: skip
    for name, value in joining.items():
        if value is not None:
            cp.kubectl("label", "node", name, f"{MISSION_LABEL}={value}")


def _without(labels: Mapping[str, str], key: str) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k != key}


def install_values(suffix: str) -> dict[str, Any]:
    return {
        # One replica: the process the tests run is the operator; the pod only anchors its token.
        "operator": {"replicas": 1, "nodeSelector": {MISSION_LABEL: f"system-{suffix}"}},
        "agent": {
            "backend": "sim",
            "sim": {"scenario": HEALTHY_SCENARIO},
            # Quicker than the defaults (5 s, 60 s) so the module runs in minutes.
            "intervalSeconds": AGENT_INTERVAL_SECONDS,
            "heartbeatSeconds": AGENT_HEARTBEAT_SECONDS,
            "nodeSelector": {keys.GPU_PRESENT_LABEL: "true", MISSION_LABEL: suffix},
        },
    }


@pytest.fixture(scope="module")
def mission_release(
    control_plane: local.ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    # Not the `crds` fixture: when this module runs first, the CRDs come from the chart too.
    cp = control_plane
    suffix = "r" + secrets.token_hex(3)  # never all digits or 1e5-like: YAML would make it a number
    system_node = f"mission-{suffix}-system"
    values = tmp_path_factory.mktemp("mission-chart") / "values.yaml"
    values.write_text(yaml.safe_dump(install_values(suffix)))
    # Another module's release may still be going away (its namespaces are deleted without waiting).
    waiting.wait_until(
        lambda: (
            not cp.kubectl(
                "get", "namespace", NAMESPACE, WORKLOAD_NAMESPACE, "--ignore-not-found", "-o", "name"
            ).stdout.strip()
        ),
        timeout_seconds=180,
        interval_seconds=1,
        message=f"namespaces {NAMESPACE} and {WORKLOAD_NAMESPACE} of an earlier release gone",
    )
    create_nodes(cp, [node_manifest(system_node, {MISSION_LABEL: f"system-{suffix}"}, gpus=None)])
    cp.kubectl("create", "namespace", WORKLOAD_NAMESPACE)
    try:
        cp.helm(
            "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
            "-f", str(values), timeout=180,
        )  # fmt: skip
        plurals = (resources.GPUNODE_PLURAL, resources.POLICY_PLURAL)
        crds = [f"crd/{plural}.{resources.GROUP}" for plural in plurals]
        cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", *crds)
        try:
            yield Release(cp, suffix, system_node)
        finally:
            cp.helm("uninstall", RELEASE, "--namespace", NAMESPACE, check=False, timeout=180)
            cp.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
    finally:
        cp.kubectl(
            "delete", "namespace", WORKLOAD_NAMESPACE, "--ignore-not-found", "--wait=false", check=False
        )
        cp.kubectl("delete", "node", system_node, "--ignore-not-found", "--wait=false", check=False)


# -- processes -----------------------------------------------------------------------------------------


def container_env(pod: Mapping[str, Any]) -> dict[str, str]:
    """The environment the kubelet would give the pod's first container (values and downward API)."""
    fields = {
        "metadata.namespace": pod["metadata"]["namespace"],
        "metadata.name": pod["metadata"]["name"],
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "status.hostIP": pod["status"].get("hostIP", "127.0.0.1"),
    }
    env: dict[str, str] = {}
    for var in pod["spec"]["containers"][0].get("env") or []:
        if "value" in var:
            env[var["name"]] = str(var["value"])
        else:
            path = var["valueFrom"]["fieldRef"]["fieldPath"]
            assert path in fields, f"the chart uses downward-API field {path} that these tests do not provide"
            env[var["name"]] = fields[path]
    return env


def container_process(
    name: str, pod: Mapping[str, Any], overrides: Mapping[str, str], log_path: Path
) -> processes.ManagedProcess:
    """The pod's first container as a local process: the chart's command, args and environment.

    `overrides` replace the value of `--flag=value` arguments (or are appended):
    ports, because many "pods" share this host; files, because the chart's
    mounts are not here; and `--kubeconfig`, which stands in for the in-cluster
    credentials of the same service account.
    """
    container = pod["spec"]["containers"][0]
    env = container_env(pod)
    words = [
        re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), str(word))
        for word in [*container.get("command", []), *container.get("args", [])]
    ]
    program, args = BIN / words[0], words[1:]
    assert program.is_file(), f"the chart runs {words[0]}, which is not installed in {BIN}"
    pending = dict(overrides)
    argv = [str(program)]
    for arg in args:
        flag, equals, _ = arg.partition("=")
        argv.append(f"{flag}={pending.pop(flag)}" if equals and flag in pending else arg)
    argv.extend(f"{flag}={value}" for flag, value in pending.items())
    # No KUBECONFIG from the test run: only the process's own --kubeconfig counts.
    process_env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    process_env.update(env)
    process_env["PYTHONUNBUFFERED"] = "1"
    return processes.ManagedProcess(name, argv, log_path, env=process_env)


def log_tail(process: processes.ManagedProcess, lines: int = LOG_TAIL_LINES) -> str:
    return f"----- {process.name} ({process.log_path}) -----\n{process.log_tail(lines)}"


@dataclasses.dataclass
class Operator:
    process: processes.ManagedProcess
    health_port: int
    metrics_port: int

    def leading(self) -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as response:
            return bool(json.loads(response.read()).get("leader"))

    def require_alive(self) -> None:
        if not self.process.running():
            raise self.process.failure("stopped during the test")


@pytest.fixture(scope="module")
def mission_operator(
    mission_release: Release, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    """`gpu-health-operator` as a process, authenticated as the chart's operator service account."""
    release = mission_release
    workdir = tmp_path_factory.mktemp("mission-operator")
    pod = waiting.wait_until(
        lambda: release.pod_on("operator", release.system_node),
        timeout_seconds=SETUP_TIMEOUT_SECONDS,
        message="the chart's operator pod running on the system node",
    )
    kubeconfig = release.kubeconfig(
        release.operator_sa, pod["metadata"]["name"], release.system_node, workdir / "operator.kubeconfig"
    )
    metrics_port, health_port = ports.free_ports(2)
    overrides = {
        "--metrics-port": str(metrics_port),
        "--health-port": str(health_port),
        "--kubeconfig": str(kubeconfig),
    }
    process = container_process("gpu-health-operator", pod, overrides, workdir / "operator.log")
    process.start()
    operator = Operator(process, health_port, metrics_port)
    try:

        def leading() -> bool:
            operator.require_alive()
            return operator.leading()

        waiting.wait_until(leading, timeout_seconds=SETUP_TIMEOUT_SECONDS, message="the operator leads")
        yield operator
    finally:
        process.stop(grace_seconds=15)


# -- one test's fleet ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Mission:
    """One test's nodes, agents, policy and workload, all removed afterwards."""

    release: Release
    operator: Operator
    api: client.ApiClient
    label: str
    workdir: Path
    nodes: list[str] = dataclasses.field(default_factory=list)
    agents: dict[str, processes.ManagedProcess] = dataclasses.field(default_factory=dict)
    policies: list[str] = dataclasses.field(default_factory=list)
    workloads: list[str] = dataclasses.field(default_factory=list)
    bare_pods: list[str] = dataclasses.field(default_factory=list)

    @property
    def cp(self) -> local.ControlPlane:
        return self.release.cp

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    # -- making things --

    def add_nodes(self, *suffixes: str, gpus: int = 8) -> list[str]:
        """kwok GPU nodes as GPU feature discovery labels them, with this test's label."""
        names = [f"{self.label}-{suffix}"[:63] for suffix in suffixes]
        labels = {MISSION_LABEL: self.release.suffix, TEST_LABEL: self.label}
        create_nodes(self.cp, [node_manifest(name, labels, gpus=gpus) for name in names])
        self.nodes.extend(names)
        return names

    def start_agent(self, node: str, scenario: str, *, metrics_port: int = 0) -> None:
        """`gpu-health-agent` for `node` with `scenario` (YAML text), as the chart's agent pod on it.

        `metrics_port` 0 serves no /metrics (many agents share this host).
        """
        pod = waiting.wait_until(
            lambda: self.release.pod_on("agent", node),
            timeout_seconds=SETUP_TIMEOUT_SECONDS,
            message=f"the chart's agent pod running on {node}",
        )
        kubeconfig = self.release.kubeconfig(
            self.release.agent_sa, pod["metadata"]["name"], node, self.workdir / f"{node}.kubeconfig"
        )
        # This node's scenario stands in for the chart's (fleet-wide) scenario ConfigMap.
        scenario_file = self.workdir / f"{node}.scenario.yaml"
        scenario_file.write_text(scenario)
        overrides = {
            "--sim-scenario": str(scenario_file),
            "--metrics-port": str(metrics_port),
            "--kubeconfig": str(kubeconfig),
        }
        agent = container_process(f"agent {node}", pod, overrides, self.workdir / f"{node}.agent.log")
        self.agents[node] = agent
        agent.start()

    def start_agents(self, scenarios: Mapping[str, str]) -> None:
        for node, scenario in scenarios.items():
            self.start_agent(node, scenario)

    def wait_reported(self, *nodes: str) -> None:
        """Until every node's GPUNode carries its agent's report and the operator's verdict."""
        for node in nodes or tuple(self.nodes):
            self.wait(
                lambda node=node: (
                    (self.gpunode_status(node).get("summary") or {}).get("gpuCount")
                    and self.gpunode_status(node).get("health")
                ),
                f"GPUNode {node} reported by its agent and judged by the operator",
            )

    def policy(self, **spec: Any) -> str:
        """A GPUHealthPolicy named after the test, selecting only its nodes."""
        name = self.label
        body = {
            "apiVersion": resources.API_VERSION,
            "kind": resources.POLICY_KIND,
            "metadata": {"name": name},
            "spec": {"nodeSelector": {"matchLabels": {TEST_LABEL: self.label}}, **spec},
        }
        self.cp.kubectl("apply", "-f", "-", input=json.dumps(body))
        self.policies.append(name)
        return name

    def place_workload(self, node: str, spares: Sequence[str], *, replicas: int = 1) -> str:
        """A Deployment (whole-node GPU pods) + PDB whose pods start on `node`; `spares` can take them later.

        The spares are cordoned while the pods are placed, then uncordoned, so
        the placement is certain without pinning the pods (which would leave
        nowhere for replacements to go).
        """
        name = self.label[:50]
        for spare in spares:
            self.cp.kubectl("cordon", spare)
        labels = {"app": name}
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": WORKLOAD_NAMESPACE},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeSelector": {TEST_LABEL: self.label},
                        "terminationGracePeriodSeconds": 0,
                        "containers": [
                            {
                                "name": "trainer",
                                "image": "registry.example.com/ml/trainer:1",
                                "resources": {
                                    "requests": {keys.GPU_RESOURCE: "8"},
                                    "limits": {keys.GPU_RESOURCE: "8"},
                                },
                            }
                        ],
                    },
                },
            },
        }
        budget = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": WORKLOAD_NAMESPACE},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}},
        }
        self.cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([deployment, budget]))
        self.workloads.append(name)
        self.wait(
            lambda: len([p for p in self.workload_pods(name) if p["phase"] == "Running"]) == replicas,
            f"{replicas} workload pod(s) running on {node}",
        )
        for spare in spares:
            self.cp.kubectl("uncordon", spare)
        return name

    def bare_pod(self, node: str) -> str:
        """A pod no controller owns, running on `node` (nothing replaces it once evicted)."""
        name = f"{node}-job"[:63]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": WORKLOAD_NAMESPACE},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "job", "image": "registry.example.com/ml/eval:1"}],
            },
        }
        self.cp.kubectl("apply", "-f", "-", input=json.dumps(pod))
        self.bare_pods.append(name)
        self.wait(
            lambda: (
                _json(self.core.read_namespaced_pod(name, WORKLOAD_NAMESPACE, _preload_content=False))[
                    "status"
                ].get("phase")
                == "Running"
            ),
            f"pod {name} running on {node}",
        )
        return name

    def pod_exists(self, name: str) -> bool:
        result = self.cp.kubectl(
            "get", "pod", name, "-n", WORKLOAD_NAMESPACE, "--ignore-not-found", "-o", "name"
        )
        return bool(result.stdout.strip())

    # -- reading what a user sees --

    def node(self, name: str) -> dict[str, Any]:
        return _json(self.core.read_node(name, _preload_content=False))

    def labels(self, name: str) -> dict[str, str]:
        labels: dict[str, str] = self.node(name)["metadata"].get("labels") or {}
        return labels

    def cordoned(self, name: str) -> bool:
        return bool(self.node(name)["spec"].get("unschedulable"))

    def gpunode_status(self, name: str) -> dict[str, Any]:
        try:
            body = _json(
                self.custom.get_cluster_custom_object(
                    resources.GROUP, resources.VERSION, resources.GPUNODE_PLURAL, name, _preload_content=False
                )
            )
        except client.ApiException as error:
            if error.status == 404:
                return {}
            raise
        status: dict[str, Any] = body.get("status") or {}
        return status

    def policy_status(self, name: str) -> dict[str, Any]:
        body = _json(
            self.custom.get_cluster_custom_object(
                resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, name, _preload_content=False
            )
        )
        status: dict[str, Any] = body.get("status") or {}
        return status

    def events(self, node: str) -> list[dict[str, Any]]:
        selector = f"involvedObject.kind=Node,involvedObject.name={node}"
        response = self.core.list_event_for_all_namespaces(field_selector=selector, _preload_content=False)
        items: list[dict[str, Any]] = _json(response)["items"]
        return items

    def reasons(self, node: str) -> set[str]:
        return {e["reason"] for e in self.events(node)}

    def pods_on(self, node: str) -> list[dict[str, Any]]:
        response = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _preload_content=False
        )
        items: list[dict[str, Any]] = _json(response)["items"]
        return items

    def workload_pods(self, name: str) -> list[dict[str, str]]:
        """The workload's pods: name, node, phase (Terminating while being deleted)."""
        response = self.core.list_namespaced_pod(
            WORKLOAD_NAMESPACE, label_selector=f"app={name}", _preload_content=False
        )
        return [
            {
                "name": p["metadata"]["name"],
                "node": p["spec"].get("nodeName") or "",
                "phase": "Terminating"
                if p["metadata"].get("deletionTimestamp")
                else p["status"].get("phase", ""),
            }
            for p in _json(response)["items"]
        ]

    def wait(self, predicate: Any, message: str, timeout_seconds: float = SETUP_TIMEOUT_SECONDS) -> Any:
        """wait_until, failing at once (with its log) if the operator or an agent died meanwhile."""

        def check() -> Any:
            self.operator.require_alive()
            for agent in self.agents.values():
                if agent.returncode() is not None:
                    raise agent.failure("exited during the test")
            return predicate()

        return waiting.wait_until(check, timeout_seconds=timeout_seconds, message=message)

    # -- teardown --

    def describe(self, node: str) -> str:
        """One node as a user would inspect it: cordon, our keys, GPUNode verdict, Events."""
        try:
            body = self.node(node)
            ours = {
                k: v
                for k, v in {
                    **body["metadata"].get("labels", {}),
                    **body["metadata"].get("annotations", {}),
                }.items()
                if k.startswith(keys.PREFIX)
            }
            status = self.gpunode_status(node)
            verdict = {k: status.get(k) for k in ("health", "issues", "action", "straggler")}
            events = [
                f"{e['reason']} x{e.get('count', 1)}: {e.get('message', '')}" for e in self.events(node)
            ]
        except client.ApiException as error:
            return f"{node}: cannot read ({error.status} {error.reason})"
        lines = [
            f"{node}: unschedulable={bool(body['spec'].get('unschedulable'))} {ours}",
            f"  GPUNode {verdict}",
            *(f"  Event {line}" for line in events),
        ]
        return "\n".join(lines)

    def agent_pods(self) -> dict[str, list[dict[str, Any]]]:
        """This test's nodes -> the chart's agent pods bound or pinned to them."""
        pods = self.release.pods("agent")
        return {
            node: [p for p in pods if p["spec"].get("nodeName") == node or _pinned_to(p) == node]
            for node in self.nodes
        }

    def describe_agent_pods(self, placed: Mapping[str, list[dict[str, Any]]]) -> list[str]:
        """Each agent pod's phase and unmet conditions (why a pod never ran)."""
        lines = []
        for node, pods in placed.items():
            if not pods:
                lines.append(f"{node}: no agent pod")
            for pod in pods:
                unmet = [
                    f"{c['type']}={c['status']} {c.get('reason', '')} {c.get('message', '')}".rstrip()
                    for c in pod["status"].get("conditions", [])
                    if c.get("status") != "True"
                ]
                lines.append(
                    f"{node}: {pod['metadata']['name']} phase={pod['status'].get('phase')}"
                    f" bound={bool(pod['spec'].get('nodeName'))}"
                    f" deleting={bool(pod['metadata'].get('deletionTimestamp'))} {unmet}"
                )
        return lines

    def control_plane_lines(self, names: Sequence[str]) -> list[str]:
        """Lines of the scheduler, the controller manager and kwok naming any of `names`."""
        parts = []
        for component in (local.SCHEDULER, local.CONTROLLER_MANAGER, local.KWOK):
            try:
                text = self.cp.log_path(component).read_text(errors="replace")
            except (OSError, local.ControlPlaneError):
                continue
            lines = [line for line in text.splitlines() if any(name in line for name in names)]
            parts += [f"----- {component} lines naming this test's nodes or agent pods -----"]
            parts += lines[-LOG_TAIL_LINES:]
        return parts

    def report(self) -> str:
        """Log tails of the operator (its lines about this test, then its last lines) and the agents."""
        operator = self.operator.process
        try:
            text = operator.log_path.read_text(errors="replace")
        except OSError:
            text = ""
        ours = [line for line in text.splitlines() if self.label in line][-LOG_TAIL_LINES:]
        try:
            placed = self.agent_pods()
        except (local.CommandError, subprocess.TimeoutExpired) as error:
            placed, pods = {}, [f"cannot list agent pods: {error}"]
        else:
            pods = self.describe_agent_pods(placed)
        pod_names = [p["metadata"]["name"] for found in placed.values() for p in found]
        parts = [
            f"----- what the cluster shows for {self.label} -----",
            *(self.describe(node) for node in self.nodes),
            f"----- the chart's agent pods on {self.label}'s nodes -----",
            *pods,
            f"----- operator lines mentioning {self.label} -----",
            *ours,
            *self.control_plane_lines([self.label, *pod_names]),
            log_tail(operator),
            *(log_tail(agent, 25) for agent in self.agents.values()),
        ]
        return "\n".join(parts)

    def cleanup(self) -> None:
        for agent in self.agents.values():
            agent.signal(15)
        for agent in self.agents.values():
            agent.wait_stopped(grace_seconds=10)
        for name in self.policies:
            with contextlib.suppress(client.ApiException):
                self.custom.delete_cluster_custom_object(
                    resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, name
                )
        for name in self.workloads:
            self.cp.kubectl(
                "delete", "deployment,poddisruptionbudget", name, "-n", WORKLOAD_NAMESPACE,
                "--ignore-not-found", "--wait=false", check=False,
            )  # fmt: skip
        if self.bare_pods:
            self.cp.kubectl(
                "delete", "pod", *self.bare_pods, "-n", WORKLOAD_NAMESPACE,
                "--ignore-not-found", "--wait=false", check=False,
            )  # fmt: skip
        if self.nodes:
            self.cp.kubectl("delete", "node", *self.nodes, "--ignore-not-found", "--wait=false", check=False)
            self.cp.kubectl(
                "delete",
                resources.GPUNODE_PLURAL,
                *self.nodes,
                "--ignore-not-found",
                "--wait=false",
                check=False,
            )


@pytest.fixture
def mission(
    request: pytest.FixtureRequest,
    mission_release: Release,
    mission_operator: Operator,
    k8s: client.ApiClient,
    tmp_path: Path,
) -> Iterator[Mission]:
    short = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower().removeprefix("test_"))[:24].strip("-")
    label = f"m-{short}-{secrets.token_hex(2)}"
    test = Mission(mission_release, mission_operator, k8s, label, tmp_path)
    try:
        yield test
    finally:
        test.cleanup()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """On a failed mission test, add the operator's and agents' log tails to the report."""
    report: pytest.TestReport = yield
    funcargs = getattr(item, "funcargs", {})
    test = funcargs.get("mission")
    if report.when == "call" and report.failed and isinstance(test, Mission):
        report.sections.append(("gpu-health logs", test.report()))
    return report


def _pinned_to(pod: Mapping[str, Any]) -> str | None:
    """The node a DaemonSet pod is pinned to by its node affinity, before it is bound."""
    affinity = pod["spec"].get("affinity", {}).get("nodeAffinity", {})
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution", {})
    for term in required.get("nodeSelectorTerms", []):
        for field in term.get("matchFields", []):
            if field.get("key") == "metadata.name" and field.get("values"):
                return str(field["values"][0])
    return None


def _json(response: object) -> dict[str, Any]:
    """The body of a response read with `_preload_content=False`."""
    try:
        body: dict[str, Any] = json.loads(response.data)  # type: ignore[attr-defined]
    finally:
        # Back to the pool: a connection left to the garbage collector is a ResourceWarning.
        response.release_conn()  # type: ignore[attr-defined]
    return body
