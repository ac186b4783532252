"""Running privileged work is an explicit grant (issue 45 item 11, DESIGN.md).

What a cluster administrator relies on, asked of the real API server after a `helm install` of the chart:
- with default values the operator's service account may create no Job anywhere (`repair.enabled` is off);
  `repair.enabled=true` grants it in the repair namespace, and turning it off again takes it back;
- someone bound only to the built-in `edit` role (cluster-wide) writes ordinary policies, but not one that
  runs Jobs on nodes (`spec.repair`) or judges kubelet's own Node conditions, nor an edit of such a policy
  written by someone else: the chart's ValidatingAdmissionPolicy refuses it with a message naming the verb
  and the ClusterRole that grant it; bound to that ClusterRole too, the same person may.
People are impersonated (`kubectl --as`) with the administrator's kubeconfig.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth_api import resources
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpu-health"
UNIQUE_LABEL = "e2e.gpuhealth.io/chart-privilege"
RUN_JOBS = "run-jobs"
JUDGE_KUBELET = "judge-kubelet-conditions"
RBAC_SECONDS = 30.0
"""How long the controller manager's aggregation and the authorizer's cache may take to see a binding."""


class Release:
    def __init__(self, cp: local.ControlPlane, tmp: Path) -> None:
        self.cp = cp
        self.suffix = "p" + secrets.token_hex(3)
        self.namespace = f"privilege-e2e-{self.suffix}"
        self.name = f"privilege-{self.suffix}"
        self.fullname = f"{self.name}-gpu-health"
        self.values = tmp / "values.yaml"
        # Pods pinned to a label no node has: only the API objects matter here.
        self.values.write_text(
            yaml.safe_dump(
                {
                    "operator": {"nodeSelector": {UNIQUE_LABEL: self.suffix}},
                    "agent": {"nodeSelector": {UNIQUE_LABEL: self.suffix}},
                }
            )
        )

    def helm(self, verb: str, *more: str) -> None:
        self.cp.helm(
            verb, self.name, str(CHART), "--namespace", self.namespace, "-f", str(self.values), *more,
            timeout=180,
        )  # fmt: skip

    @property
    def operator_account(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.fullname}-operator"

    @property
    def grant(self) -> str:
        return f"{self.fullname}-privileged-policies"


@pytest.fixture(scope="module")
def release(control_plane: local.ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    found = Release(control_plane, tmp_path_factory.mktemp("chart-privilege"))
    control_plane.kubectl("create", "namespace", found.namespace)
    try:
        found.helm("install")
        admission_ready(control_plane)
        try:
            yield found
        finally:
            control_plane.helm(
                "uninstall", found.name, "--namespace", found.namespace, check=False, timeout=180
            )
    finally:
        control_plane.kubectl("delete", "namespace", found.namespace, "--ignore-not-found", "--wait=false")


@contextlib.contextmanager
def person(cp: local.ControlPlane, *cluster_roles: str) -> Iterator[str]:
    """A user bound cluster-wide to these ClusterRoles only; the bindings go afterwards."""
    user = f"alice-{secrets.token_hex(3)}"
    bindings = [f"{user}-{i}" for i in range(len(cluster_roles))]
    for binding, role in zip(bindings, cluster_roles, strict=True):
        cp.kubectl("create", "clusterrolebinding", binding, f"--clusterrole={role}", f"--user={user}")
    try:
        yield user
    finally:
        cp.kubectl("delete", "clusterrolebinding", *bindings, "--ignore-not-found")


def policy(name: str, **spec: Any) -> dict[str, Any]:
    """A policy that selects no node (a label no node has)."""
    return {
        "apiVersion": resources.API_VERSION,
        "kind": resources.POLICY_KIND,
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"matchLabels": {UNIQUE_LABEL: name}},
            "dryRun": True,
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
            **spec,
        },
    }


REPAIR = {"steps": [{"name": "reboot", "action": "RebootNode"}]}
NOT_READY = [
    {
        "name": "not-ready",
        "nodeCondition": {"type": "Ready", "status": "False", "allowKubeletCondition": True},
        "action": "Drain",
    }
]


def create_as(cp: local.ControlPlane, user: str, body: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return cp.kubectl("--as", user, "create", "-f", "-", input=json.dumps(body), check=False)


@pytest.fixture
def names(control_plane: local.ControlPlane) -> Iterator[list[str]]:
    """Policies a test may create; deleted afterwards, whoever created them."""
    made: list[str] = []
    yield made
    for name in made:
        control_plane.kubectl("delete", resources.POLICY_PLURAL, name, "--ignore-not-found")


def fresh(names: list[str]) -> str:
    name = f"privilege-{secrets.token_hex(4)}"
    names.append(name)
    return name


def can_create_policies(cp: local.ControlPlane, user: str) -> bool:
    result = cp.kubectl("auth", "can-i", "create", resources.POLICY_PLURAL, "--as", user, check=False)
    return result.stdout.strip() == "yes"


def editor_ready(cp: local.ControlPlane, user: str) -> None:
    """Wait until `edit` carries the chart's policy rules (the controller manager aggregates them)."""
    waiting.wait_until(
        lambda: can_create_policies(cp, user) or None,
        timeout_seconds=RBAC_SECONDS,
        message=f"{user} (edit) may create policies",
    )


def admission_ready(cp: local.ControlPlane) -> None:
    """Wait until the API server enforces the chart's ValidatingAdmissionPolicy: it loads a new policy and
    its binding asynchronously, so a write just after `helm install` may pass unchecked (seen once in
    three runs). Asked as an editor with a server-side dry run, which stores nothing."""
    with person(cp, "edit") as user:
        editor_ready(cp, user)
        body = json.dumps(policy(f"privilege-probe-{secrets.token_hex(3)}", repair=REPAIR))

        def refused() -> bool | None:
            answer = cp.kubectl(
                "--as", user, "create", "--dry-run=server", "-f", "-", input=body, check=False
            )
            return (answer.returncode != 0 and RUN_JOBS in answer.stderr) or None

        waiting.wait_until(refused, timeout_seconds=RBAC_SECONDS, message="the admission policy enforced")


def test_an_editor_writes_an_ordinary_policy(release: Release, names: list[str]) -> None:
    cp = release.cp
    with person(cp, "edit") as user:
        editor_ready(cp, user)
        result = create_as(cp, user, policy(fresh(names)))
        assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("spec", "verb", "what"),
    [
        ({"repair": REPAIR}, RUN_JOBS, "spec.repair"),
        ({"rules": NOT_READY}, JUDGE_KUBELET, "kubelet's own Node conditions"),
    ],
    ids=["repair", "kubelet-condition"],
)
def test_an_editor_may_not_write_a_privileged_policy_and_the_grant_allows_it(
    release: Release, names: list[str], spec: dict[str, Any], verb: str, what: str
) -> None:
    cp = release.cp
    with person(cp, "edit") as user:
        editor_ready(cp, user)
        name = fresh(names)
        refused = create_as(cp, user, policy(name, **spec))
        assert refused.returncode != 0, f"{user} (edit) created a policy with {what}"
        assert "forbidden" in refused.stderr.lower(), refused.stderr
        assert what in refused.stderr, refused.stderr
        assert f"verb {verb}" in refused.stderr, refused.stderr
        assert f"ClusterRole {release.grant}" in refused.stderr, refused.stderr
        assert cp.kubectl("get", resources.POLICY_PLURAL, name, check=False).returncode != 0, "stored"

    with person(cp, "edit", release.grant) as user:
        editor_ready(cp, user)
        waiting.wait_until(
            lambda: create_as(cp, user, policy(name, **spec)).returncode == 0 or None,
            timeout_seconds=RBAC_SECONDS,
            message=f"{user} (edit + {release.grant}) creates a policy with {what}",
        )


def test_an_editor_may_not_change_a_privileged_policy_someone_granted_wrote(
    release: Release, names: list[str]
) -> None:
    # Else `edit` could widen a granted repair policy's nodeSelector to every node, or its budget to 100 %.
    cp = release.cp
    name = fresh(names)
    cp.kubectl("create", "-f", "-", input=json.dumps(policy(name, repair=REPAIR)))  # the administrator
    with person(cp, "edit") as user:
        editor_ready(cp, user)
        patch = json.dumps({"spec": {"maxUnavailable": "100%", "nodeSelector": {"matchLabels": None}}})
        refused = cp.kubectl(
            "--as", user, "patch", resources.POLICY_PLURAL, name, "--type=merge", "-p", patch, check=False
        )
        assert refused.returncode != 0, "an editor changed a policy that runs Jobs"
        assert f"verb {RUN_JOBS}" in refused.stderr, refused.stderr
        stored = json.loads(cp.kubectl("get", resources.POLICY_PLURAL, name, "-o", "json").stdout)
        assert stored["spec"]["nodeSelector"] == {"matchLabels": {UNIQUE_LABEL: name}}
        # Taking privilege away is never refused: removing spec.repair, or the policy.
        removed = cp.kubectl(
            "--as", user, "patch", resources.POLICY_PLURAL, name, "--type=json",
            "-p", '[{"op": "remove", "path": "/spec/repair"}]', check=False,
        )  # fmt: skip
        assert removed.returncode == 0, removed.stderr
        deleted = cp.kubectl("--as", user, "delete", resources.POLICY_PLURAL, name, check=False)
        assert deleted.returncode == 0, deleted.stderr


def can_i(cp: local.ControlPlane, account: str, namespace: str, *what: str) -> bool:
    result = cp.kubectl("auth", "can-i", *what, "-n", namespace, "--as", account, check=False)
    return result.stdout.strip() == "yes"


def test_the_operator_may_create_jobs_only_once_repair_is_enabled(release: Release) -> None:
    cp, account, namespace = release.cp, release.operator_account, release.namespace
    assert not can_i(cp, account, namespace, "create", "jobs.batch")
    assert not can_i(cp, account, namespace, "create", "jobs.batch", "--all-namespaces")
    assert not can_i(cp, account, namespace, "create", "pods")
    config_maps = cp.kubectl("get", "configmaps", "-n", namespace, "-o", "name").stdout
    assert "repair-templates" not in config_maps, "the templates ship only with repair.enabled"

    release.helm("upgrade", "--set", "repair.enabled=true")
    try:
        waiting.wait_until(
            lambda: can_i(cp, account, namespace, "create", "jobs.batch") or None,
            timeout_seconds=RBAC_SECONDS,
            message="repair.enabled=true lets the operator create Jobs in the release namespace",
        )
        assert not can_i(cp, account, namespace, "create", "jobs.batch", "--all-namespaces")
    finally:
        release.helm("upgrade")
    waiting.wait_until(
        lambda: not can_i(cp, account, namespace, "create", "jobs.batch") or None,
        timeout_seconds=RBAC_SECONDS,
        message="repair turned off again takes the operator's right to create Jobs back",
    )
