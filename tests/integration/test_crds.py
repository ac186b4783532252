"""The CRDs as a real API server serves them: validation, defaults, status merges, printed columns.

What a fleet operator sees: `kubectl apply` of a bad policy fails naming the
field and stores nothing; the default policy is accepted; agent and operator
write one GPUNode's status side by side; `kubectl get gpunodes` and
`kubectl get ghp` print the columns DESIGN.md promises.

Every object here is cluster-scoped in a shared cluster, so names start with
"crds-" and policies select only the label SELECTOR_LABEL, which no Node has.
"""

import copy
import datetime
import hashlib
import json
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gpuhealth_api import conditions, resources, vocabulary
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

C = vocabulary.Condition
A = vocabulary.Action

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_POLICY = ROOT / "examples" / "default-policy.yaml"
SELECTOR_LABEL = "gpuhealth.io/test-crds"
MODEL = "NVIDIA H100 80GB HBM3"
DRIVER = "570.124.06"
APPLY = "application/apply-patch+yaml"

Mutation = Callable[[dict[str, Any]], None]


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def policy(name: str, **spec: Any) -> dict[str, Any]:
    """A small valid policy selecting no real Node; keyword arguments override spec fields."""
    body: dict[str, Any] = {
        "apiVersion": resources.API_VERSION,
        "kind": resources.POLICY_KIND,
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"matchLabels": {SELECTOR_LABEL: name}},
            "rules": [{"name": "ecc", "condition": C.ECC_UNCORRECTABLE, "action": A.DRAIN}],
        },
    }
    body["spec"].update(spec)
    return body


def apply(
    cp: local.ControlPlane, body: dict[str, Any], *flags: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return cp.kubectl("apply", "--server-side", "-f", "-", *flags, input=json.dumps(body), check=check)


def delete(k8s: client.ApiClient, plural: str, name: str) -> None:
    try:
        client.CustomObjectsApi(k8s).delete_cluster_custom_object(
            resources.GROUP, resources.VERSION, plural, name
        )
    except client.ApiException as error:
        if error.status != 404:
            raise


def exists(k8s: client.ApiClient, plural: str, name: str) -> bool:
    try:
        client.CustomObjectsApi(k8s).get_cluster_custom_object(
            resources.GROUP, resources.VERSION, plural, name
        )
    except client.ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def get(cp: local.ControlPlane, plural: str, name: str) -> dict[str, Any]:
    document = json.loads(cp.kubectl("get", plural, name, "-o", "json", "--show-managed-fields").stdout)
    assert isinstance(document, dict)
    return document


def table(output: str) -> list[dict[str, str]]:
    """Rows of a `kubectl get` table, split at the header's column starts (values may hold spaces)."""
    header, *rows = output.rstrip("\n").split("\n")
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = header.split()
    bounds = [*starts[1:], None]
    return [
        {name: row[start:end].strip() for name, start, end in zip(names, starts, bounds, strict=True)}
        for row in rows
    ]


def header(output: str) -> list[str]:
    return output.split("\n", 1)[0].split()


def names_field(message: str, field: str) -> bool:
    """Whether an error message names exactly this field (not only a parent or child of it)."""
    return re.search(rf"(?:^|[^\w.\]])\.?{re.escape(field)}(?![\w.\[])", message) is not None


def rule(**fields: Any) -> Mutation:
    def mutate(spec: dict[str, Any]) -> None:
        spec["rules"] = [fields]

    return mutate


def setting(path: str, value: Any) -> Mutation:
    def mutate(spec: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        node = spec
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value

    return mutate


def without(field: str) -> Mutation:
    def mutate(spec: dict[str, Any]) -> None:
        del spec[field]

    return mutate


def expression(**requirement: Any) -> Mutation:
    return setting("nodeSelector", {"matchExpressions": [requirement]})


def step(**fields: Any) -> dict[str, Any]:
    """A repair step; keyword arguments override its fields."""
    return {"name": "reset", "action": vocabulary.RepairAction.RESET_GPU, **fields}


def repair(**fields: Any) -> Mutation:
    """Set spec.repair to one valid step plus these fields (None drops a field)."""

    def mutate(spec: dict[str, Any]) -> None:
        spec["repair"] = {k: v for k, v in {"steps": [step()], **fields}.items() if v is not None}

    return mutate


ECC = {"name": "ecc", "condition": C.ECC_UNCORRECTABLE, "action": A.DRAIN}

# (id, change to a valid spec, the field the error must name)
MALFORMED: list[tuple[str, Mutation, str]] = [
    ("max-unavailable-zero", setting("maxUnavailable", 0), "spec.maxUnavailable"),
    ("max-unavailable-negative", setting("maxUnavailable", -2), "spec.maxUnavailable"),
    ("max-unavailable-150-percent", setting("maxUnavailable", "150%"), "spec.maxUnavailable"),
    ("max-unavailable-0-percent", setting("maxUnavailable", "0%"), "spec.maxUnavailable"),
    ("max-unavailable-word", setting("maxUnavailable", "abc"), "spec.maxUnavailable"),
    ("breaker-zero", setting("breaker.maxNewUnhealthy", 0), "spec.breaker.maxNewUnhealthy"),
    ("breaker-150-percent", setting("breaker.maxNewUnhealthy", "150%"), "spec.breaker.maxNewUnhealthy"),
    ("breaker-word", setting("breaker.maxNewUnhealthy", "many"), "spec.breaker.maxNewUnhealthy"),
    ("breaker-window-zero", setting("breaker.windowSeconds", 0), "spec.breaker.windowSeconds"),
    ("breaker-window-duration", setting("breaker.windowSeconds", "10m"), "spec.breaker.windowSeconds"),
    ("max-unavailable-gpus-zero", setting("maxUnavailableGPUs", 0), "spec.maxUnavailableGPUs"),
    ("max-unavailable-gpus-150-percent", setting("maxUnavailableGPUs", "150%"), "spec.maxUnavailableGPUs"),
    ("isolation-zero-gpus", setting("isolation", {"maxGPUsPerNode": 0}), "spec.isolation.maxGPUsPerNode"),
    (
        "isolation-prefer-no-schedule",
        setting("isolation", {"effect": "PreferNoSchedule"}),
        "spec.isolation.effect",
    ),
    (
        "isolate-gpu-on-thermal",
        rule(name="t", condition=C.THERMAL_THROTTLED, action=A.ISOLATE_GPU),
        "spec.rules[0].action",
    ),
    (
        "unknown-condition",
        rule(name="r", condition="EccCorrectable", action=A.DRAIN),
        "spec.rules[0].condition",
    ),
    ("unknown-action", rule(name="r", condition=C.GPU_LOST, action="Reboot"), "spec.rules[0].action"),
    ("missing-action", rule(name="r", condition=C.GPU_LOST), "spec.rules[0].action"),
    ("bad-rule-name", rule(name="Bad_Name", condition=C.GPU_LOST, action=A.DRAIN), "spec.rules[0].name"),
    ("duplicate-rule-names", setting("rules", [ECC, {**ECC, "action": A.CORDON}]), "spec.rules[1]"),
    (
        "negative-for-seconds",
        rule(name="t", condition=C.THERMAL_THROTTLED, action=A.LABEL, forSeconds=-1),
        "spec.rules[0].forSeconds",
    ),
    (
        "threshold-on-thermal",
        rule(name="t", condition=C.THERMAL_THROTTLED, action=A.LABEL, threshold=3.5),
        "spec.rules[0].threshold",
    ),
    (
        "straggler-zero-threshold",
        rule(name="s", condition=C.STRAGGLER, action=A.LABEL, threshold=0),
        "spec.rules[0].threshold",
    ),
    (
        "threshold-on-fabric",
        rule(name="f", condition=C.FABRIC_UNHEALTHY, action=A.DRAIN, threshold=1),
        "spec.rules[0].threshold",
    ),
    (
        "condition-and-node-condition",
        rule(name="k", condition=C.GPU_LOST, nodeCondition={"type": "KernelDeadlock"}, action=A.DRAIN),
        "spec.rules[0].condition",
    ),
    ("neither-condition-nor-node-condition", rule(name="k", action=A.DRAIN), "spec.rules[0].condition"),
    (
        "node-condition-ours",
        rule(name="k", nodeCondition={"type": "GPUHealthy"}, action=A.DRAIN),
        "spec.rules[0].nodeCondition.type",
    ),
    (
        "node-condition-bad-status",
        rule(name="k", nodeCondition={"type": "KernelDeadlock", "status": "Yes"}, action=A.DRAIN),
        "spec.rules[0].nodeCondition.status",
    ),
    (
        "node-condition-kubelet-ready",
        rule(name="k", nodeCondition={"type": "Ready", "status": "False"}, action=A.TAINT),
        "spec.rules[0].nodeCondition.type",
    ),
    (
        "node-condition-kubelet-opt-in-false",
        rule(
            name="k",
            nodeCondition={"type": "DiskPressure", "allowKubeletCondition": False},
            action=A.CORDON,
        ),
        "spec.rules[0].nodeCondition.type",
    ),
    (
        "node-condition-kubelet-opt-in-word",
        rule(name="k", nodeCondition={"type": "Ready", "allowKubeletCondition": "yes"}, action=A.TAINT),
        "spec.rules[0].nodeCondition.allowKubeletCondition",
    ),
    (
        "node-condition-isolate-gpu",
        rule(name="k", nodeCondition={"type": "KernelDeadlock"}, action=A.ISOLATE_GPU),
        "spec.rules[0].action",
    ),
    (
        "xids-on-ecc",
        rule(name="e", condition=C.ECC_UNCORRECTABLE, action=A.DRAIN, xids=[79]),
        "spec.rules[0].xids",
    ),
    (
        "xid-rule-empty-xids",
        rule(name="x", condition=C.XID_CRITICAL, action=A.DRAIN, xids=[]),
        "spec.rules[0].xids",
    ),
    (
        "xid-out-of-range",
        rule(name="x", condition=C.XID_CRITICAL, action=A.DRAIN, xids=[79, 2048]),
        "spec.rules[0].xids[1]",
    ),
    (
        "duplicate-xids",
        rule(name="x", condition=C.XID_CRITICAL, action=A.DRAIN, xids=[79, 79]),
        "spec.rules[0].xids[1]",
    ),
    ("empty-rules", setting("rules", []), "spec.rules"),
    ("missing-rules", without("rules"), "spec.rules"),
    ("agent-stale-drain", rule(name="a", condition=C.AGENT_STALE, action=A.DRAIN), "spec.rules[0].action"),
    ("agent-stale-cordon", rule(name="a", condition=C.AGENT_STALE, action=A.CORDON), "spec.rules[0].action"),
    (
        "bad-selector-operator",
        expression(key="nvidia.com/gpu.present", operator="Equals", values=["true"]),
        "spec.nodeSelector.matchExpressions[0].operator",
    ),
    (
        "selector-in-without-values",
        expression(key="nvidia.com/gpu.present", operator="In"),
        "spec.nodeSelector.matchExpressions[0].values",
    ),
    (
        "selector-exists-with-values",
        expression(key="nvidia.com/gpu.present", operator="Exists", values=["true"]),
        "spec.nodeSelector.matchExpressions[0].values",
    ),
    ("drain-timeout-zero", setting("drain.timeoutSeconds", 0), "spec.drain.timeoutSeconds"),
    ("negative-grace-period", setting("drain.gracePeriodSeconds", -5), "spec.drain.gracePeriodSeconds"),
    ("negative-healthy-for", setting("recovery.healthyForSeconds", -1), "spec.recovery.healthyForSeconds"),
    ("dry-run-not-boolean", setting("dryRun", "maybe"), "spec.dryRun"),
    ("typo-in-field-name", rule(**ECC, forSecond=60), "spec.rules[0].forSecond"),
    ("repair-bad-action", repair(steps=[step(action="Reimage")]), "spec.repair.steps[0].action"),
    (
        "repair-step-timeout-zero",
        repair(steps=[step(timeoutSeconds=0)]),
        "spec.repair.steps[0].timeoutSeconds",
    ),
    ("repair-max-attempts-zero", repair(maxAttempts=0), "spec.repair.maxAttempts"),
    (
        "repair-duplicate-step-names",
        repair(steps=[step(), step(action="RebootNode")]),
        "spec.repair.steps[1]",
    ),
    ("repair-bad-step-name", repair(steps=[step(name="Reset_GPU")]), "spec.repair.steps[0].name"),
    ("repair-no-steps", repair(steps=[]), "spec.repair.steps"),
    ("repair-missing-steps", repair(steps=None), "spec.repair.steps"),
    ("repair-five-steps", repair(steps=[step(name=f"s{i}") for i in range(5)]), "spec.repair.steps"),
    (
        "repair-validation-timeout-zero",
        repair(validation={"timeoutSeconds": 0}),
        "spec.repair.validation.timeoutSeconds",
    ),
    ("repair-new-nodes-word", repair(validation={"newNodes": "yes"}), "spec.repair.validation.newNodes"),
    ("repair-max-concurrent-zero", repair(maxConcurrent=0), "spec.repair.maxConcurrent"),
    ("repair-max-concurrent-150-percent", repair(maxConcurrent="150%"), "spec.repair.maxConcurrent"),
    ("repair-window-59s", repair(attemptWindowSeconds=59), "spec.repair.attemptWindowSeconds"),
]


def unique_name(request: pytest.FixtureRequest) -> str:
    """A DNS-label name unique to this test (and parameter), shared cluster and all."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower().removeprefix("test_")).strip("-")
    if len(slug) > 50:
        slug = f"{slug[:41]}-{hashlib.sha1(slug.encode()).hexdigest()[:8]}"
    return f"crds-{slug}"


@pytest.fixture
def policy_name(
    request: pytest.FixtureRequest, crds: local.ControlPlane, k8s: client.ApiClient
) -> Iterator[str]:
    """A unique policy name for this test, deleted afterwards whatever happened."""
    name = unique_name(request)
    yield name
    delete(k8s, resources.POLICY_PLURAL, name)


@pytest.fixture
def gpunode_name(
    request: pytest.FixtureRequest, crds: local.ControlPlane, k8s: client.ApiClient
) -> Iterator[str]:
    """A unique GPUNode name for this test (no Node of that name exists), deleted afterwards."""
    name = unique_name(request)
    yield name
    delete(k8s, resources.GPUNODE_PLURAL, name)


@pytest.mark.parametrize("plural", [resources.POLICY_PLURAL, resources.GPUNODE_PLURAL])
def test_crd_is_established_with_its_short_name(crds: local.ControlPlane, plural: str) -> None:
    crd = get(crds, "crd", f"{plural}.{resources.GROUP}")
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True"
    assert conditions["NamesAccepted"] == "True"
    resources_listing = crds.kubectl("api-resources", f"--api-group={resources.GROUP}", "-o", "wide").stdout
    row = next(r for r in table(resources_listing) if r["NAME"] == plural)
    assert row["NAMESPACED"] == "false"
    assert row["CATEGORIES"] == "gpuhealth"
    assert row["SHORTNAMES"] in (resources.POLICY_SHORT, resources.GPUNODE_SHORT)


def test_default_policy_example_is_accepted_as_written(crds: local.ControlPlane) -> None:
    # Server-side dry run: full validation and defaulting, nothing stored, so the
    # example's real GPU selector cannot reach other tests' Nodes.
    written = yaml.safe_load(DEFAULT_POLICY.read_text())
    result = crds.kubectl(
        "apply", "--server-side", "--dry-run=server", "-o", "json", "-f", str(DEFAULT_POLICY)
    )
    stored = json.loads(result.stdout)
    assert stored["metadata"]["name"] == "default"
    spec = stored["spec"]
    for field in ("dryRun", "maxUnavailable", "recovery"):
        assert spec[field] == written["spec"][field], field
    # No selector: every Node with a GPUNode (the agent runs on the GPU nodes of every platform).
    assert "nodeSelector" not in written["spec"]
    assert "nodeSelector" not in spec
    assert {k: v for k, v in spec["drain"].items() if v is not None} == {
        "timeoutSeconds": 900,
        "deleteEmptyDirData": True,
        "force": False,
    }
    expected_rules = [{"forSeconds": 0, **r} for r in written["spec"]["rules"]]
    assert spec["rules"] == expected_rules


def test_defaults_fill_an_minimal_policy(crds: local.ControlPlane, policy_name: str) -> None:
    apply(crds, policy(policy_name))
    spec = get(crds, resources.POLICY_PLURAL, policy_name)["spec"]
    assert spec["dryRun"] is False
    assert spec["maxUnavailable"] == "10%"
    assert spec["rules"] == [{**ECC, "forSeconds": 0}]
    assert spec["drain"] == {"timeoutSeconds": 900, "deleteEmptyDirData": True, "force": False}
    assert spec["recovery"] == {"uncordon": True, "healthyForSeconds": 600}
    assert spec["breaker"] == {"maxNewUnhealthy": "5%", "windowSeconds": 600}
    assert spec["maxUnavailableGPUs"] == "10%"
    assert spec["isolation"] == {"maxGPUsPerNode": 2, "effect": "NoExecute"}


@pytest.mark.parametrize("value", [1, 7, "1%", "10%", "100%"])
def test_max_unavailable_accepts_counts_and_percentages(crds: local.ControlPlane, value: int | str) -> None:
    body = policy("crds-max-unavailable", maxUnavailable=value)
    stored = json.loads(apply(crds, body, "--dry-run=server", "-o", "json").stdout)
    assert stored["spec"]["maxUnavailable"] == value


def test_threshold_and_xids_may_be_left_to_their_defaults(crds: local.ControlPlane) -> None:
    # The operator then uses threshold 3.5 and the default critical XIDs (CRD descriptions).
    body = policy(
        "crds-rule-defaults",
        rules=[
            {"name": "xid", "condition": C.XID_CRITICAL, "action": A.DRAIN},
            {"name": "straggler", "condition": C.STRAGGLER, "action": A.LABEL},
        ],
    )
    stored = json.loads(apply(crds, body, "--dry-run=server", "-o", "json").stdout)
    assert [set(r) for r in stored["spec"]["rules"]] == [{"name", "condition", "action", "forSeconds"}] * 2


def test_agent_stale_may_record_and_label(crds: local.ControlPlane) -> None:
    body = policy(
        "crds-agent-stale",
        rules=[
            {"name": "stale-event", "condition": C.AGENT_STALE, "action": A.EVENT},
            {"name": "stale-label", "condition": C.AGENT_STALE, "action": A.LABEL, "forSeconds": 30},
        ],
    )
    apply(crds, body, "--dry-run=server")


# Server-side apply checks list keys and unknown fields while building its typed
# patch, before schema validation, and names list items by key rather than position.
SERVER_SIDE_FIELD = {
    "duplicate-rule-names": "spec.rules",
    "duplicate-xids": 'spec.rules[name="x"].xids',
    "typo-in-field-name": 'spec.rules[name="ecc"].forSecond',
    "repair-duplicate-step-names": "spec.repair.steps",
    "node-condition-kubelet-opt-in-word": 'spec.rules[name="k"].nodeCondition.allowKubeletCondition',
}


@pytest.mark.parametrize("server_side", [True, False], ids=["server-side", "client-side"])
@pytest.mark.parametrize(("case", "mutate", "field"), MALFORMED, ids=[case for case, _, _ in MALFORMED])
def test_malformed_policy_is_rejected_naming_the_field(
    crds: local.ControlPlane,
    k8s: client.ApiClient,
    policy_name: str,
    server_side: bool,
    case: str,
    mutate: Mutation,
    field: str,
) -> None:
    body = policy(policy_name)
    mutate(body["spec"])
    mode = ["--server-side"] if server_side else []
    result = crds.kubectl("apply", *mode, "-f", "-", input=json.dumps(body), check=False)
    assert result.returncode != 0, f"accepted: {json.dumps(body['spec'])}"
    expected = SERVER_SIDE_FIELD.get(case, field) if server_side else field
    assert names_field(result.stderr, expected), result.stderr
    assert not exists(k8s, resources.POLICY_PLURAL, policy_name), "a rejected policy must not be stored"


REPAIR = {
    "steps": [
        {"name": "reset", "action": "ResetGPU", "timeoutSeconds": 300},
        {"name": "reboot", "action": "RebootNode", "timeoutSeconds": 1800},
    ],
    "validation": {"timeoutSeconds": 900, "newNodes": True},
    "maxConcurrent": "10%",
    "maxAttempts": 3,
    "attemptWindowSeconds": 604800,
}


def test_repair_is_kept_as_written(crds: local.ControlPlane, policy_name: str) -> None:
    # Nothing of spec.repair may be pruned: the operator reads every field.
    apply(crds, policy(policy_name, repair=REPAIR))
    assert get(crds, resources.POLICY_PLURAL, policy_name)["spec"]["repair"] == REPAIR


def test_repair_defaults(crds: local.ControlPlane, policy_name: str) -> None:
    apply(crds, policy(policy_name, repair={"steps": [step()], "validation": {}}))
    stored = get(crds, resources.POLICY_PLURAL, policy_name)["spec"]
    # A step's timeout has no schema default: the operator picks 300 s for ResetGPU, 1800 s for RebootNode.
    assert stored["repair"] == {
        "steps": [{"name": "reset", "action": "ResetGPU"}],
        "validation": {"timeoutSeconds": 900, "newNodes": False},
        "maxConcurrent": 1,
        "maxAttempts": 3,
        "attemptWindowSeconds": 604800,
    }


def test_repair_is_absent_unless_written(crds: local.ControlPlane, policy_name: str) -> None:
    # Omitted spec.repair means no repair at all, so the schema must not default it into existence.
    apply(crds, policy(policy_name))
    assert "repair" not in get(crds, resources.POLICY_PLURAL, policy_name)["spec"]


@pytest.mark.parametrize("value", [1, 4, "1%", "25%", "100%"])
def test_repair_max_concurrent_accepts_counts_and_percentages(
    crds: local.ControlPlane, value: int | str
) -> None:
    body = policy("crds-repair-max-concurrent", repair={"steps": [step()], "maxConcurrent": value})
    stored = json.loads(apply(crds, body, "--dry-run=server", "-o", "json").stdout)
    assert stored["spec"]["repair"]["maxConcurrent"] == value


def test_rejected_update_leaves_the_stored_policy_whole(crds: local.ControlPlane, policy_name: str) -> None:
    apply(crds, policy(policy_name, maxUnavailable=2))
    bad = policy(
        policy_name,
        maxUnavailable=5,
        rules=[ECC, {"name": "stale", "condition": C.AGENT_STALE, "action": A.DRAIN}],
    )
    result = apply(crds, bad, check=False)
    assert result.returncode != 0
    assert "spec.rules[1].action" in result.stderr
    spec = get(crds, resources.POLICY_PLURAL, policy_name)["spec"]
    assert spec["maxUnavailable"] == 2
    assert [r["name"] for r in spec["rules"]] == ["ecc"]


def test_every_condition_and_action_of_the_vocabulary_is_accepted(crds: local.ControlPlane) -> None:
    rules = []
    for condition in conditions.RULE_CONDITIONS:  # no rule names AgentError or GPUOperatorMaintenance
        for action in vocabulary.Action:
            if condition == C.AGENT_STALE and action not in (A.EVENT, A.LABEL):
                continue
            if action == A.ISOLATE_GPU and condition not in conditions.PER_GPU_CONDITIONS:
                continue
            extra: dict[str, Any] = {}
            if condition == C.STRAGGLER:
                extra["threshold"] = 3.5
            if condition in (C.NVLINK_DEGRADED, C.NIC_DEGRADED, C.PCIE_ERRORS, C.MEMORY_DEGRADING):
                extra["threshold"] = 0  # growth per hour: 0 is any growth
            if condition == C.XID_CRITICAL:
                extra["xids"] = [79]
            name = f"{condition.lower()}-{action.lower()}"
            rules.append({"name": name, "condition": condition.value, "action": action.value, **extra})
    rules.append({"name": "kernel-deadlock", "nodeCondition": {"type": "KernelDeadlock"}, "action": A.DRAIN})
    rules.append(
        {
            "name": "not-ready",
            "nodeCondition": {"type": "Ready", "status": "False", "allowKubeletCondition": True},
            "action": A.TAINT,
        }
    )
    # Every action but IsolateGPU on each rule condition, IsolateGPU on the per-GPU ones, AgentStale with
    # Event and Label only, and the two nodeCondition rules: a new condition or action is counted in.
    acting = len(vocabulary.Action) - 1
    expected = (len(conditions.RULE_CONDITIONS) - 1) * acting + len(conditions.PER_GPU_CONDITIONS) + 2 + 2
    assert len(rules) == expected
    for first in range(0, len(rules), 32):
        apply(crds, policy("crds-vocabulary", rules=rules[first : first + 32]), "--dry-run=server")


KUBELET_CONDITIONS = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"]


@pytest.mark.parametrize("kind", KUBELET_CONDITIONS)
def test_a_kubelet_condition_needs_the_explicit_opt_in(crds: local.ControlPlane, kind: str) -> None:
    # Kubelet's own conditions flip fleet-wide on an API server or network blip: a rule on them takes
    # every selected node out at once, so the policy must say it means it (issue 45 item 11).
    body = policy("crds-kubelet", rules=[{"name": "k", "nodeCondition": {"type": kind}, "action": A.DRAIN}])
    refused = apply(crds, body, "--dry-run=server", check=False)
    assert refused.returncode != 0, "a kubelet condition without the opt-in was accepted"
    assert "spec.rules[0].nodeCondition.type" in refused.stderr, refused.stderr
    assert f"{kind} is kubelet's own Node condition" in refused.stderr, refused.stderr
    assert "allowKubeletCondition: true" in refused.stderr, refused.stderr
    body["spec"]["rules"][0]["nodeCondition"]["allowKubeletCondition"] = True
    apply(crds, body, "--dry-run=server")


def test_the_opt_in_is_kept_and_another_tools_condition_needs_none(
    crds: local.ControlPlane, policy_name: str
) -> None:
    rules = [
        {"name": "deadlock", "nodeCondition": {"type": "KernelDeadlock"}, "action": A.DRAIN},
        {
            "name": "pressure",
            "nodeCondition": {"type": "MemoryPressure", "allowKubeletCondition": True},
            "action": A.LABEL,
        },
    ]
    apply(crds, policy(policy_name, rules=rules))
    stored = get(crds, resources.POLICY_PLURAL, policy_name)["spec"]["rules"]
    assert stored[1]["nodeCondition"] == {
        "type": "MemoryPressure",
        "status": "True",
        "allowKubeletCondition": True,
    }
    assert "allowKubeletCondition" not in stored[0]["nodeCondition"]


# A GPUNode as the agent reports it: GPU 3 of two has a double-bit ECC error.
def agent_status(temperature: int, heartbeat: str) -> dict[str, Any]:
    gpus = [
        {
            "index": index,
            "uuid": f"GPU-0000000{index}-1111-2222-3333-444444444444",
            "model": MODEL,
            "pciBusId": f"00000000:{0x17 + index:02X}:00.0",
            "serial": f"165322000000{index}",
            "temperatureCelsius": temperature - index,
            "slowdownTemperatureCelsius": 87,
            "powerWatts": 301.5,
            "powerLimitWatts": 700.0,
            "smClockMHz": 1980,
            "maxSmClockMHz": 1980,
            "utilizationPercent": 95,
            "memoryUsedMiB": 40000,
            "memoryTotalMiB": 81559,
            "ecc": {
                "correctedVolatile": 0,
                "uncorrectedVolatile": index,
                "correctedAggregate": 2,
                "uncorrectedAggregate": index,
            },
            "retiredPages": {"doubleBit": 0, "pending": False},
            "remappedRows": {"correctable": 0, "uncorrectable": index, "pending": False, "failure": False},
            "xids": [{"code": 48, "count": 1, "lastSeen": heartbeat}] if index else [],
            "clockEventReasons": [],
            "recoveryAction": vocabulary.RecoveryAction.NONE,
            "pcie": {"generation": 5, "maxGeneration": 5, "width": 16, "maxWidth": 16, "replayCounter": 0},
            "lost": False,
            "observedTime": heartbeat,
        }
        for index in range(2)
    ]
    return {
        "agent": {
            "version": "0.1.0",
            "backend": "sim",
            "driverVersion": DRIVER,
            "lastHeartbeatTime": heartbeat,
            "heartbeatSeconds": 60,
            "expectedGpuCount": 2,
        },
        "summary": {"gpuCount": 2, "model": MODEL, "maxTemperatureCelsius": temperature},
        "gpus": gpus,
    }


def operator_status(since: str) -> dict[str, Any]:
    return {
        "health": vocabulary.Health.UNHEALTHY,
        "issues": f"{C.ECC_UNCORRECTABLE},{C.XID_CRITICAL}",
        "action": vocabulary.NodeAction.DRAINED,
        "conditions": [
            {
                "type": C.ECC_UNCORRECTABLE,
                "status": "True",
                "reason": "UncorrectedVolatileEcc",
                "message": "GPU 1: 1 uncorrected volatile ECC error",
                "lastTransitionTime": since,
                "observedGeneration": 1,
                "observedSince": since,
            },
            {
                "type": C.XID_CRITICAL,
                "status": "True",
                "reason": "Xid48",
                "message": "GPU 1: XID 48",
                "lastTransitionTime": since,
                "observedGeneration": 1,
                "observedSince": since,
            },
            {
                "type": C.THERMAL_THROTTLED,
                "status": "False",
                "reason": "NotThrottled",
                "message": "",
                "lastTransitionTime": since,
                "observedGeneration": 1,
                "recoveringSince": since,
            },
        ],
        "straggler": {"score": 0.98, "zScore": -0.4, "peers": 6},
    }


def apply_status(k8s: client.ApiClient, name: str, manager: str, status: dict[str, Any]) -> dict[str, Any]:
    body = {"apiVersion": resources.API_VERSION, "kind": resources.GPUNODE_KIND, "metadata": {"name": name}}
    result = client.CustomObjectsApi(k8s).patch_cluster_custom_object_status(
        resources.GROUP,
        resources.VERSION,
        resources.GPUNODE_PLURAL,
        name,
        {**body, "status": status},
        field_manager=manager,
        force=True,
        _content_type=APPLY,
    )
    assert isinstance(result, dict)
    return result


def owned_status_fields(gpunode: dict[str, Any], manager: str) -> set[str]:
    """Top-level status fields a field manager owns, from managedFields."""
    owned: set[str] = set()
    for entry in gpunode["metadata"]["managedFields"]:
        if entry["manager"] == manager and entry.get("subresource") == "status":
            owned |= {k.removeprefix("f:") for k in entry["fieldsV1"].get("f:status", {}) if k != "."}
    return owned


def create_gpunode(cp: local.ControlPlane, name: str) -> None:
    body = {"apiVersion": resources.API_VERSION, "kind": resources.GPUNODE_KIND, "metadata": {"name": name}}
    apply(cp, body, f"--field-manager={resources.AGENT_FIELD_MANAGER}")


def test_agent_and_operator_status_merge_and_print(
    crds: local.ControlPlane, k8s: client.ApiClient, gpunode_name: str
) -> None:
    create_gpunode(crds, gpunode_name)
    since = now()
    apply_status(k8s, gpunode_name, resources.AGENT_FIELD_MANAGER, agent_status(51, since))
    apply_status(k8s, gpunode_name, resources.OPERATOR_FIELD_MANAGER, operator_status(since))
    # The agent's next report carries only its own fields and must not wipe the operator's.
    heartbeat = now()
    apply_status(k8s, gpunode_name, resources.AGENT_FIELD_MANAGER, agent_status(53, heartbeat))

    stored = get(crds, resources.GPUNODE_PLURAL, gpunode_name)
    assert stored["status"] == {**agent_status(53, heartbeat), **operator_status(since)}
    assert owned_status_fields(stored, resources.AGENT_FIELD_MANAGER) == {"agent", "summary", "gpus"}
    assert owned_status_fields(stored, resources.OPERATOR_FIELD_MANAGER) == {
        "health",
        "issues",
        "action",
        "conditions",
        "straggler",
    }

    plain = crds.kubectl("get", resources.GPUNODE_PLURAL, gpunode_name).stdout
    assert header(plain) == ["NAME", "GPUS", "MODEL", "HEALTH", "ISSUES", "ACTION", "MAXTEMP", "AGE"]
    (row,) = table(plain)
    assert {k: v for k, v in row.items() if k != "AGE"} == {
        "NAME": gpunode_name,
        "GPUS": "2",
        "MODEL": MODEL,
        "HEALTH": "Unhealthy",
        "ISSUES": "EccUncorrectable,XidCritical",
        "ACTION": "Drained",
        "MAXTEMP": "53",
    }
    assert re.fullmatch(r"\d+[smhd]", row["AGE"]), row

    wide = crds.kubectl("get", resources.GPUNODE_SHORT, gpunode_name, "-o", "wide").stdout
    assert header(wide) == [*header(plain), "DRIVER", "HEARTBEAT", "ISOLATED"]
    (wide_row,) = table(wide)
    assert wide_row["DRIVER"] == DRIVER
    assert re.fullmatch(r"\d+[smhd]", wide_row["HEARTBEAT"]), wide_row


def test_operator_update_keeps_agent_facts_and_drops_its_own_stale_conditions(
    crds: local.ControlPlane, k8s: client.ApiClient, gpunode_name: str
) -> None:
    create_gpunode(crds, gpunode_name)
    since = now()
    apply_status(k8s, gpunode_name, resources.AGENT_FIELD_MANAGER, agent_status(60, since))
    apply_status(k8s, gpunode_name, resources.OPERATOR_FIELD_MANAGER, operator_status(since))
    recovered = copy.deepcopy(operator_status(since))
    recovered.update(health=vocabulary.Health.HEALTHY, issues="", action=vocabulary.NodeAction.NONE)
    recovered["conditions"] = recovered["conditions"][2:]
    apply_status(k8s, gpunode_name, resources.OPERATOR_FIELD_MANAGER, recovered)

    stored = get(crds, resources.GPUNODE_PLURAL, gpunode_name)["status"]
    assert [c["type"] for c in stored["conditions"]] == ["ThermalThrottled"]
    assert stored["health"] == "Healthy"
    assert stored["gpus"] == agent_status(60, since)["gpus"]


@pytest.mark.parametrize(
    ("status", "field"),
    [
        ({"health": "Broken"}, "status.health"),
        ({"action": "Rebooted"}, "status.action"),
        ({"conditions": [{"type": "GPULost", "status": "Yes"}]}, "status.conditions[0].status"),
        ({"gpus": [{"index": 0, "xids": [{"code": 79}]}]}, "status.gpus[0].xids[0].count"),
        ({"agent": {"heartbeatSeconds": 601}}, "status.agent.heartbeatSeconds"),
        ({"repairs": [{"time": "2026-11-26T10:00:00Z", "result": "Done"}]}, "status.repairs[0].result"),
        ({"repairs": [{"time": "2026-11-26T10:00:00Z", "result": "Started"}] * 21}, "status.repairs"),
        ({"repairs": [{"time": "yesterday", "result": "Started"}]}, "status.repairs[0].time"),
    ],
    ids=[
        "health",
        "action",
        "condition-status",
        "xid-without-count",
        "heartbeat-beyond-600s",
        "repair-result",
        "repairs-beyond-20",
        "repair-time",
    ],
)
def test_malformed_gpunode_status_is_rejected_naming_the_field(
    crds: local.ControlPlane,
    k8s: client.ApiClient,
    gpunode_name: str,
    status: dict[str, Any],
    field: str,
) -> None:
    create_gpunode(crds, gpunode_name)
    with pytest.raises(client.ApiException) as rejected:
        apply_status(k8s, gpunode_name, resources.OPERATOR_FIELD_MANAGER, status)
    assert rejected.value.status == 422
    assert names_field(str(rejected.value.body), field), rejected.value.body


REPAIRS = [
    {
        "time": "2026-11-26T10:00:00Z",
        "cycle": 1,
        "step": "reset",
        "action": "ResetGPU",
        "gpus": ["GPU-3f1c2a9e-0000-4000-8000-000000000003"],
        "result": "Started",
        "message": "step reset (ResetGPU) on GPU 3",
    },
    {
        "time": "2026-11-26T10:00:40Z",
        "cycle": 1,
        "step": "reset",
        "action": "Validation",
        "gpus": ["GPU-3f1c2a9e-0000-4000-8000-000000000003"],
        "result": "ValidationFailed",
        "message": "dcgmi diag -r 2 exited 226",
    },
    {"time": "2026-11-26T10:01:00Z", "cycle": 1, "result": "Retired", "message": "no step left"},
]


@pytest.mark.parametrize("action", ["Repairing", "Validating", "Retired"])
def test_repair_status_is_kept_and_printed(
    crds: local.ControlPlane, k8s: client.ApiClient, gpunode_name: str, action: str
) -> None:
    create_gpunode(crds, gpunode_name)
    apply_status(k8s, gpunode_name, resources.OPERATOR_FIELD_MANAGER, {"action": action, "repairs": REPAIRS})
    stored = get(crds, resources.GPUNODE_PLURAL, gpunode_name)["status"]
    assert stored == {"action": action, "repairs": REPAIRS}
    (row,) = table(crds.kubectl("get", resources.GPUNODE_PLURAL, gpunode_name).stdout)
    assert row["ACTION"] == action


def test_policy_columns(crds: local.ControlPlane, k8s: client.ApiClient, policy_name: str) -> None:
    apply(crds, policy(policy_name, dryRun=True))
    client.CustomObjectsApi(k8s).patch_cluster_custom_object_status(
        resources.GROUP,
        resources.VERSION,
        resources.POLICY_PLURAL,
        policy_name,
        {
            "apiVersion": resources.API_VERSION,
            "kind": resources.POLICY_KIND,
            "metadata": {"name": policy_name},
            "status": {
                "observedGeneration": 1,
                "selectedNodes": 12,
                "unhealthyNodes": 3,
                "cordonedNodes": 1,
                "pendingNodes": 2,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "Reconciled",
                        "message": "judging 12 nodes",
                        "lastTransitionTime": now(),
                        "observedGeneration": 1,
                    },
                    {
                        "type": "Paused",
                        "status": "True",
                        "reason": "FaultStorm",
                        "message": "3 selected GPU nodes turned Unhealthy in the last 10 min",
                        "lastTransitionTime": now(),
                    },
                ],
            },
        },
        field_manager=resources.OPERATOR_FIELD_MANAGER,
        force=True,
        _content_type=APPLY,
    )
    output = crds.kubectl("get", resources.POLICY_SHORT, policy_name).stdout
    assert header(output) == [
        "NAME",
        "SELECTED",
        "UNHEALTHY",
        "CORDONED",
        "PENDING",
        "PAUSED",
        "DEGRADED",
        "DRYRUN",
        "AGE",
    ]
    (row,) = table(output)
    assert {k: v for k, v in row.items() if k != "AGE"} == {
        "NAME": policy_name,
        "SELECTED": "12",
        "UNHEALTHY": "3",
        "CORDONED": "1",
        "PENDING": "2",
        "PAUSED": "True",
        "DEGRADED": "",  # no degraded domain: kubectl prints an empty cell
        "DRYRUN": "true",
    }


def test_category_lists_both_kinds(crds: local.ControlPlane, policy_name: str, gpunode_name: str) -> None:
    apply(crds, policy(policy_name))
    create_gpunode(crds, gpunode_name)
    listing = crds.kubectl("get", "gpuhealth", "-o", "name").stdout.split()
    assert f"{resources.POLICY_KIND.lower()}.{resources.GROUP}/{policy_name}" in listing
    assert f"{resources.GPUNODE_KIND.lower()}.{resources.GROUP}/{gpunode_name}" in listing
