"""The chart's part of active checks (policy spec.activeChecks): the PriorityClass and the check templates.

What an operator of the chart relies on: a check runs in PriorityClass `gpu-health-check`, below every
workload and never preempting one, so the scheduler gives the GPUs to real work at once; the templates
`DcgmDiagQuick` (`dcgmi diag -r 1`) and `DcgmDiag` (`-r 2`) ship in the repair templates' ConfigMap,
equal to the operator's packaged copy; each check pod requests the node's GPUs through the scheduler and
reports through its termination message. Rendering runs the real helm; acceptance is asked of the real
API server (server-side dry run).
"""

import json
import secrets
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth_operator.runtime import cli as operator_cli
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpu-health"
PACKAGED = ROOT / "operator" / "gpuhealth_operator" / "repair-templates.yaml"
RELEASE = "render"
KUBE_VERSION = "1.36.0"
CHECK_TEMPLATES = {"DcgmDiagQuick": "dcgmi diag -r 1", "DcgmDiag": "dcgmi diag -r 2"}
PRIORITY_CLASS = "gpu-health-check"
GPU_RESOURCE = "nvidia.com/gpu"


def render(cp: local.ControlPlane, *args: str) -> list[dict[str, Any]]:
    out = cp.helm(
        "template", RELEASE, str(CHART), "--namespace", "gpu-health", "--kube-version", KUBE_VERSION,
        "--set", "repair.enabled=true", *args,
    ).stdout  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out) if doc]


def config_map_templates(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (config_map,) = [
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-repair-templates")
    ]
    return {key: yaml.safe_load(text) for key, text in config_map["data"].items()}


def priority_classes(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == "PriorityClass"]


def test_the_priority_class_is_below_every_workload_and_preempts_nothing(
    control_plane: local.ControlPlane,
) -> None:
    (priority,) = priority_classes(render(control_plane))
    assert priority["apiVersion"] == "scheduling.k8s.io/v1"
    assert priority["metadata"]["name"] == PRIORITY_CLASS
    assert priority["value"] < 0  # a pod without a PriorityClass has priority 0: every workload is above
    assert priority["preemptionPolicy"] == "Never"
    assert priority["globalDefault"] is False


def test_the_priority_class_ships_with_the_templates_only(control_plane: local.ControlPlane) -> None:
    assert priority_classes(render(control_plane, "--set", "repair.enabled=false")) == []
    assert priority_classes(render(control_plane, "--set", "checks.priorityClass.create=false")) == []


def test_the_check_templates_ship_beside_the_repair_templates(control_plane: local.ControlPlane) -> None:
    templates = config_map_templates(render(control_plane))
    packaged = yaml.safe_load(PACKAGED.read_text())
    for key, command in CHECK_TEMPLATES.items():
        assert templates[key] == packaged[key], key
        job = templates[key]
        assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job"), key
        pod = job["spec"]["template"]["spec"]
        assert pod["priorityClassName"] == PRIORITY_CLASS, key
        assert pod["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 0, key
        assert pod["automountServiceAccountToken"] is False, key
        assert "nodeName" not in pod, f"{key}: a check goes through the scheduler, so preemption can reach it"
        (container,) = pod["containers"]
        assert command in container["command"][-1], key
        assert container["terminationMessagePolicy"] == "File", key
        assert "/dev/termination-log" in container["command"][-1], (
            f"{key}: figures go to the termination message"
        )
        limits = container["resources"]["limits"]
        assert GPU_RESOURCE in limits, f"{key}: the check asks the scheduler for the node's GPUs"


def test_values_hold_the_same_check_templates_as_the_package() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["checks"]
    packaged = yaml.safe_load(PACKAGED.read_text())
    assert values["templates"] == {key: packaged[key] for key in CHECK_TEMPLATES}
    assert values["priorityClass"]["name"] == PRIORITY_CLASS


def test_a_users_own_check_and_an_image_override_render(
    control_plane: local.ControlPlane, tmp_path: Path
) -> None:
    mine = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "priorityClassName": PRIORITY_CLASS,
                    "containers": [
                        {"name": "check", "image": "example/nccl-tests:1", "command": ["all_reduce_perf"]}
                    ],
                }
            }
        },
    }
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump({"checks": {"image": "registry.example/dcgm:4", "templates": {"NcclAllReduce": mine}}})
    )
    templates = config_map_templates(render(control_plane, "-f", str(values)))
    assert templates["NcclAllReduce"]["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "all_reduce_perf"
    ]
    for key in CHECK_TEMPLATES:
        (container,) = templates[key]["spec"]["template"]["spec"]["containers"]
        assert container["image"] == "registry.example/dcgm:4", key


def test_a_check_template_that_is_not_a_job_is_refused(control_plane: local.ControlPlane) -> None:
    result = control_plane.helm(
        "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION,
        "--set", "repair.enabled=true", "--set", "checks.templates.DcgmDiag.kind=Pod", check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "/checks/templates/DcgmDiag/kind" in result.stderr, result.stderr


def test_the_priority_class_and_check_jobs_are_accepted_by_the_api_server(
    crds: local.ControlPlane, namespace: str
) -> None:
    crds.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=privileged", "--overwrite"
    )
    # A name of this test's own: the session's cluster is shared, and a release installed later must not
    # meet a PriorityClass gpu-health-check that no release owns.
    own = f"e2e-check-{secrets.token_hex(3)}"
    objects = render(crds, "--set", f"checks.priorityClass.name={own}")
    (priority,) = priority_classes(objects)
    crds.kubectl("create", "-f", "-", input=json.dumps(priority))
    try:
        accepted(crds, namespace, objects, priority)
    finally:
        crds.kubectl("delete", "priorityclass", own, "--wait=false")


def accepted(
    crds: local.ControlPlane, namespace: str, objects: list[dict[str, Any]], priority: dict[str, Any]
) -> None:
    for key in CHECK_TEMPLATES:
        job = config_map_templates(objects)[key]
        job["metadata"] = {**job.get("metadata", {}), "name": f"check-{key.lower()}", "namespace": namespace}
        # As the step will: the node's GPU count, and the node by affinity (the scheduler stays in the loop).
        container = job["spec"]["template"]["spec"]["containers"][0]
        container["resources"]["limits"][GPU_RESOURCE] = 8
        job["spec"]["template"]["spec"]["priorityClassName"] = priority["metadata"]["name"]
        job["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "gpu-node-0"}
        crds.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(job))
        # The priority is resolved when a pod is admitted: the Job's pod, as the Job controller would make it.
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"check-{key.lower()}", "namespace": namespace},
            "spec": job["spec"]["template"]["spec"],
        }
        result = crds.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(pod))
        created = json.loads(result.stdout)["spec"]
        assert created["priority"] == priority["value"], "the API server resolved the check's priority"
        assert created["preemptionPolicy"] == "Never"


def test_a_second_release_leaves_the_first_releases_priority_class_alone(
    crds: local.ControlPlane, namespace: str
) -> None:
    own = f"e2e-check-{secrets.token_hex(3)}"
    first = {"metadata": {"name": own, "annotations": {"meta.helm.sh/release-name": "first"}}}
    theirs = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "value": -100, **first}
    crds.kubectl("create", "-f", "-", input=json.dumps(theirs))
    try:
        out = crds.helm(
            "install", "second", str(CHART), "-n", namespace, "--dry-run=server", "-o", "json",
            "--set", "repair.enabled=true", "--set", f"checks.priorityClass.name={own}",
        ).stdout  # fmt: skip
        objects = [doc for doc in yaml.safe_load_all(json.loads(out)["manifest"]) if doc]
        assert priority_classes(objects) == []
        assert set(config_map_templates(objects)) >= set(CHECK_TEMPLATES)
    finally:
        crds.kubectl("delete", "priorityclass", own, "--wait=false")


def test_dra_checks_are_configured_and_granted_with_the_jobs_only(control_plane: local.ControlPlane) -> None:
    objects = render(control_plane, "--set", "checks.dra.deviceClassName=gpu.example.com")
    (deployment,) = [o for o in objects if o["kind"] == "Deployment" and "operator" in o["metadata"]["name"]]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--check-dra-device-class=gpu.example.com" in args
    assert "--check-dra-driver=gpu.nvidia.com" in args
    config = operator_cli.parse_args(args)
    assert (config.check_dra_device_class, config.check_dra_driver) == ("gpu.example.com", "gpu.nvidia.com")
    (role,) = [
        o for o in objects if o["kind"] == "Role" and o["metadata"]["name"].endswith("-operator-repair")
    ]
    assert {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaimtemplates"],
        "verbs": ["create"],
    } in (role["rules"])
    without = render(control_plane, "--set", "repair.enabled=false")
    granted = {
        res
        for o in without
        if o["kind"] in ("Role", "ClusterRole")
        for r in o["rules"]
        for res in r["resources"]
    }
    assert "resourceclaimtemplates" not in granted, "no right to claim GPUs until Jobs may run"
