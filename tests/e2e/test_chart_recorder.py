"""The chart's in-cluster recorder (`recorder.enabled`): `gpu-health-sim record` onto a volume.

Off by default. On, it renders one recorder pod (Recreate: its volume is
ReadWriteOnce) whose arguments `gpu-health-sim` accepts, recording the agent
DaemonSet's own pods, on a PersistentVolumeClaim of the configured size and
class that outlives an uninstall, with RBAC that only reads; every object
passes a server-side dry run in a namespace enforcing Pod Security
"restricted".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from gpuhealth_sim import cli as sim_cli
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.e2e

ROOT: Final = Path(__file__).resolve().parents[2]
CHART: Final = ROOT / "charts" / "gpu-health"
RELEASE: Final = "rec"
KUBE_VERSION: Final = "1.36.0"
ON: Final = [
    "--set", "recorder.enabled=true",
    "--set", "recorder.persistence.size=20Gi",
    "--set", "recorder.persistence.storageClass=fast-ssd",
    "--set", "recorder.rotateSeconds=3600",
]  # fmt: skip
READ_ONLY: Final = {"get", "list", "watch"}


def render(cp: local.ControlPlane, *args: str, namespace: str = "gpu-health") -> list[dict[str, Any]]:
    out = cp.helm(
        "template", RELEASE, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION, *args
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def recorder_objects(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["metadata"]["labels"].get("app.kubernetes.io/component") == "recorder"]


def test_the_recorder_is_off_by_default(control_plane: local.ControlPlane) -> None:
    assert recorder_objects(render(control_plane)) == []


def test_the_recorder_records_this_release_onto_its_claim_and_only_reads(
    control_plane: local.ControlPlane,
) -> None:
    objects = render(control_plane, *ON)
    mine = {o["kind"]: o for o in recorder_objects(objects)}
    assert set(mine) == {
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "PersistentVolumeClaim", "Deployment",
    }  # fmt: skip
    deployment = mine["Deployment"]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["gpu-health-sim"]
    args = sim_cli.parser().parse_args(container["args"])
    assert args.command == "record"
    assert args.max_seconds == 3600
    assert str(args.out).startswith("/traces/") and "{start}" in str(args.out)
    assert container["volumeMounts"] == [{"name": "traces", "mountPath": "/traces"}]
    # The agents it records are this release's DaemonSet's pods.
    (agent,) = [o for o in objects if o["kind"] == "DaemonSet"]
    selector = dict(pair.split("=") for pair in args.agent_pod_selector.split(","))
    assert selector == agent["spec"]["selector"]["matchLabels"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["serviceAccountName"] == mine["ServiceAccount"]["metadata"]["name"]

    claim = mine["PersistentVolumeClaim"]
    assert pod["volumes"] == [
        {"name": "traces", "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]}}
    ]
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"

    rules = mine["ClusterRole"]["rules"]
    assert all(set(rule["verbs"]) <= READ_ONLY for rule in rules), rules
    readable = {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}
    assert {
        ("", "nodes"),
        ("", "pods"),
        ("gpuhealth.io", "gpunodes"),
        ("gpuhealth.io", "gpuhealthpolicies"),
    } <= readable
    assert {("resource.k8s.io", "resourceslices"), ("resource.k8s.io", "devicetaintrules")} <= readable
    assert ("batch", "jobs") in readable  # repair Jobs' ends, so a replay's Jobs end alike
    binding = mine["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == mine["ClusterRole"]["metadata"]["name"]
    assert binding["subjects"][0]["name"] == mine["ServiceAccount"]["metadata"]["name"]


def test_an_existing_claim_is_used_instead_of_a_new_one(control_plane: local.ControlPlane) -> None:
    objects = recorder_objects(
        render(control_plane, *ON, "--set", "recorder.persistence.existingClaim=traces")
    )
    assert "PersistentVolumeClaim" not in {o["kind"] for o in objects}
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (volume,) = deployment["spec"]["template"]["spec"]["volumes"]
    assert volume["persistentVolumeClaim"] == {"claimName": "traces"}


def test_a_bad_size_is_refused_by_the_schema(control_plane: local.ControlPlane) -> None:
    result = control_plane.helm(
        "lint", "--strict", str(CHART), "--set", "recorder.persistence.size=lots", check=False
    )
    assert "/recorder/persistence/size" in result.stdout + result.stderr


def test_the_recorder_passes_a_server_side_dry_run_under_restricted_pod_security(
    crds: local.ControlPlane, namespace: str
) -> None:
    crds.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted", "--overwrite"
    )
    objects = recorder_objects(render(crds, *ON, namespace=namespace))
    result = crds.kubectl(
        "apply", "--dry-run=server", "--server-side", "--field-manager=chart-test", "-f", "-",
        input=yaml.safe_dump_all(objects),
    )  # fmt: skip
    applied = [line for line in result.stdout.splitlines() if "serverside-applied" in line]
    assert len(applied) == len(objects), result.stdout
    assert "would violate PodSecurity" not in result.stderr, result.stderr
