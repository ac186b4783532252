"""Policies: parsing a GPUHealthPolicy spec, selecting nodes, resolving maxUnavailable."""

import re

import pytest

from gpuhealth_api import conditions, keys, vocabulary
from gpuhealth_operator.decisions import model, policies

Condition = vocabulary.Condition
Action = vocabulary.Action

DESIGN_SPEC = {
    "nodeSelector": {"matchLabels": {"nvidia.com/gpu.present": "true"}},
    "dryRun": False,
    "maxUnavailable": "10%",
    "rules": [
        {"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"},
        {"name": "xid", "condition": "XidCritical", "action": "Drain", "xids": [48, 79]},
        {"name": "thermal", "condition": "ThermalThrottled", "action": "Label", "forSeconds": 60},
        {
            "name": "straggler",
            "condition": "Straggler",
            "action": "Label",
            "forSeconds": 300,
            "threshold": 3.5,
        },
    ],
    "drain": {"timeoutSeconds": 900, "gracePeriodSeconds": None, "deleteEmptyDirData": True},
    "recovery": {"uncordon": True, "healthyForSeconds": 600},
}


def test_design_policy_parses() -> None:
    policy = policies.parse_policy("default", 3, DESIGN_SPEC)
    assert policy.name == "default"
    assert policy.generation == 3
    assert policy.match_labels == {"nvidia.com/gpu.present": "true"}
    assert policy.max_unavailable == "10%"
    assert [r.name for r in policy.rules] == ["ecc", "xid", "thermal", "straggler"]
    assert policy.rules[1].xids == frozenset({48, 79})
    assert policy.rules[2].for_seconds == 60
    assert policy.rules[3].threshold == 3.5
    assert policy.drain_grace_period_seconds is None
    assert policy.recovery_healthy_for_seconds == 600


def test_empty_spec_takes_design_defaults() -> None:
    policy = policies.parse_policy("p", 1, {})
    assert policy == model.Policy(name="p", generation=1)
    assert policy.max_unavailable == "10%"
    assert policy.drain_timeout_seconds == 900
    assert policy.recovery_uncordon is True


def test_isolation_fields_parse_and_default() -> None:
    assert policies.parse_policy("p", 1, {}).max_unavailable_gpus == "10%"
    assert policies.parse_policy("p", 1, {}).isolation_max_gpus_per_node == 2
    assert policies.parse_policy("p", 1, {}).isolation_effect is vocabulary.IsolationEffect.NO_EXECUTE
    spec = {"maxUnavailableGPUs": 4, "isolation": {"maxGPUsPerNode": 3, "effect": "NoSchedule"}}
    policy = policies.parse_policy("p", 1, spec)
    assert (policy.max_unavailable_gpus, policy.isolation_max_gpus_per_node) == (4, 3)
    assert policy.isolation_effect is vocabulary.IsolationEffect.NO_SCHEDULE


@pytest.mark.parametrize("condition", sorted(conditions.PER_GPU_CONDITIONS))
def test_isolate_gpu_is_accepted_for_every_per_gpu_fault(condition: Condition) -> None:
    spec = {"rules": [{"name": "one-gpu", "condition": condition.value, "action": "IsolateGPU"}]}
    (rule,) = policies.parse_policy("p", 1, spec).rules
    assert rule.action is Action.ISOLATE_GPU


@pytest.mark.parametrize(
    ("max_unavailable_gpus", "gpus", "limit"), [(4, 800, 4), ("10%", 96, 9), ("1%", 8, 1), ("100%", 16, 16)]
)
def test_resolve_max_unavailable_gpus(max_unavailable_gpus: int | str, gpus: int, limit: int) -> None:
    policy = policies.parse_policy("p", 1, {"maxUnavailableGPUs": max_unavailable_gpus})
    assert policies.resolve_max_unavailable_gpus(policy, gpus) == limit


def test_optional_rule_fields_default() -> None:
    spec = {
        "rules": [
            {"name": "xid", "condition": "XidCritical", "action": "Drain"},
            {"name": "s", "condition": "Straggler", "action": "Label"},
        ]
    }
    xid, straggler = policies.parse_policy("p", 1, spec).rules
    assert xid.xids == policies.DEFAULT_CRITICAL_XIDS
    assert xid.for_seconds == 0
    assert straggler.threshold == policies.DEFAULT_STRAGGLER_THRESHOLD


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"maxUnavailable": 0}, "spec.maxUnavailable"),
        ({"maxUnavailable": "0%"}, "spec.maxUnavailable"),
        ({"maxUnavailable": "150%"}, "spec.maxUnavailable"),
        ({"maxUnavailable": "ten"}, "spec.maxUnavailable"),
        ({"maxUnavailable": True}, "spec.maxUnavailable"),
        ({"dryRun": "yes"}, "spec.dryRun"),
        ({"rules": {"name": "x"}}, "spec.rules"),
        ({"rules": [{"condition": "GPULost", "action": "Drain"}]}, "spec.rules[0].name"),
        ({"rules": [{"name": "a", "condition": "Bogus", "action": "Drain"}]}, "spec.rules[0].condition"),
        ({"rules": [{"name": "a", "condition": "GPULost", "action": "Reboot"}]}, "spec.rules[0].action"),
        (
            {
                "rules": [
                    {"name": "a", "condition": "GPULost", "action": "Drain"},
                    {"name": "a", "condition": "GPULost", "action": "Event"},
                ]
            },
            "spec.rules[1].name",
        ),
        ({"rules": [{"name": "a", "condition": "AgentStale", "action": "Drain"}]}, "spec.rules[0].action"),
        (
            {"rules": [{"name": "a", "condition": "GPULost", "action": "Drain", "forSeconds": -1}]},
            "spec.rules[0].forSeconds",
        ),
        (
            {"rules": [{"name": "a", "condition": "Straggler", "action": "Label", "threshold": 0}]},
            "spec.rules[0].threshold",
        ),
        (
            {"rules": [{"name": "a", "condition": "XidCritical", "action": "Drain", "xids": [0]}]},
            "spec.rules[0].xids[0]",
        ),
        ({"nodeSelector": {"matchLabels": {"a": 1}}}, "spec.nodeSelector.matchLabels['a']"),
        (
            {"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}},
            "spec.nodeSelector.matchExpressions[0].operator",
        ),
        (
            {"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
            "spec.nodeSelector.matchExpressions[0].values",
        ),
        ({"drain": {"timeoutSeconds": 0}}, "spec.drain.timeoutSeconds"),
        ({"drain": {"gracePeriodSeconds": 1.5}}, "spec.drain.gracePeriodSeconds"),
        ({"drain": {"force": "yes"}}, "spec.drain.force"),
        ({"drain": {"excludeNamespaces": "kube-system"}}, "spec.drain.excludeNamespaces"),
        ({"drain": {"excludeNamespaces": ["ok", "Not_A_Namespace"]}}, "spec.drain.excludeNamespaces[1]"),
        ({"recovery": {"healthyForSeconds": "600"}}, "spec.recovery.healthyForSeconds"),
        ({"recovery": []}, "spec.recovery"),
        (
            {"rules": [{"name": "a", "condition": "ThermalThrottled", "action": "IsolateGPU"}]},
            "spec.rules[0].action",
        ),
        (
            {"rules": [{"name": "a", "condition": "AgentStale", "action": "IsolateGPU"}]},
            "spec.rules[0].action",
        ),
        ({"maxUnavailableGPUs": 0}, "spec.maxUnavailableGPUs"),
        ({"maxUnavailableGPUs": "101%"}, "spec.maxUnavailableGPUs"),
        ({"isolation": {"maxGPUsPerNode": 0}}, "spec.isolation.maxGPUsPerNode"),
        ({"isolation": {"maxGPUsPerNode": 65}}, "spec.isolation.maxGPUsPerNode"),
        ({"isolation": {"maxGPUsPerNode": 1.5}}, "spec.isolation.maxGPUsPerNode"),
        ({"isolation": {"effect": "PreferNoSchedule"}}, "spec.isolation.effect"),
        ({"isolation": "on"}, "spec.isolation"),
    ],
)
def test_invalid_spec_names_the_field(spec: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{re.escape(field)}:"):
        policies.parse_policy("p", 1, spec)


def _expr(key: str, operator: str, *values: str) -> dict[str, object]:
    return {"matchExpressions": [{"key": key, "operator": operator, "values": list(values)}]}


def _selector_policy(**kwargs: object) -> model.Policy:
    return policies.parse_policy("p", 1, {"nodeSelector": kwargs})


@pytest.mark.parametrize(
    ("selector", "labels", "selected"),
    [
        ({}, {}, True),
        ({"matchLabels": {"gpu": "yes"}}, {"gpu": "yes"}, True),
        ({"matchLabels": {"gpu": "yes"}}, {"gpu": "no"}, False),
        ({"matchLabels": {"gpu": "yes"}}, {}, False),
        (
            _expr("zone", "In", "a", "b"),
            {"zone": "b"},
            True,
        ),
        (
            _expr("zone", "In", "a", "b"),
            {"zone": "c"},
            False,
        ),
        ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}, {}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, {"zone": "b"}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, {"zone": "a"}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, {}, True),
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {"gpu": ""}, True),
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {}, False),
        ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, {}, True),
        ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, {"gpu": "x"}, False),
        ({}, {keys.EXCLUDE_LABEL: "true"}, False),
        ({"matchLabels": {"gpu": "yes"}}, {"gpu": "yes", keys.EXCLUDE_LABEL: "true"}, False),
        ({"matchLabels": {"gpu": "yes"}}, {"gpu": "yes", keys.EXCLUDE_LABEL: "false"}, True),
    ],
)
def test_selects(selector: dict[str, object], labels: dict[str, str], selected: bool) -> None:
    policy = _selector_policy(**selector)
    assert policies.selects(policy, model.NodeView(name="n", labels=labels)) is selected


@pytest.mark.parametrize(
    ("max_unavailable", "selected", "limit"),
    [
        (2, 100, 2),
        (1, 0, 1),
        ("10%", 100, 10),
        ("10%", 19, 1),  # 1.9 rounds down
        ("10%", 25, 2),  # 2.5 rounds down
        ("10%", 5, 1),  # at least 1
        ("10%", 0, 1),
        ("100%", 7, 7),
        ("50%", 7, 3),
        ("3", 10, 3),
    ],
)
def test_resolve_max_unavailable(max_unavailable: int | str, selected: int, limit: int) -> None:
    policy = policies.parse_policy("p", 1, {"maxUnavailable": max_unavailable})
    assert policies.resolve_max_unavailable(policy, selected) == limit


def test_rule_xids_union_of_rules_or_default() -> None:
    assert policies.rule_xids(model.Policy(name="p")) == policies.DEFAULT_CRITICAL_XIDS
    policy = policies.parse_policy(
        "p",
        1,
        {
            "rules": [
                {"name": "a", "condition": "XidCritical", "action": "Drain", "xids": [79]},
                {"name": "b", "condition": "XidCritical", "action": "Event", "xids": [13, 31]},
            ]
        },
    )
    assert policies.rule_xids(policy) == frozenset({79, 13, 31})


def test_drain_force_and_excluded_namespaces() -> None:
    assert policies.parse_policy("p", 1, {}).drain_force is False
    policy = policies.parse_policy(
        "p", 1, {"drain": {"force": True, "excludeNamespaces": ["kube-system", "monitoring"]}}
    )
    assert policy.drain_force is True
    assert policy.drain_exclude_namespaces == frozenset({"kube-system", "monitoring"})
