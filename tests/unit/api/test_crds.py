"""The CRD manifests agree with the contract in gpuhealth_api and document every field.

No cluster: these read crds/*.yaml. What the API server does with them (CEL,
defaults, printer columns as printed) is tested in tests/integration/test_crds.py.
"""

import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth_api import conditions, gpu_uuids, keys, resources, status, vocabulary

ROOT = Path(__file__).resolve().parents[3]
POLICY_CRD = ROOT / "crds" / "gpuhealth.io_gpuhealthpolicies.yaml"
GPUNODE_CRD = ROOT / "crds" / "gpuhealth.io_gpunodes.yaml"

# Condition fields our operator keeps beyond metav1.Condition, for hysteresis across restarts.
CONDITION_EXTRAS = {"observedSince", "recoveringSince"}


def load(path: Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict)
    return document


def only_version(crd: dict[str, Any]) -> dict[str, Any]:
    versions = crd["spec"]["versions"]
    assert len(versions) == 1
    version = versions[0]
    assert isinstance(version, dict)
    return version


def schema_of(crd: dict[str, Any]) -> dict[str, Any]:
    schema = only_version(crd)["schema"]["openAPIV3Schema"]
    assert isinstance(schema, dict)
    return schema


def walk(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with its dotted path: properties, list items, map values."""
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}")
    if "items" in schema:
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}{{}}")


def at(schema: dict[str, Any], dotted: str) -> dict[str, Any]:
    """The schema node at a path like "spec.rules[].condition"."""
    node = schema
    for part in dotted.split("."):
        node = node["properties"][part.removesuffix("[]")]
        if part.endswith("[]"):
            node = node["items"]
    return node


def columns(crd: dict[str, Any]) -> list[tuple[str, str, str, int]]:
    return [
        (c["name"].upper(), c["jsonPath"], c["type"], c.get("priority", 0))
        for c in only_version(crd)["additionalPrinterColumns"]
    ]


@pytest.mark.parametrize("path", [POLICY_CRD, GPUNODE_CRD], ids=lambda p: p.name)
def test_every_field_has_a_description(path: Path) -> None:
    schema = schema_of(load(path))
    # The API server owns metadata's schema and rejects a CRD that says anything about it.
    assert schema["properties"]["metadata"] == {"type": "object"}
    missing = [
        where
        for where, node in walk(schema, "")
        if where != ".metadata" and not node.get("description", "").strip()
    ]
    assert missing == []


@pytest.mark.parametrize(
    ("path", "kind", "plural", "short"),
    [
        (POLICY_CRD, resources.POLICY_KIND, resources.POLICY_PLURAL, resources.POLICY_SHORT),
        (GPUNODE_CRD, resources.GPUNODE_KIND, resources.GPUNODE_PLURAL, resources.GPUNODE_SHORT),
    ],
    ids=["policy", "gpunode"],
)
def test_names_scope_and_version_follow_the_contract(path: Path, kind: str, plural: str, short: str) -> None:
    crd = load(path)
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"]["name"] == f"{plural}.{resources.GROUP}"
    assert path.name == f"{resources.GROUP}_{plural}.yaml"
    spec = crd["spec"]
    assert spec["group"] == resources.GROUP
    assert spec["scope"] == "Cluster"
    assert spec["names"]["kind"] == kind
    assert spec["names"]["plural"] == plural
    assert spec["names"]["shortNames"] == [short]
    assert spec["names"]["categories"] == ["gpuhealth"]
    version = only_version(crd)
    assert (version["name"], version["served"], version["storage"]) == (resources.VERSION, True, True)
    assert version["subresources"] == {"status": {}}


def test_policy_condition_and_action_enums_are_the_vocabulary() -> None:
    schema = schema_of(load(POLICY_CRD))
    assert at(schema, "spec.rules[].condition")["enum"] == [c.value for c in conditions.RULE_CONDITIONS]
    assert at(schema, "spec.rules[].action")["enum"] == [a.value for a in vocabulary.Action]


def test_gpunode_health_and_action_enums_are_the_vocabulary() -> None:
    schema = schema_of(load(GPUNODE_CRD))
    assert at(schema, "status.health")["enum"] == [h.value for h in vocabulary.Health]
    assert at(schema, "status.action")["enum"] == [a.value for a in vocabulary.NodeAction]
    assert at(schema, "status.conditions[].status")["enum"] == ["True", "False", "Unknown"]
    assert at(schema, "status.repairs[].result")["enum"] == [r.value for r in vocabulary.RepairResult]


def test_repair_step_actions_are_the_vocabulary() -> None:
    schema = schema_of(load(POLICY_CRD))
    assert at(schema, "spec.repair.steps[].action")["enum"] == [a.value for a in vocabulary.RepairAction]


def test_cel_rules_only_name_conditions_and_actions_of_the_vocabulary() -> None:
    # CEL rules spell names as string literals; a rename in vocabulary must not leave them stale.
    names = {c.value for c in vocabulary.Condition} | {a.value for a in vocabulary.Action}
    rules = [
        rule["rule"]
        for _, node in walk(schema_of(load(POLICY_CRD)), "")
        for rule in node.get("x-kubernetes-validations", [])
    ]
    assert rules
    quoted = {word for rule in rules for word in rule.split("'")[1::2]}
    # Besides names: selector operators, the percent pattern, the '/' of a label key's prefix, and our own
    # Node condition (which a nodeCondition rule may not name), and kubelet's own (which need the opt-in).
    names |= set(vocabulary.KUBELET_NODE_CONDITIONS)
    assert quoted - {"In", "NotIn", "^(100|[1-9][0-9]?)%$", "/", keys.NODE_CONDITION_TYPE} <= names


def test_every_cel_rule_has_a_message_naming_its_field() -> None:
    for schema in (schema_of(load(POLICY_CRD)), schema_of(load(GPUNODE_CRD))):
        for where, node in walk(schema, ""):
            for rule in node.get("x-kubernetes-validations", []):
                field = rule.get("fieldPath", where).rstrip("[]").rsplit(".", 1)[-1]
                assert field in rule.get("message", rule.get("messageExpression", "")), (where, rule)


def test_an_agents_gpu_uuid_must_be_of_nvmls_form() -> None:
    """Issue 45, item 9: the UUIDs reach a privileged Job's environment; the API server refuses other text."""
    assert at(schema_of(load(GPUNODE_CRD)), "status.gpus[].uuid")["pattern"] == gpu_uuids.PATTERN
    assert gpu_uuids.is_valid("GPU-3f1c2a9e-0000-4000-8000-000000000003")
    assert gpu_uuids.is_valid("MIG-3f1c2a9e-0000-4000-8000-000000000003")
    for bad in ("GPU-1;nsenter -t 1 sh", "GPU-3f1c2a9e-0000-4000-8000-000000000003\n", "GPU-1", "", None):
        assert not gpu_uuids.is_valid(bad), bad


def test_gpunode_printer_columns() -> None:
    assert columns(load(GPUNODE_CRD)) == [
        ("GPUS", ".status.summary.gpuCount", "integer", 0),
        ("MODEL", ".status.summary.model", "string", 0),
        ("HEALTH", ".status.health", "string", 0),
        ("ISSUES", ".status.issues", "string", 0),
        ("ACTION", ".status.action", "string", 0),
        ("MAXTEMP", ".status.summary.maxTemperatureCelsius", "integer", 0),
        ("AGE", ".metadata.creationTimestamp", "date", 0),
        ("DRIVER", ".status.agent.driverVersion", "string", 1),
        ("HEARTBEAT", ".status.agent.lastHeartbeatTime", "date", 1),
        ("ISOLATED", ".status.isolatedFraction", "string", 1),
    ]


def test_policy_printer_columns() -> None:
    assert columns(load(POLICY_CRD)) == [
        ("SELECTED", ".status.selectedNodes", "integer", 0),
        ("UNHEALTHY", ".status.unhealthyNodes", "integer", 0),
        ("CORDONED", ".status.cordonedNodes", "integer", 0),
        ("PENDING", ".status.pendingNodes", "integer", 0),
        ("PAUSED", '.status.conditions[?(@.type=="Paused")].status', "string", 0),
        ("DEGRADED", ".status.topology.degraded[*].value", "string", 0),
        ("ATBUDGET", ".status.topology.atBudget[*].value", "string", 1),
        ("DRYRUN", ".spec.dryRun", "boolean", 0),
        ("AGE", ".metadata.creationTimestamp", "date", 0),
    ]


def test_policy_defaults() -> None:
    schema = schema_of(load(POLICY_CRD))
    defaults = {
        "spec.dryRun": False,
        "spec.maxUnavailable": "10%",
        "spec.rules[].forSeconds": 0,
        "spec.drain": {},
        "spec.drain.timeoutSeconds": 900,
        "spec.drain.deleteEmptyDirData": True,
        "spec.recovery": {},
        "spec.recovery.uncordon": True,
        "spec.recovery.healthyForSeconds": 600,
        "spec.breaker": {},
        "spec.breaker.maxNewUnhealthy": "5%",
        "spec.breaker.windowSeconds": 600,
    }
    assert {path: at(schema, path).get("default") for path in defaults} == defaults
    assert at(schema, "spec.drain.gracePeriodSeconds").get("nullable") is True
    assert "default" not in at(schema, "spec.drain.gracePeriodSeconds")


def test_lists_merge_by_key_so_two_field_managers_can_apply() -> None:
    gpunode = schema_of(load(GPUNODE_CRD))
    policy = schema_of(load(POLICY_CRD))
    keyed = {
        "status.gpus": (gpunode, ["index"]),
        "status.gpus[].xids": (gpunode, ["code"]),
        "status.conditions": (gpunode, ["type"]),
        "spec.rules": (policy, ["name"]),
        "status.conditions ": (policy, ["type"]),
    }
    for path, (schema, map_keys) in keyed.items():
        node = at(schema, path.strip())
        assert node["x-kubernetes-list-type"] == "map", path
        assert node["x-kubernetes-list-map-keys"] == map_keys, path
        assert set(map_keys) <= set(node["items"]["required"]), path


def python_fields(shape: Any) -> dict[str, Any]:
    """Field name → type of a status.py TypedDict."""
    return typing.get_type_hints(shape)


def schema_type(annotation: Any) -> str:
    if annotation is bool:
        return "boolean"
    if annotation is int:
        return "integer"
    if annotation is float:
        return "number"
    if annotation is str:
        return "string"
    if typing.get_origin(annotation) is list:
        return "array"
    if isinstance(annotation, type) and issubclass(annotation, dict):
        return "object"
    if typing.get_origin(annotation) is dict:  # a map (status.checks[].figures)
        return "object"
    raise AssertionError(f"no schema type for {annotation!r}")


def compare(shape: Any, schema: dict[str, Any], where: str, extras: dict[str, set[str]]) -> list[str]:
    """Differences between a status.py TypedDict and the CRD schema node for it."""
    problems = []
    fields = python_fields(shape)
    properties = schema.get("properties", {})
    unexpected = set(properties) - set(fields) - extras.get(where, set())
    problems += [f"{where}.{name}: in the CRD, not in status.py" for name in sorted(unexpected)]
    for name, annotation in fields.items():
        path = f"{where}.{name}"
        if name not in properties:
            problems.append(f"{path}: in status.py, not in the CRD")
            continue
        node = properties[name]
        expected = schema_type(annotation)
        if node.get("type") != expected:
            problems.append(f"{path}: CRD type {node.get('type')}, status.py {expected}")
        elif expected == "object" and typing.get_origin(annotation) is dict:
            (_, value) = typing.get_args(annotation)
            if node["additionalProperties"].get("type") != schema_type(value):
                problems.append(f"{path}{{}}: CRD type of values is not status.py's {schema_type(value)}")
        elif expected == "object":
            problems += compare(annotation, node, path, extras)
        elif expected == "array":
            (item,) = typing.get_args(annotation)
            if isinstance(item, type) and issubclass(item, dict):
                problems += compare(item, node["items"], f"{path}[]", extras)
            elif node["items"].get("type") != schema_type(item):
                problems.append(
                    f"{path}[]: CRD type {node['items'].get('type')}, status.py {schema_type(item)}"
                )
    return problems


def test_gpunode_status_schema_matches_status_py() -> None:
    schema = at(schema_of(load(GPUNODE_CRD)), "status")
    assert compare(status.GPUNodeStatus, schema, "status", {"status.conditions[]": CONDITION_EXTRAS}) == []


def test_gpunode_has_no_spec() -> None:
    # Everything on a GPUNode is observed state; a spec would invite edits nobody reads.
    assert "spec" not in schema_of(load(GPUNODE_CRD))["properties"]


def test_timestamps_are_date_times() -> None:
    schema = schema_of(load(GPUNODE_CRD))
    for path in (
        "status.agent.lastHeartbeatTime",
        "status.gpus[].observedTime",
        "status.gpus[].throttledSince",
        "status.gpus[].xids[].lastSeen",
        "status.conditions[].lastTransitionTime",
        "status.repairs[].time",
        *(f"status.conditions[].{extra}" for extra in sorted(CONDITION_EXTRAS)),
    ):
        assert at(schema, path)["format"] == "date-time", path
