"""The chart on the platforms our users run (issue 49): selection, presets, RuntimeClass, Pod Security.

Each preset in charts/gpu-health/platforms/ is installed with the real `helm` into the local control
plane, in a namespace at the Pod Security level the preset names, beside two kwok GPU Nodes labelled
(and tainted) as that platform labels its GPU nodes, from the platform's public docs named below, and one
CPU Node of the same pool. The DaemonSet controller and the scheduler then place the agent: its pods
must land on both GPU Nodes and not on the CPU Node. Every Node of a test also carries a label unique
to it, which the install ANDs in (`agent.nodeSelector`), so other modules' Nodes never count.

`lookup` (the `nvidia` RuntimeClass, the namespaces' Pod Security labels) answers only against a
cluster: those checks run `helm install --dry-run=server` or a real install, never `helm template`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
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
PRESETS: Final = CHART / "platforms"
KUBE_VERSION: Final = "1.36.0"
UNIQUE_LABEL: Final = "e2e.gpuhealth.io/platform"
TIMEOUT_SECONDS: Final = 120.0
CAPACITY: Final = {"cpu": "64", "memory": "512Gi", "pods": "110"}


@dataclasses.dataclass(frozen=True)
class Platform:
    preset: str
    gpu_labels: dict[str, str]
    """What the platform puts on a GPU node (source: `source`)."""
    pod_security: str
    """The namespace level the preset's header names."""
    source: str
    taints: tuple[dict[str, str], ...] = ()


PLATFORMS: Final = [
    Platform(
        "eks-al2023",
        # Karpenter's well-known labels (karpenter.sh docs "Scheduling", AWS-specific labels; and
        # docs.aws.amazon.com/eks/latest/userguide/ml-workload-placement.html).
        {
            "karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia",
            "karpenter.k8s.aws/instance-gpu-name": "h100",
        },
        "restricted",
        "https://docs.aws.amazon.com/eks/latest/userguide/ml-workload-placement.html",
        ({"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"},),
    ),
    Platform(
        "eks-bottlerocket",
        # EKS Auto Mode runs Bottlerocket; its GPU label has the eks.amazonaws.com/ prefix (same page).
        {"eks.amazonaws.com/instance-gpu-manufacturer": "nvidia"},
        "privileged",
        "https://docs.aws.amazon.com/eks/latest/userguide/ml-workload-placement.html",
        ({"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"},),
    ),
    Platform(
        "gke-cos",
        # GKE labels GPU nodes with the accelerator type and taints them nvidia.com/gpu=present:NoSchedule.
        {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
        "privileged",
        "https://cloud.google.com/kubernetes-engine/docs/how-to/gpus",
        ({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},),
    ),
    Platform(
        "aks",
        # AKS GPU node pools: kubernetes.azure.com/accelerator=nvidia; the docs taint them sku=gpu:NoSchedule.
        {"kubernetes.azure.com/accelerator": "nvidia"},
        "restricted",
        "https://learn.microsoft.com/azure/aks/use-nvidia-gpu",
        ({"key": "sku", "value": "gpu", "effect": "NoSchedule"},),
    ),
    Platform(
        "openshift",
        # OpenShift's NFD Operator: the PCI vendor label that NVIDIA's own GFD DaemonSet selects on.
        {"feature.node.kubernetes.io/pci-10de.present": "true"},
        "restricted",
        "https://docs.nvidia.com/datacenter/cloud-native/openshift/latest/install-nfd.html",
    ),
    Platform(
        "gpu-operator",
        # GPU Feature Discovery (deployed by the GPU Operator) labels nvidia.com/gpu.present=true.
        {"nvidia.com/gpu.present": "true", "feature.node.kubernetes.io/pci-10de.present": "true"},
        "restricted",
        "https://github.com/NVIDIA/k8s-device-plugin/blob/main/docs/gpu-feature-discovery/README.md",
    ),
]


def node_manifest(name: str, labels: dict[str, str], taints: tuple[dict[str, str], ...]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "spec": {"taints": list(taints)},
    }


@dataclasses.dataclass(frozen=True)
class Pool:
    suffix: str
    namespace: str
    gpu_nodes: tuple[str, str]
    cpu_node: str


@contextlib.contextmanager
def pool(cp: local.ControlPlane, platform: Platform, level: str) -> Iterator[Pool]:
    """A namespace at Pod Security `level`, two GPU Nodes labelled as `platform` does, one CPU Node."""
    suffix = "p" + secrets.token_hex(3)
    namespace = f"platform-{platform.preset}-{suffix}"
    gpu_nodes = (f"plat-{suffix}-gpu-0", f"plat-{suffix}-gpu-1")
    cpu_node = f"plat-{suffix}-cpu-0"
    cp.kubectl("create", "namespace", namespace)
    try:
        cp.kubectl(
            "label",
            "namespace",
            namespace,
            f"pod-security.kubernetes.io/enforce={level}",
            "pod-security.kubernetes.io/enforce-version=latest",
        )
        unique = {UNIQUE_LABEL: suffix}
        manifests = [node_manifest(n, {**platform.gpu_labels, **unique}, platform.taints) for n in gpu_nodes]
        manifests.append(node_manifest(cpu_node, unique, ()))
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(manifests))
        for name in (*gpu_nodes, cpu_node):
            status = {"status": {"capacity": CAPACITY, "allocatable": CAPACITY}}
            cp.kubectl(
                "patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(status)
            )
        yield Pool(suffix, namespace, gpu_nodes, cpu_node)
    finally:
        cp.kubectl("delete", "node", *gpu_nodes, cpu_node, "--ignore-not-found", "--wait=false")
        cp.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=false")


def pinned(suffix: str) -> list[str]:
    """Values that keep this test's pods on its own Nodes (ANDed with the chart's GPU terms)."""
    return [
        "--set-string",
        f"agent.nodeSelector.e2e\\.gpuhealth\\.io/platform={suffix}",
        "--set-string",
        f"operator.nodeSelector.e2e\\.gpuhealth\\.io/platform={suffix}",
    ]


def render(cp: local.ControlPlane, *args: str) -> list[dict[str, Any]]:
    out = cp.helm("template", "plat", str(CHART), "--kube-version", KUBE_VERSION, *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def server_render(cp: local.ControlPlane, namespace: str, *args: str) -> list[dict[str, Any]]:
    """What `helm install` would create, rendered against the cluster (so `lookup` answers)."""
    out = cp.helm(
        "install", "plat", str(CHART), "-n", namespace, "--dry-run=server", "-o", "json", *args
    ).stdout
    manifest = json.loads(out)["manifest"]
    return [doc for doc in yaml.safe_load_all(manifest) if doc]


def daemonset_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    return daemonset


def agent_nodes(cp: local.ControlPlane, namespace: str) -> set[str]:
    out = cp.kubectl(
        "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=agent", "-o", "json"
    ).stdout
    return {
        p["spec"]["nodeName"]
        for p in json.loads(out)["items"]
        if p["status"].get("phase") == "Running" and p["spec"].get("nodeName")
    }


@contextlib.contextmanager
def runtime_class(cp: local.ControlPlane, name: str = "nvidia") -> Iterator[None]:
    """The RuntimeClass the GPU Operator creates (handler nvidia)."""
    manifest = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": name},
        "handler": name,
    }
    cp.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    try:
        yield
    finally:
        cp.kubectl("delete", "runtimeclass", name, "--ignore-not-found")


# -- default selection ---------------------------------------------------------------------------------


def test_default_values_select_every_platform_gpu_label_and_no_cpu_node(
    control_plane: local.ControlPlane,
) -> None:
    """Each platform's GPU label alone makes a Node eligible; a Node with none of them is not."""
    daemonset = daemonset_of(render(control_plane))
    spec = daemonset["spec"]["template"]["spec"]
    assert "nodeSelector" not in spec  # a nodeSelector could only AND the platforms' labels
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    keys = {e["key"] for term in terms for e in term["matchExpressions"]}
    for platform in PLATFORMS:
        assert keys & set(platform.gpu_labels), platform.preset


def test_the_default_policy_selects_the_nodes_with_an_agent_whatever_their_labels(
    control_plane: local.ControlPlane,
) -> None:
    """An absent policy nodeSelector means every Node with a GPUNode (docs/policy.md), so it may act."""
    objects = render(
        control_plane, "--set", "defaultPolicy.enabled=true", "--set", "defaultPolicy.dryRun=false"
    )
    (policy,) = [o for o in objects if o["kind"] == "GPUHealthPolicy"]
    assert "nodeSelector" not in policy["spec"]
    for example in ("default-policy.yaml", "dry-run-policy.yaml"):
        (doc,) = [d for d in yaml.safe_load_all((ROOT / "examples" / example).read_text()) if d]
        assert "nodeSelector" not in doc["spec"], example


@pytest.mark.parametrize("platform", PLATFORMS, ids=lambda p: p.preset)
def test_each_preset_installs_and_the_agent_lands_on_its_gpu_nodes_only(
    control_plane: local.ControlPlane, platform: Platform
) -> None:
    with contextlib.ExitStack() as stack:
        if platform.preset == "gpu-operator":
            stack.enter_context(runtime_class(control_plane))  # the GPU Operator's own
        where = stack.enter_context(pool(control_plane, platform, platform.pod_security))
        preset = str(PRESETS / f"{platform.preset}.yaml")
        release = f"plat-{where.suffix}"
        control_plane.helm(
            "install",
            release,
            str(CHART),
            "-n",
            where.namespace,
            "-f",
            preset,
            *pinned(where.suffix),
            timeout=180,
        )
        try:
            placed = waiting.wait_until(
                lambda: (
                    (nodes := agent_nodes(control_plane, where.namespace)) >= set(where.gpu_nodes) and nodes
                ),
                timeout_seconds=TIMEOUT_SECONDS,
                message=f"{platform.preset}: an agent pod running on each GPU node ({platform.source})",
            )
            assert placed == set(where.gpu_nodes)
            daemonset = json.loads(
                control_plane.kubectl(
                    "get", "daemonset", f"{release}-gpu-health-agent", "-n", where.namespace, "-o", "json"
                ).stdout
            )
            assert daemonset["status"]["desiredNumberScheduled"] == 2  # the CPU Node is not even a candidate
            if platform.preset == "gpu-operator":
                assert daemonset["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
        finally:
            control_plane.helm("uninstall", release, "-n", where.namespace, check=False, timeout=180)


# -- RuntimeClass ----------------------------------------------------------------------------------------


def test_auto_runtime_class_uses_nvidia_where_the_cluster_has_it_for_the_agent_and_the_repair_jobs(
    control_plane: local.ControlPlane,
) -> None:
    platform = PLATFORMS[-1]
    with pool(control_plane, platform, "privileged") as where:
        without = server_render(control_plane, where.namespace, "--set", "repair.enabled=true")
        assert "runtimeClassName" not in daemonset_of(without)["spec"]["template"]["spec"]
        with runtime_class(control_plane):
            objects = server_render(control_plane, where.namespace, "--set", "repair.enabled=true")
        spec = daemonset_of(objects)["spec"]["template"]["spec"]
        assert spec["runtimeClassName"] == "nvidia"
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        assert env["GPUHEALTH_RUNTIME_CLASS"] == "nvidia"  # so the agent's NoGPUsVisible hint knows
        (templates,) = [o for o in objects if o["kind"] == "ConfigMap" and "ResetGPU" in o.get("data", {})]
        for step, text in templates["data"].items():
            assert yaml.safe_load(text)["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia", step
    # Offline there is no cluster to ask: auto renders none, and the value forces one.
    assert "runtimeClassName" not in daemonset_of(render(control_plane))["spec"]["template"]["spec"]
    forced = daemonset_of(render(control_plane, "--set", "agent.runtimeClassName=nvidia"))
    assert forced["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"


# -- Pod Security: fail early ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [["--set", "repair.enabled=true"], ["-f", str(PRESETS / "gke-cos.yaml")]],
    ids=["repair", "gke-cos-host-driver"],
)
def test_a_namespace_whose_pod_security_refuses_the_pods_fails_the_install_naming_the_label(
    control_plane: local.ControlPlane, values: list[str]
) -> None:
    with pool(control_plane, PLATFORMS[-1], "restricted") as where:
        failed = control_plane.helm(
            "install", "plat", str(CHART), "-n", where.namespace, "--dry-run=server", *values, check=False
        )
        assert failed.returncode != 0
        assert f"kubectl label namespace {where.namespace} pod-security.kubernetes.io/enforce=privileged" in (
            failed.stderr
        )
        # At the level it needs, the same values install.
        control_plane.kubectl(
            "label",
            "namespace",
            where.namespace,
            "pod-security.kubernetes.io/enforce=privileged",
            "--overwrite",
        )
        server_render(control_plane, where.namespace, *values)


# -- OpenShift -----------------------------------------------------------------------------------------------


def scc_bindings(objects: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """RoleBinding subject (namespace/name) -> (namespace of the binding, SCC)."""
    found = {}
    prefix = "system:openshift:scc:"
    for o in objects:
        if o["kind"] == "RoleBinding" and o["roleRef"]["name"].startswith(prefix):
            (subject,) = o["subjects"]
            scc = o["roleRef"]["name"].removeprefix(prefix)
            found[f"{subject['namespace']}/{subject['name']}"] = (o["metadata"]["namespace"], scc)
    return found


def test_openshift_preset_binds_nonroot_v2_and_leaves_the_uid_to_the_scc(
    control_plane: local.ControlPlane,
) -> None:
    objects = render(control_plane, "-n", "gh", "-f", str(PRESETS / "openshift.yaml"))
    assert scc_bindings(objects) == {
        "gh/plat-gpu-health-agent": ("gh", "nonroot-v2"),
        "gh/plat-gpu-health-operator": ("gh", "nonroot-v2"),
    }
    for o in objects:
        if o["kind"] in ("DaemonSet", "Deployment"):
            context = o["spec"]["template"]["spec"]["securityContext"]
            assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(context), o["metadata"]["name"]
    with_repair = render(
        control_plane,
        "-n",
        "gh",
        "-f",
        str(PRESETS / "openshift.yaml"),
        "--set",
        "repair.enabled=true",
        "--set",
        "repair.namespace=gh-repair",
    )
    # The privileged SCC goes to the step Jobs' ServiceAccount only, and only with repair on.
    assert scc_bindings(with_repair)["gh-repair/default"] == ("gh-repair", "privileged")
    assert scc_bindings(with_repair)["gh/plat-gpu-health-agent"] == ("gh", "nonroot-v2")
