"""spec.topology as the API server validates it: a bad budget or domain is rejected naming the field.

Policies here select only a label no Node has (objects are cluster-scoped in a shared cluster).
"""

import json
import re
from typing import Any

import pytest
from kubernetes import client

from gpuhealth_api import resources, vocabulary
from gpuhealth_operator.decisions import policies
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

SELECTOR_LABEL = "gpuhealth.io/test-topology-crd"
RULES = [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}]


def body(name: str, topology: object) -> dict[str, Any]:
    return {
        "apiVersion": resources.API_VERSION,
        "kind": resources.POLICY_KIND,
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"matchLabels": {SELECTOR_LABEL: name}},
            "rules": RULES,
            "topology": topology,
        },
    }


def budget(key: str = "example.com/rack", max_unavailable: object = 1) -> dict[str, object]:
    return {"key": key, "maxUnavailable": max_unavailable}


def domain(
    key: str = "nvidia.com/gpu.clique", unhealthy: object = "50%", **extra: object
) -> dict[str, object]:
    return {"key": key, "unhealthy": unhealthy, **extra}


# (id, spec.topology, the field the error must name)
MALFORMED: list[tuple[str, object, str]] = [
    ("budgets-not-a-list", {"budgets": budget()}, "spec.topology.budgets.key"),
    ("budget-without-key", {"budgets": [{"maxUnavailable": 1}]}, "spec.topology.budgets[0].key"),
    ("budget-key-with-space", {"budgets": [budget("my rack")]}, "spec.topology.budgets[0].key"),
    ("budget-key-two-slashes", {"budgets": [budget("a/b/c")]}, "spec.topology.budgets[0].key"),
    ("budget-key-name-too-long", {"budgets": [budget("x" * 64)]}, "spec.topology.budgets[0].key"),
    (
        "budget-key-prefix-too-long",
        {"budgets": [budget("a" * 254 + "/rack")]},
        "spec.topology.budgets[0].key",
    ),
    ("budget-without-max", {"budgets": [{"key": "rack"}]}, "spec.topology.budgets[0].maxUnavailable"),
    ("budget-zero", {"budgets": [budget(max_unavailable=0)]}, "spec.topology.budgets[0].maxUnavailable"),
    (
        "budget-0-percent",
        {"budgets": [budget(max_unavailable="0%")]},
        "spec.topology.budgets[0].maxUnavailable",
    ),
    ("budget-word", {"budgets": [budget(max_unavailable="one")]}, "spec.topology.budgets[0].maxUnavailable"),
    ("budget-duplicate-key", {"budgets": [budget(), budget(max_unavailable=2)]}, "spec.topology.budgets[1]"),
    (
        "budgets-too-many",
        {"budgets": [budget(f"k{i}") for i in range(policies.MAX_TOPOLOGY_ENTRIES + 1)]},
        "spec.topology.budgets",
    ),
    ("domain-without-unhealthy", {"domains": [{"key": "rack"}]}, "spec.topology.domains[0].unhealthy"),
    ("domain-150-percent", {"domains": [domain(unhealthy="150%")]}, "spec.topology.domains[0].unhealthy"),
    ("domain-drain", {"domains": [domain(action="Drain")]}, "spec.topology.domains[0].action"),
    ("domain-bad-key", {"domains": [domain("-rack")]}, "spec.topology.domains[0].key"),
    ("domain-duplicate-key", {"domains": [domain(), domain(unhealthy=3)]}, "spec.topology.domains[1]"),
    ("topology-typo", {"budget": [budget()]}, "spec.topology.budget"),
]

PRUNED = {"topology-typo"}
OPERATOR_FIELD = {
    "budgets-not-a-list": "spec.topology.budgets:",
    "budget-duplicate-key": "spec.topology.budgets[1].key",
    "domain-duplicate-key": "spec.topology.domains[1].key",
}


def names_field(message: str, field: str) -> bool:
    """Whether an error message names exactly this field (not only a parent or child of it)."""
    return re.search(rf"(?:^|[^\w.\]])\.?{re.escape(field)}(?![\w.\[])", message) is not None


def exists(k8s: client.ApiClient, name: str) -> bool:
    try:
        client.CustomObjectsApi(k8s).get_cluster_custom_object(
            resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, name
        )
    except client.ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


@pytest.mark.parametrize(("case", "topology", "field"), MALFORMED, ids=[case for case, _, _ in MALFORMED])
def test_a_bad_topology_is_rejected_naming_the_field(
    crds: local.ControlPlane, k8s: client.ApiClient, case: str, topology: object, field: str
) -> None:
    name = f"topo-crd-{case}"
    result = crds.kubectl("apply", "-f", "-", input=json.dumps(body(name, topology)), check=False)
    assert result.returncode != 0, f"accepted: {json.dumps(topology)}"
    assert names_field(result.stderr, field), result.stderr
    assert not exists(k8s, name), "a rejected policy must not be stored"
    if case in PRUNED:
        return  # the API server's decoder refuses it; the operator never sees the unknown field
    with pytest.raises(ValueError, match=re.escape(OPERATOR_FIELD.get(case, field))):  # the operator agrees
        policies.parse_policy(name, 1, body(name, topology)["spec"])


def test_a_good_topology_is_stored_as_written_and_parses(crds: local.ControlPlane) -> None:
    topology = {
        "budgets": [
            budget("example.com/rack", 1),
            budget("topology.kubernetes.io/zone", "25%"),
            budget("nvidia.com/gpu.clique", 2),
        ],
        "domains": [domain(), domain("example.com/rack", 3, action="Taint")],
    }
    result = crds.kubectl(
        "apply", "--server-side", "--dry-run=server", "-o", "json", "-f", "-",
        input=json.dumps(body("topo-crd-good", topology)),
    )  # fmt: skip
    stored = json.loads(result.stdout)["spec"]["topology"]
    assert stored["budgets"] == topology["budgets"]
    assert stored["domains"] == [{**domain(), "action": "Label"}, topology["domains"][1]]  # action's default
    parsed = policies.parse_policy("topo-crd-good", 1, json.loads(result.stdout)["spec"]).topology
    assert [(b.key, b.max_unavailable) for b in parsed.budgets] == [
        ("example.com/rack", 1),
        ("topology.kubernetes.io/zone", "25%"),
        ("nvidia.com/gpu.clique", 2),
    ]
    assert [(d.key, d.unhealthy, d.action) for d in parsed.domains] == [
        ("nvidia.com/gpu.clique", "50%", vocabulary.Action.LABEL),
        ("example.com/rack", 3, vocabulary.Action.TAINT),
    ]
