"""The chart's part of repair (policy spec.repair): the Job templates' ConfigMap, the operator's flags, RBAC.

What an operator of the chart relies on: the ConfigMap the chart renders holds the same Job manifests the
operator falls back to (operator/gpuhealth_operator/repair-templates.yaml), each one a Job the real API
server accepts once the operator has filled in its part; the operator is pointed at them; and its service
account may run Jobs in the repair namespace only — nothing cluster-wide. Rendering runs the real helm; the
permissions are asked of the real API server (SubjectAccessReview, and a server-side dry-run create with the
service account's own token) after a `helm install` into the local control plane.
"""

import contextlib
import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.ladder.repair import jobs
from gpuhealth_operator.runtime import cli as operator_cli
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpu-health"
PACKAGED = ROOT / "operator" / "gpuhealth_operator" / "repair-templates.yaml"
RELEASE = "render"
KUBE_VERSION = "1.36.0"
UNIQUE_LABEL = "e2e.gpuhealth.io/chart-repair"
TEMPLATE_KEYS = [a.value for a in vocabulary.RepairAction] + [vocabulary.VALIDATION_JOB]
CHECK_KEYS = ["DcgmDiagQuick", "DcgmDiag"]
"""The active checks' templates share the file and the ConfigMap (tests/e2e/test_chart_checks.py)."""
VALUE_KEYS = {"ResetGPU": "resetGPU", "RebootNode": "rebootNode", "Validation": "validation"}


def render(cp: local.ControlPlane, *args: str, namespace: str = "gpu-health") -> list[dict[str, Any]]:
    """The chart with repair on (off by default: test_chart_privilege.py); `args` may turn it off."""
    out = cp.helm(
        "template", RELEASE, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION,
        "--set", "repair.enabled=true", *args,
    ).stdout  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    (found,) = [o for o in by_kind(objects, kind) if o["metadata"]["name"].endswith(suffix)]
    return found


def templates_of(config_map: dict[str, Any]) -> dict[str, Any]:
    return {key: yaml.safe_load(text) for key, text in config_map["data"].items()}


def operator_args(objects: list[dict[str, Any]]) -> list[str]:
    (deployment,) = by_kind(objects, "Deployment")
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_packaged_templates_are_one_job_per_action() -> None:
    packaged = yaml.safe_load(PACKAGED.read_text())
    assert sorted(packaged) == sorted(TEMPLATE_KEYS + CHECK_KEYS)
    for key, job in packaged.items():
        assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job"), key
        pod = job["spec"]["template"]["spec"]
        assert pod["restartPolicy"] == "Never", key
        assert pod["containers"], key
    reset = packaged["ResetGPU"]["spec"]["template"]["spec"]["containers"][0]
    # Kubernetes expands $(VAR) in args: the script gets the UUIDs as $1.
    assert f"$({keys.REPAIR_GPUS_ENV})" in reset["command"]
    assert "nvidia-smi --gpu-reset" in reset["command"][2]
    reboot = packaged["RebootNode"]["spec"]["template"]["spec"]
    assert reboot["hostPID"] is True
    assert reboot["containers"][0]["command"][:3] == ["nsenter", "-t", "1"]
    validation = packaged["Validation"]["spec"]["template"]["spec"]["containers"][0]
    assert validation["image"].startswith("nvcr.io/nvidia/cloud-native/dcgm:")
    assert "dcgmi diag -r 2" in validation["command"][2]


def test_default_config_map_equals_the_packaged_templates(control_plane: local.ControlPlane) -> None:
    objects = render(control_plane)
    config_map = named(objects, "ConfigMap", "-repair-templates")
    assert config_map["metadata"]["name"] == f"{RELEASE}-gpu-health-repair-templates"
    assert config_map["metadata"]["namespace"] == "gpu-health"
    assert templates_of(config_map) == yaml.safe_load(PACKAGED.read_text())


def test_values_hold_the_same_templates_as_the_package() -> None:
    # The values are what `helm show values` prints; a user who copies them starts from the real defaults.
    values = yaml.safe_load((CHART / "values.yaml").read_text())["repair"]["templates"]
    packaged = yaml.safe_load(PACKAGED.read_text())
    assert {key: values[VALUE_KEYS[key]] for key in TEMPLATE_KEYS} == {
        key: packaged[key] for key in TEMPLATE_KEYS
    }


def test_operator_is_pointed_at_the_templates_and_the_release_namespace(
    control_plane: local.ControlPlane,
) -> None:
    args = operator_args(render(control_plane, namespace="gpu-fleet"))
    assert "--repair-templates=gpu-fleet/render-gpu-health-repair-templates" in args
    assert "--repair-namespace=gpu-fleet" in args
    config = operator_cli.parse_args(args)
    assert config.repair_templates == "gpu-fleet/render-gpu-health-repair-templates"
    assert config.repair_namespace == "gpu-fleet"
    # Only the GPU Operator's own DaemonSet pod there is the node's DCGM host engine for validation.
    assert config.gpu_operator_namespace == "gpu-operator"


def test_the_gpu_operators_namespace_reaches_the_operator_and_openshift_names_its_own(
    control_plane: local.ControlPlane,
) -> None:
    openshift = CHART / "platforms" / "openshift.yaml"
    for args, expected in [
        ((), "gpu-operator"),
        (("--set", "repair.gpuOperatorNamespace=nvidia-gpu"), "nvidia-gpu"),
        (("-f", str(openshift)), "nvidia-gpu-operator"),  # OperatorHub installs it there
    ]:
        config = operator_cli.parse_args(operator_args(render(control_plane, *args)))
        assert config.gpu_operator_namespace == expected, args
    refused = control_plane.helm(
        "template", RELEASE, str(CHART), "--set", "repair.enabled=true",
        "--set", "repair.gpuOperatorNamespace=Not A Namespace", check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "gpuOperatorNamespace" in refused.stderr


def test_repair_permissions_are_namespaced_and_minimal(control_plane: local.ControlPlane) -> None:
    objects = render(control_plane)
    role = named(objects, "Role", "-operator-repair")
    assert role["metadata"]["namespace"] == "gpu-health"
    rules = [(r["apiGroups"], r["resources"], r["verbs"], r.get("resourceNames")) for r in role["rules"]]
    assert rules == [
        (["batch"], ["jobs"], ["create", "get", "list", "watch", "delete"], None),
        ([""], ["pods"], ["get", "list", "watch"], None),
        (["resource.k8s.io"], ["resourceclaimtemplates"], ["create"], None),
        ([""], ["configmaps"], ["get"], ["render-gpu-health-repair-templates"]),
    ]
    binding = named(objects, "RoleBinding", "-operator-repair")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "render-gpu-health-operator", "namespace": "gpu-health"}
    ]
    for cluster_role in by_kind(objects, "ClusterRole"):
        granted = {res for rule in cluster_role["rules"] for res in rule["resources"]}
        assert not granted & {"jobs", "configmaps"}, cluster_role["metadata"]["name"]


def test_repair_jobs_may_run_in_a_namespace_of_their_own(control_plane: local.ControlPlane) -> None:
    objects = render(control_plane, "--set", "repair.namespace=gpu-repair")
    role = named(objects, "Role", "-operator-repair")
    assert role["metadata"]["namespace"] == "gpu-repair"
    assert [r["resources"] for r in role["rules"]] == [["jobs"], ["pods"], ["resourceclaimtemplates"]]
    templates = named(objects, "Role", "-operator-repair-templates")
    assert templates["metadata"]["namespace"] == "gpu-health"
    assert templates["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["render-gpu-health-repair-templates"],
            "verbs": ["get"],
        }
    ]
    assert (
        named(objects, "RoleBinding", "-operator-repair-templates")["metadata"]["namespace"] == "gpu-health"
    )
    assert named(objects, "ConfigMap", "-repair-templates")["metadata"]["namespace"] == "gpu-health"
    assert "--repair-namespace=gpu-repair" in operator_args(objects)


def test_images_and_runtime_class_override_the_templates(control_plane: local.ControlPlane) -> None:
    objects = render(
        control_plane,
        "--set", "repair.runtimeClassName=nvidia",
        "--set", "repair.images.validation=registry.example/dcgm:4.4.2-1-ubuntu22.04",
    )  # fmt: skip
    templates = templates_of(named(objects, "ConfigMap", "-repair-templates"))
    packaged = yaml.safe_load(PACKAGED.read_text())
    for key, job in templates.items():
        pod = job["spec"]["template"]["spec"]
        assert pod.pop("runtimeClassName") == "nvidia", key
        if key == vocabulary.VALIDATION_JOB:
            assert {c.pop("image") for c in pod["containers"]} == {
                "registry.example/dcgm:4.4.2-1-ubuntu22.04"
            }
            for container in packaged[key]["spec"]["template"]["spec"]["containers"]:
                del container["image"]
        assert job == packaged[key], key


def test_a_whole_template_may_be_replaced(control_plane: local.ControlPlane, tmp_path: Path) -> None:
    mine = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "check", "image": "example/gpu-burn:1", "command": ["gpu-burn", "60"]}
                    ],
                }
            }
        },
    }
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"repair": {"templates": {"validation": mine}}}))
    templates = templates_of(
        named(render(control_plane, "-f", str(values)), "ConfigMap", "-repair-templates")
    )
    # Helm merges maps: keys the user's manifest leaves out keep the default's (here metadata, backoffLimit).
    validation = templates["Validation"]
    assert (
        validation["spec"]["template"]["spec"]["containers"] == mine["spec"]["template"]["spec"]["containers"]
    )
    assert validation["spec"]["backoffLimit"] == 0
    assert validation["metadata"]["labels"]["app.kubernetes.io/component"] == "repair"
    assert templates["ResetGPU"] == yaml.safe_load(PACKAGED.read_text())["ResetGPU"]


def test_a_template_that_is_not_a_job_is_refused(control_plane: local.ControlPlane) -> None:
    result = control_plane.helm(
        "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION,
        "--set", "repair.enabled=true", "--set", "repair.templates.rebootNode.kind=Pod", check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "/repair/templates/rebootNode/kind" in result.stderr, result.stderr


def test_repair_can_be_left_out(control_plane: local.ControlPlane) -> None:
    objects = render(control_plane, "--set", "repair.enabled=false")
    assert not [o for o in objects if "repair" in o["metadata"]["name"]]
    assert not [a for a in operator_args(objects) if a.startswith("--repair")]


def test_each_template_is_a_job_the_api_server_accepts(crds: local.ControlPlane, namespace: str) -> None:
    # As the operator fills it in (`jobs.fill`: name, namespace, node and its ownerReference, tolerations,
    # env, deadlines, ServiceAccount default without a token), server-side dry run: the API server's own
    # validation and admission, nothing created. The namespace admits privileged pods.
    crds.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=privileged", "--overwrite"
    )
    for key, template in jobs.packaged_templates().items():
        job = jobs.fill(
            template,
            name=f"repair-{key.lower()}",
            namespace=namespace,
            node="gpu-node-0",
            node_uid="6f1c2a9e-0000-4000-8000-000000000000",
            policy="p",
            cycle=1,
            action=key,
            gpus=["GPU-0a1b2c3d-0000-4000-8000-000000000003"],
            timeout_seconds=300,
            cycle_started="2026-12-01T12:00:00.000000Z",
        )
        pod = job["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "default" and pod["automountServiceAccountToken"] is False
        crds.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(job))


# -- installed: the operator's service account, asked of the API server -------------------------------


@contextlib.contextmanager
def installed(cp: local.ControlPlane, tmp: Path) -> Iterator[tuple[str, str, str]]:
    """A release in a fresh namespace, pods pinned to a label no node has: (namespace, fullname, other)."""
    suffix = "r" + secrets.token_hex(3)
    namespace, other, name = f"repair-e2e-{suffix}", f"repair-e2e-{suffix}-other", f"repair-{suffix}"
    values = tmp / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "operator": {"nodeSelector": {UNIQUE_LABEL: suffix}},
                "agent": {"nodeSelector": {UNIQUE_LABEL: suffix}},
                "repair": {"enabled": True},
            }
        )
    )
    cp.kubectl("create", "namespace", namespace)
    cp.kubectl("create", "namespace", other)
    try:
        cp.helm("install", name, str(CHART), "--namespace", namespace, "-f", str(values), timeout=180)
        try:
            yield namespace, f"{name}-gpu-health", other
        finally:
            cp.helm("uninstall", name, "--namespace", namespace, check=False, timeout=180)
    finally:
        cp.kubectl("delete", "namespace", namespace, other, "--ignore-not-found", "--wait=false")


@pytest.fixture(scope="module")
def release(
    control_plane: local.ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str, str]]:
    with installed(control_plane, tmp_path_factory.mktemp("chart-repair")) as found:
        yield found


def allowed(cp: local.ControlPlane, user: str, home: str, verb: str, resource: str, **more: str) -> bool:
    """A SubjectAccessReview of the real API server: may `user` do this?"""
    group, _, plural = resource.rpartition("/")
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{home}",
                "system:authenticated",
            ],
            "resourceAttributes": {"group": group, "resource": plural, "verb": verb, **more},
        },
    }
    out = cp.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(review)).stdout
    return bool(json.loads(out)["status"].get("allowed"))


def test_install_ships_the_templates_and_the_role(
    control_plane: local.ControlPlane, release: tuple[str, str, str]
) -> None:
    namespace, fullname, _ = release
    config_map = json.loads(
        control_plane.kubectl(
            "get", "configmap", f"{fullname}-repair-templates", "-n", namespace, "-o", "json"
        ).stdout
    )
    assert templates_of(config_map) == yaml.safe_load(PACKAGED.read_text())
    control_plane.kubectl("get", "role,rolebinding", f"{fullname}-operator-repair", "-n", namespace)


def test_operator_may_run_jobs_in_the_release_namespace_only(
    control_plane: local.ControlPlane, release: tuple[str, str, str], tmp_path: Path
) -> None:
    namespace, fullname, other = release
    account = f"system:serviceaccount:{namespace}:{fullname}-operator"

    def may(ns: str, verb: str, resource: str, **more: str) -> bool:
        attributes = {"namespace": ns, **more} if ns else more
        return allowed(control_plane, account, namespace, verb, resource, **attributes)

    for verb in ("create", "get", "list", "watch", "delete"):
        assert may(namespace, verb, "batch/jobs"), verb
        assert not may(other, verb, "batch/jobs"), verb
    for verb in ("update", "patch"):
        assert not may(namespace, verb, "batch/jobs"), verb
    assert not may("", "create", "batch/jobs"), "jobs in every namespace"
    assert may(namespace, "get", "/configmaps", name=f"{fullname}-repair-templates")
    assert not may(namespace, "get", "/configmaps", name=f"{fullname}-agent-scenario")
    assert not may(namespace, "list", "/configmaps")
    assert not may(namespace, "create", "/pods")
    # A DRA check's claim template: created in the Jobs' namespace only; the Job owns it, the garbage
    # collector deletes it.
    assert may(namespace, "create", "resource.k8s.io/resourceclaimtemplates")
    assert not may(other, "create", "resource.k8s.io/resourceclaimtemplates")
    for verb in ("get", "list", "update", "patch", "delete"):
        assert not may(namespace, verb, "resource.k8s.io/resourceclaimtemplates"), verb

    # The same through the service account's own token: a Job create, server-side dry run.
    token = control_plane.kubectl(
        "create", "token", f"{fullname}-operator", "-n", namespace, "--duration=10m"
    ).stdout.strip()
    kubeconfig = tmp_path / "operator.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "local",
                        "cluster": {
                            "server": control_plane.server,
                            "certificate-authority": str(control_plane.ca_cert),
                        },
                    }
                ],
                "users": [{"name": "operator", "user": {"token": token}}],
                "contexts": [{"name": "operator", "context": {"cluster": "local", "user": "operator"}}],
                "current-context": "operator",
            }
        )
    )
    job = yaml.safe_load(PACKAGED.read_text())["ResetGPU"]
    for ns, permitted in ((namespace, True), (other, False)):
        job["metadata"].update(name="repair-rbac-probe", namespace=ns)
        result = subprocess.run(
            [str(control_plane.binaries / "kubectl"), "--kubeconfig", str(kubeconfig),
             "create", "--dry-run=server", "-f", "-"],
            input=json.dumps(job), capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert (result.returncode == 0) == permitted, result.stderr
        if not permitted:
            assert "forbidden" in result.stderr, result.stderr
