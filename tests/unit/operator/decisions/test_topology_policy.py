"""spec.topology: parsing budgets and domains into the typed model, resolving a domain's budget."""

import pytest

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import model, policies

RULES = [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}]


def parse(topology: object) -> model.Topology:
    return policies.parse_policy("p", 1, {"rules": RULES, "topology": topology}).topology


def test_no_topology_is_empty() -> None:
    assert policies.parse_policy("p", 1, {"rules": RULES}).topology == model.Topology()
    assert model.Topology().budgets == ()
    assert model.Topology().domains == ()
    assert parse({}) == model.Topology()


def test_budgets_and_domains_parse_in_order() -> None:
    topology = parse(
        {
            "budgets": [
                {"key": "example.com/rack", "maxUnavailable": 1},
                {"key": "topology.kubernetes.io/zone", "maxUnavailable": "25%"},
                {"key": "nvidia.com/gpu.clique", "maxUnavailable": "2"},
            ],
            "domains": [
                {"key": "nvidia.com/gpu.clique", "unhealthy": "50%", "action": "Taint"},
                {"key": "rack", "unhealthy": 3},
            ],
        }
    )
    assert topology.budgets == (
        model.TopologyBudget(key="example.com/rack", max_unavailable=1),
        model.TopologyBudget(key="topology.kubernetes.io/zone", max_unavailable="25%"),
        model.TopologyBudget(key="nvidia.com/gpu.clique", max_unavailable=2),
    )
    assert topology.domains == (
        model.TopologyDomain(key="nvidia.com/gpu.clique", unhealthy="50%", action=vocabulary.Action.TAINT),
        model.TopologyDomain(key="rack", unhealthy=3, action=vocabulary.Action.LABEL),
    )


@pytest.mark.parametrize(
    ("topology", "field"),
    [
        ("rack", "spec.topology"),
        ({"budgets": {"key": "rack"}}, "spec.topology.budgets"),
        ({"budgets": [{"maxUnavailable": 1}]}, "spec.topology.budgets[0].key"),
        ({"budgets": [{"key": "", "maxUnavailable": 1}]}, "spec.topology.budgets[0].key"),
        ({"budgets": [{"key": "Bad Key", "maxUnavailable": 1}]}, "spec.topology.budgets[0].key"),
        ({"budgets": [{"key": "a/b/c", "maxUnavailable": 1}]}, "spec.topology.budgets[0].key"),
        ({"budgets": [{"key": "Example.com/rack", "maxUnavailable": 1}]}, "spec.topology.budgets[0].key"),
        ({"budgets": [{"key": "x" * 64, "maxUnavailable": 1}]}, "spec.topology.budgets[0].key"),
        ({"budgets": [{"key": "a" * 254 + "/rack", "maxUnavailable": 1}]}, "spec.topology.budgets[0].key"),
        ({"budgets": [{"key": "rack"}]}, "spec.topology.budgets[0].maxUnavailable"),
        ({"budgets": [{"key": "rack", "maxUnavailable": 0}]}, "spec.topology.budgets[0].maxUnavailable"),
        ({"budgets": [{"key": "rack", "maxUnavailable": "0%"}]}, "spec.topology.budgets[0].maxUnavailable"),
        ({"budgets": [{"key": "rack", "maxUnavailable": True}]}, "spec.topology.budgets[0].maxUnavailable"),
        (
            {"budgets": [{"key": "rack", "maxUnavailable": 1}, {"key": "rack", "maxUnavailable": 2}]},
            "spec.topology.budgets[1].key",
        ),
        (
            {"budgets": [{"key": f"k{i}", "maxUnavailable": 1} for i in range(9)]},
            "spec.topology.budgets",
        ),
        ({"domains": [{"unhealthy": 1}]}, "spec.topology.domains[0].key"),
        ({"domains": [{"key": "rack"}]}, "spec.topology.domains[0].unhealthy"),
        ({"domains": [{"key": "rack", "unhealthy": "150%"}]}, "spec.topology.domains[0].unhealthy"),
        ({"domains": [{"key": "r", "unhealthy": 2, "action": "Drain"}]}, "spec.topology.domains[0].action"),
        ({"domains": [{"key": "r", "unhealthy": 2, "action": "Reboot"}]}, "spec.topology.domains[0].action"),
        (
            {"domains": [{"key": "rack", "unhealthy": 1}, {"key": "rack", "unhealthy": 2}]},
            "spec.topology.domains[1].key",
        ),
    ],
)
def test_invalid_topology_names_the_field(topology: object, field: str) -> None:
    with pytest.raises(ValueError, match=r"^" + field.replace("[", r"\[").replace("]", r"\]") + ":"):
        parse(topology)


@pytest.mark.parametrize(
    ("value", "domain", "limit"),
    [(1, 8, 1), (3, 8, 3), ("25%", 8, 2), ("25%", 7, 1), ("10%", 4, 1), ("100%", 5, 5), ("50%", 0, 1)],
)
def test_domain_budget_rounds_down_and_is_at_least_one(value: int | str, domain: int, limit: int) -> None:
    assert policies.resolve_topology_budget(model.TopologyBudget("rack", value), domain) == limit
