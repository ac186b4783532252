"""GPUHealthPolicy: parsing a spec, selecting nodes, resolving the disruption budget.

The CRD's schema and CEL rules reject bad policies at the API server, so
`parse_policy` is a second line of defence: anything the CRD would not have
admitted raises ValueError naming the field (`spec.rules[2].action`), and the
handler reports it on the policy instead of acting on half a policy. Optional
fields take the defaults DESIGN.md documents.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, TypeVar

from gpuhealth_api import conditions, keys, vocabulary, xid_catalogue
from gpuhealth_operator.decisions import breaker, model, step_kinds

Condition = vocabulary.Condition

DEFAULT_MAX_UNAVAILABLE: Final = "10%"
DEFAULT_STRAGGLER_THRESHOLD: Final = 3.5
DEFAULT_CRITICAL_XIDS: Final[frozenset[int]] = xid_catalogue.default_critical()
"""XIDs an XidCritical rule without `xids` acts on: the catalogue's critical ones (a GPU reset, a node
reboot or worse, as NVIDIA's XID catalogue resolves them), the same that make `check` exit 1."""

_PERCENT = re.compile(r"^(\d{1,3})%$")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_SELECTOR_OPERATORS: Final = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})
_STALE_ACTIONS: Final = frozenset({vocabulary.Action.EVENT, vocabulary.Action.LABEL})
"""Missing data is never a reason to disrupt a node (the CRD enforces the same)."""
_E = TypeVar(
    "_E", vocabulary.Condition, vocabulary.Action, vocabulary.IsolationEffect, vocabulary.RepairAction
)
DEFAULT_MAX_GPUS_PER_NODE: Final = 2
MAX_GPUS_PER_NODE_LIMIT: Final = 64
"""The CRD's maximum for spec.isolation.maxGPUsPerNode."""
MAX_TOPOLOGY_ENTRIES: Final = 8
"""The CRD's maxItems for spec.topology.budgets and spec.topology.domains."""
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def parse_policy(name: str, generation: int, spec: Mapping[str, Any]) -> model.Policy:
    """A Policy from a GPUHealthPolicy's `spec`; ValueError naming the field if it is invalid."""
    if not isinstance(spec, Mapping):
        raise ValueError("spec: must be an object")
    selector = _mapping(spec.get("nodeSelector"), "spec.nodeSelector")
    drain = _mapping(spec.get("drain"), "spec.drain")
    recovery = _mapping(spec.get("recovery"), "spec.recovery")
    breaker_spec = _mapping(spec.get("breaker"), "spec.breaker")
    isolation = _mapping(spec.get("isolation"), "spec.isolation")
    grace = drain.get("gracePeriodSeconds")
    if grace is not None:
        grace = int(_number(grace, "spec.drain.gracePeriodSeconds", minimum=0, integer=True))
    return model.Policy(
        name=name,
        generation=generation,
        match_labels=_match_labels(selector.get("matchLabels")),
        match_expressions=_match_expressions(selector.get("matchExpressions")),
        dry_run=_boolean(spec.get("dryRun", False), "spec.dryRun"),
        max_unavailable=_max_unavailable(spec.get("maxUnavailable", DEFAULT_MAX_UNAVAILABLE)),
        max_unavailable_gpus=_max_unavailable(
            spec.get("maxUnavailableGPUs", DEFAULT_MAX_UNAVAILABLE), "spec.maxUnavailableGPUs"
        ),
        isolation_max_gpus_per_node=_max_gpus_per_node(isolation.get("maxGPUsPerNode")),
        isolation_effect=_enum(
            vocabulary.IsolationEffect,
            isolation.get("effect", vocabulary.IsolationEffect.NO_EXECUTE.value),
            "spec.isolation.effect",
        ),
        rules=_rules(spec.get("rules")),
        drain_timeout_seconds=_number(
            drain.get("timeoutSeconds", 900), "spec.drain.timeoutSeconds", minimum=1
        ),
        drain_grace_period_seconds=grace,
        drain_delete_empty_dir_data=_boolean(
            drain.get("deleteEmptyDirData", True), "spec.drain.deleteEmptyDirData"
        ),
        drain_force=_boolean(drain.get("force", False), "spec.drain.force"),
        drain_exclude_namespaces=_namespaces(drain.get("excludeNamespaces"), "spec.drain.excludeNamespaces"),
        recovery_uncordon=_boolean(recovery.get("uncordon", True), "spec.recovery.uncordon"),
        recovery_healthy_for_seconds=_number(
            recovery.get("healthyForSeconds", 600), "spec.recovery.healthyForSeconds", minimum=0
        ),
        breaker_max_new_unhealthy=_max_unavailable(
            breaker_spec.get("maxNewUnhealthy", breaker.DEFAULT_MAX_NEW_UNHEALTHY),
            "spec.breaker.maxNewUnhealthy",
        ),
        breaker_window_seconds=_number(
            breaker_spec.get("windowSeconds", breaker.DEFAULT_WINDOW_SECONDS),
            "spec.breaker.windowSeconds",
            minimum=1,
            integer=True,
        ),
        topology=_topology(spec.get("topology")),
        repair=_repair(spec.get("repair")),
        active_checks=_active_checks(spec.get("activeChecks")),
    )


def selects(policy: model.Policy, node: model.NodeView) -> bool:
    """Whether the node's labels match: Kubernetes LabelSelector semantics (an empty selector matches
    every label set); a node labelled gpuhealth.io/exclude=true is never selected.

    Labels alone: a Node without a GPUNode is still never selected (`selects_gpu_node`).
    """
    return not excluded(node) and matches(policy, node)


def excluded(node: model.NodeView) -> bool:
    """The node opted out (gpuhealth.io/exclude=true): no policy judges or acts on it."""
    return node.labels.get(keys.EXCLUDE_LABEL) == "true"


def matches(policy: model.Policy, node: model.NodeView) -> bool:
    """The policy's nodeSelector matches the node, opted out or not."""
    labels = node.labels
    if any(labels.get(key) != value for key, value in policy.match_labels.items()):
        return False
    return all(_requirement_matches(r, labels) for r in policy.match_expressions)


def selects_gpu_node(policy: model.Policy, node: model.NodeView, has_agent: bool) -> bool:
    """Whether the policy selects the node: its labels match and an agent reports on it (a GPUNode).

    A policy judges GPU nodes and its budget is taken of them, so an empty
    selector means "every node with an agent", never "every Node": a
    percentage of a fleet that is mostly CPU nodes would let every GPU node go.
    """
    return has_agent and selects(policy, node)


def resolve_max_unavailable(policy: model.Policy, selected_count: int) -> int:
    """How many selected nodes the policy may hold cordoned at once (`selected_count`: its GPU nodes).

    A percent rounds DOWN (as a Deployment's maxUnavailable does): this budget
    is capacity the operator takes away on its own authority, and the safe
    side of a rounding error is one node fewer out of service. Either way the
    result is at least 1, or a small fleet could never remediate anything.
    """
    return _resolve_budget(policy.max_unavailable, selected_count)


def resolve_max_unavailable_gpus(policy: model.Policy, selected_gpus: int) -> int:
    """How many GPUs of the selected nodes the policy may hold isolated at once (rounded down, at least 1)."""
    return _resolve_budget(policy.max_unavailable_gpus, selected_gpus)


def _resolve_budget(value: int | str, selected_count: int) -> int:
    if isinstance(value, int):
        return max(1, value)
    match = _PERCENT.match(value)
    if match is None:  # parse_policy only lets ints, digit strings and percents through
        return max(1, int(value)) if value.isdigit() else 1
    return max(1, math.floor(max(0, selected_count) * int(match.group(1)) / 100))


def resolve_topology_budget(entry: model.TopologyBudget, domain_count: int) -> int:
    """How many of a domain's selected GPU nodes may be unschedulable at once under a topology budget
    (`domain_count`: the policy's selected GPU nodes with that value of the label): the rule of
    `resolve_max_unavailable` (rounded down, at least 1)."""
    return _resolve_budget(entry.max_unavailable, domain_count)


_RULE_XIDS: dict[int, tuple[tuple[model.Rule, ...], frozenset[int]]] = {}
"""`rule_xids` per rules tuple (by identity; the tuple is kept, so its id is not reused): one set per
policy, not one per judged node (each node's judged signals are keyed by it)."""


def rule_xids(policy: model.Policy) -> frozenset[int]:
    """XIDs the policy's XidCritical rules treat as critical; the default set if it has none."""
    known = _RULE_XIDS.get(id(policy.rules))
    if known is not None and known[0] is policy.rules:
        return known[1]
    xid_rules = [r for r in policy.rules if r.condition is Condition.XID_CRITICAL]
    xids = frozenset().union(*(r.xids for r in xid_rules)) if xid_rules else DEFAULT_CRITICAL_XIDS
    if len(_RULE_XIDS) >= 64:  # policies come and go (each parse is a new tuple)
        _RULE_XIDS.clear()
    _RULE_XIDS[id(policy.rules)] = (policy.rules, xids)
    return xids


def _requirement_matches(requirement: model.LabelSelectorRequirement, labels: Mapping[str, str]) -> bool:
    present = requirement.key in labels
    match requirement.operator:
        case "In":
            return present and labels[requirement.key] in requirement.values
        case "NotIn":
            return not present or labels[requirement.key] not in requirement.values
        case "Exists":
            return present
        case "DoesNotExist":
            return not present
    return False  # unknown operator: select nothing rather than everything


def _rules(value: object) -> tuple[model.Rule, ...]:
    if value is None:
        return ()
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ValueError("spec.rules: must be a list")
    rules: list[model.Rule] = []
    seen: set[str] = set()
    for i, item in enumerate(value):
        where = f"spec.rules[{i}]"
        raw = _mapping(item, where)
        rule_name = raw.get("name")
        if not isinstance(rule_name, str) or not rule_name:
            raise ValueError(f"{where}.name: required, a non-empty string")
        if rule_name in seen:
            raise ValueError(f"{where}.name: duplicate rule name {rule_name!r}")
        seen.add(rule_name)
        condition: vocabulary.ConditionKey
        if raw.get("nodeCondition") is not None:
            if raw.get("condition") is not None:
                raise ValueError(f"{where}: exactly one of condition or nodeCondition")
            condition = _node_condition(raw["nodeCondition"], f"{where}.nodeCondition")
        else:
            condition = _enum(vocabulary.Condition, raw.get("condition"), f"{where}.condition")
        action = _enum(vocabulary.Action, raw.get("action"), f"{where}.action")
        if condition is Condition.AGENT_STALE and action not in _STALE_ACTIONS:
            raise ValueError(f"{where}.action: must be Event or Label when condition is AgentStale")
        if action is vocabulary.Action.ISOLATE_GPU and condition not in conditions.PER_GPU_CONDITIONS:
            raise ValueError(
                f"{where}.action: IsolateGPU needs a fault of one GPU (condition EccUncorrectable, "
                "RowRemapFailure, XidCritical, GPULost or RecoveryRequired)"
            )
        for_seconds = _number(raw.get("forSeconds", 0), f"{where}.forSeconds", minimum=0)
        threshold = None
        if condition is Condition.STRAGGLER:
            threshold = _number(raw.get("threshold", DEFAULT_STRAGGLER_THRESHOLD), f"{where}.threshold")
            if threshold <= 0:
                raise ValueError(f"{where}.threshold: must be greater than 0")
        elif condition in conditions.DEFAULT_THRESHOLDS and raw.get("threshold") is not None:
            # growth per hour the trend tolerates; omitted: conditions.DEFAULT_THRESHOLDS
            threshold = _number(raw["threshold"], f"{where}.threshold", minimum=0)
        xids: frozenset[int] = frozenset()
        if condition is Condition.XID_CRITICAL:
            xids = _xids(raw.get("xids"), f"{where}.xids")
        rules.append(
            model.Rule(
                name=rule_name,
                condition=condition,
                action=action,
                for_seconds=for_seconds,
                threshold=threshold,
                xids=xids,
            )
        )
    return tuple(rules)


def _topology(value: object) -> model.Topology:
    raw = _mapping(value, "spec.topology")
    budgets: list[model.TopologyBudget] = []
    for i, item in enumerate(_list(raw.get("budgets"), "spec.topology.budgets")):
        where = f"spec.topology.budgets[{i}]"
        entry = _mapping(item, where)
        key = _label_key(entry.get("key"), f"{where}.key")
        if any(b.key == key for b in budgets):
            raise ValueError(f"{where}.key: duplicate key {key!r}")
        if "maxUnavailable" not in entry:
            raise ValueError(f"{where}.maxUnavailable: required")
        budgets.append(
            model.TopologyBudget(
                key=key, max_unavailable=_max_unavailable(entry["maxUnavailable"], f"{where}.maxUnavailable")
            )
        )
    domains: list[model.TopologyDomain] = []
    for i, item in enumerate(_list(raw.get("domains"), "spec.topology.domains")):
        where = f"spec.topology.domains[{i}]"
        entry = _mapping(item, where)
        key = _label_key(entry.get("key"), f"{where}.key")
        if any(d.key == key for d in domains):
            raise ValueError(f"{where}.key: duplicate key {key!r}")
        if "unhealthy" not in entry:
            raise ValueError(f"{where}.unhealthy: required")
        action = _enum(vocabulary.Action, entry.get("action", "Label"), f"{where}.action")
        if action not in vocabulary.DOMAIN_ACTIONS:
            raise ValueError(f"{where}.action: must be one of Label, Taint, got {action.value!r}")
        domains.append(
            model.TopologyDomain(
                key=key, unhealthy=_max_unavailable(entry["unhealthy"], f"{where}.unhealthy"), action=action
            )
        )
    return model.Topology(budgets=tuple(budgets), domains=tuple(domains))


DEFAULT_STEP_TIMEOUTS: Final[Mapping[vocabulary.RepairAction, float]] = {
    action: kind.default_timeout_seconds for action, kind in step_kinds.KINDS.items()
}
DEFAULT_VALIDATION_TIMEOUT: Final = 900.0
MAX_REPAIR_STEPS: Final = 4
_STEP_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _repair(value: object) -> model.RepairSpec | None:
    """`spec.repair`; None when omitted (today's behaviour: no repair)."""
    if value is None:
        return None
    raw = _mapping(value, "spec.repair")
    items = raw.get("steps")
    if not isinstance(items, Sequence) or isinstance(items, str) or not items:
        raise ValueError("spec.repair.steps: required, a list of 1 to 4 steps")
    if len(items) > MAX_REPAIR_STEPS:
        raise ValueError(f"spec.repair.steps: must have at most {MAX_REPAIR_STEPS} items")
    steps: list[model.RepairStep] = []
    for i, item in enumerate(items):
        where = f"spec.repair.steps[{i}]"
        entry = _mapping(item, where)
        name = entry.get("name")
        if not isinstance(name, str) or not _STEP_NAME.match(name):
            raise ValueError(f"{where}.name: required, a lowercase DNS label like 'reset', got {name!r}")
        if any(s.name == name for s in steps):
            raise ValueError(f"{where}.name: duplicate name {name!r}")
        action = _enum(vocabulary.RepairAction, entry.get("action"), f"{where}.action")
        timeout = _number(
            entry.get("timeoutSeconds", DEFAULT_STEP_TIMEOUTS[action]),
            f"{where}.timeoutSeconds",
            minimum=1,
            integer=True,
        )
        steps.append(model.RepairStep(name=name, action=action, timeout_seconds=timeout))
    validation: float | None = None
    new_nodes = False
    if raw.get("validation") is not None:
        checks = _mapping(raw.get("validation"), "spec.repair.validation")
        validation = _number(
            checks.get("timeoutSeconds", DEFAULT_VALIDATION_TIMEOUT),
            "spec.repair.validation.timeoutSeconds",
            minimum=1,
            integer=True,
        )
        new_nodes = _boolean(checks.get("newNodes", False), "spec.repair.validation.newNodes")
    return model.RepairSpec(
        steps=tuple(steps),
        validation_timeout_seconds=validation,
        validation_new_nodes=new_nodes,
        max_concurrent=_max_unavailable(raw.get("maxConcurrent", 1), "spec.repair.maxConcurrent"),
        max_attempts=int(
            _number(raw.get("maxAttempts", 3), "spec.repair.maxAttempts", minimum=1, integer=True)
        ),
        attempt_window_seconds=_number(
            raw.get("attemptWindowSeconds", 604800),
            "spec.repair.attemptWindowSeconds",
            minimum=60,
            integer=True,
        ),
    )


def resolve_max_concurrent(spec: model.RepairSpec, selected_count: int) -> int:
    """`spec.repair.maxConcurrent` in nodes: an int, or a percent of the selected GPU nodes; at least 1."""
    return _resolve_budget(spec.max_concurrent, selected_count)


DEFAULT_CHECK_EVERY_SECONDS: Final = 604800.0
"""A week: the ClusterMAX rating's expectation of active checks on idle nodes."""
DEFAULT_CHECK_IDLE_FOR_SECONDS: Final = 900.0
DEFAULT_CHECK_TIMEOUT_SECONDS: Final = 900.0
DEFAULT_CHECK_MAX_CONCURRENT: Final = 1
MAX_ACTIVE_CHECKS: Final = 8
"""The CRD's maxItems for spec.activeChecks."""
MIN_CHECK_EVERY_SECONDS: Final = 60
_TEMPLATE_KEY = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
"""A ConfigMap key the chart's templates can have, at most 63 characters (it goes into a label)."""


def _active_checks(value: object) -> tuple[model.ActiveCheck, ...]:
    """`spec.activeChecks`; () when omitted. Reads the spec only, so a bad entry leaves it as it was."""
    if value is None:
        return ()
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ValueError("spec.activeChecks: must be a list")
    if len(value) > MAX_ACTIVE_CHECKS:
        raise ValueError(f"spec.activeChecks: must have at most {MAX_ACTIVE_CHECKS} items")
    checks: list[model.ActiveCheck] = []
    for i, item in enumerate(value):
        where = f"spec.activeChecks[{i}]"
        if item is None:  # _mapping takes None for an omitted object; an entry is never omitted
            raise ValueError(f"{where}: must be an object")
        entry = _mapping(item, where)
        name = entry.get("name")
        if not isinstance(name, str) or not _STEP_NAME.match(name):
            raise ValueError(f"{where}.name: required, a lowercase DNS label like 'quick', got {name!r}")
        if any(c.name == name for c in checks):
            raise ValueError(f"{where}.name: duplicate name {name!r}")
        template = entry.get("template")
        if not isinstance(template, str) or not _TEMPLATE_KEY.match(template):
            raise ValueError(
                f"{where}.template: required, a key of the chart's check templates like 'DcgmDiagQuick', "
                f"got {template!r}"
            )
        threshold = entry.get("threshold")
        if threshold is not None:
            threshold = _number(threshold, f"{where}.threshold", minimum=0)
            if threshold <= 0:
                raise ValueError(f"{where}.threshold: must be greater than 0")
        checks.append(
            model.ActiveCheck(
                name=name,
                template=template,
                every_seconds=_number(
                    entry.get("everySeconds", DEFAULT_CHECK_EVERY_SECONDS),
                    f"{where}.everySeconds",
                    minimum=MIN_CHECK_EVERY_SECONDS,
                    integer=True,
                ),
                idle_for_seconds=_number(
                    entry.get("idleForSeconds", DEFAULT_CHECK_IDLE_FOR_SECONDS),
                    f"{where}.idleForSeconds",
                    minimum=0,
                    integer=True,
                ),
                timeout_seconds=_number(
                    entry.get("timeoutSeconds", DEFAULT_CHECK_TIMEOUT_SECONDS),
                    f"{where}.timeoutSeconds",
                    minimum=1,
                    integer=True,
                ),
                max_concurrent=_max_unavailable(
                    entry.get("maxConcurrent", DEFAULT_CHECK_MAX_CONCURRENT), f"{where}.maxConcurrent"
                ),
                threshold=threshold,
            )
        )
    return tuple(checks)


def resolve_check_max_concurrent(check: model.ActiveCheck, selected_count: int) -> int:
    """A check's `maxConcurrent` in nodes: an int, or a percent of `selected_count`; at least 1."""
    return _resolve_budget(check.max_concurrent, selected_count)


def _list(value: object, where: str) -> Sequence[object]:
    if value is None:
        return ()
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ValueError(f"{where}: must be a list")
    if len(value) > MAX_TOPOLOGY_ENTRIES:
        raise ValueError(f"{where}: must have at most {MAX_TOPOLOGY_ENTRIES} items")
    return value


def _label_key(value: object, where: str) -> str:
    """A Kubernetes label key: an optional DNS subdomain prefix (at most 253) and '/', a name (at most 63)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where}: required, a label key")
    prefix, slash, label = value.rpartition("/")
    if not _LABEL_NAME.match(label) or (slash and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix))):
        raise ValueError(f"{where}: must be a label key like 'topology.kubernetes.io/zone', got {value!r}")
    return value


_NODE_CONDITION_TYPE = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


def _node_condition(value: object, where: str) -> vocabulary.NodeCondition:
    """A rule's `nodeCondition: {type, status}` (status default "True"): another tool's Node condition."""
    raw = _mapping(value, where)
    kind, wanted = raw.get("type"), raw.get("status", "True")
    if not isinstance(kind, str) or not _NODE_CONDITION_TYPE.match(kind):
        raise ValueError(f"{where}.type: required, a Node condition type (for example KernelDeadlock)")
    if kind == keys.NODE_CONDITION_TYPE:
        raise ValueError(f"{where}.type: {kind} is gpu-health's own Node condition")
    if wanted not in vocabulary.NODE_CONDITION_STATUSES:
        raise ValueError(f"{where}.status: must be True, False or Unknown")
    opt_in = vocabulary.ALLOW_KUBELET_CONDITION
    allowed = _boolean(raw.get(opt_in, False), f"{where}.{opt_in}")
    if kind in vocabulary.KUBELET_NODE_CONDITIONS and not allowed:
        # The CRD refuses it too; this is for a cluster whose CRD is older than the rule (issue 45).
        raise ValueError(
            f"{where}.type: {kind} is kubelet's own Node condition, which can flip on every node at once: "
            f"a rule names it only with {opt_in}: true"
        )
    return vocabulary.node_condition(kind, wanted)


def _xids(value: object, where: str) -> frozenset[int]:
    if value is None:
        return DEFAULT_CRITICAL_XIDS
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise ValueError(f"{where}: must be a non-empty list of XID codes")
    return frozenset(int(_number(x, f"{where}[{i}]", minimum=1, integer=True)) for i, x in enumerate(value))


def _match_labels(value: object) -> dict[str, str]:
    labels = _mapping(value, "spec.nodeSelector.matchLabels")
    for key, label in labels.items():
        if not isinstance(key, str) or not isinstance(label, str):
            raise ValueError(f"spec.nodeSelector.matchLabels[{key!r}]: keys and values must be strings")
    return dict(labels)


def _match_expressions(value: object) -> tuple[model.LabelSelectorRequirement, ...]:
    if value is None:
        return ()
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ValueError("spec.nodeSelector.matchExpressions: must be a list")
    requirements = []
    for i, item in enumerate(value):
        where = f"spec.nodeSelector.matchExpressions[{i}]"
        raw = _mapping(item, where)
        key, operator, values = raw.get("key"), raw.get("operator"), raw.get("values") or []
        if not isinstance(key, str) or not key:
            raise ValueError(f"{where}.key: required, a non-empty string")
        if operator not in _SELECTOR_OPERATORS:
            raise ValueError(f"{where}.operator: must be one of In, NotIn, Exists, DoesNotExist")
        if (
            not isinstance(values, Sequence)
            or isinstance(values, str)
            or not all(isinstance(v, str) for v in values)
        ):
            raise ValueError(f"{where}.values: must be a list of strings")
        if operator in ("In", "NotIn") and not values:
            raise ValueError(f"{where}.values: must be non-empty for operator {operator}")
        if operator in ("Exists", "DoesNotExist") and values:
            raise ValueError(f"{where}.values: must be empty for operator {operator}")
        requirements.append(
            model.LabelSelectorRequirement(key=key, operator=str(operator), values=tuple(values))
        )
    return tuple(requirements)


def _max_gpus_per_node(value: object) -> int:
    where = "spec.isolation.maxGPUsPerNode"
    if value is None:
        return DEFAULT_MAX_GPUS_PER_NODE
    number = int(_number(value, where, minimum=1, integer=True))
    if number > MAX_GPUS_PER_NODE_LIMIT:
        raise ValueError(f"{where}: must be at most {MAX_GPUS_PER_NODE_LIMIT}")
    return number


def _max_unavailable(value: object, where: str = "spec.maxUnavailable") -> int | str:
    if isinstance(value, bool):
        raise ValueError(f"{where}: must be an integer or a percent like '10%'")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"{where}: must be at least 1")
        return value
    if isinstance(value, str):
        if value.isdigit() and int(value) >= 1:
            return int(value)
        match = _PERCENT.match(value)
        if match is not None and 1 <= int(match.group(1)) <= 100:
            return value
    raise ValueError(f"{where}: must be an integer >= 1 or a percent from 1% to 100%, got {value!r}")


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: must be an object")
    return value


def _namespaces(value: object, where: str) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ValueError(f"{where}: must be a list")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not _NAMESPACE.match(item):
            raise ValueError(f"{where}[{i}]: must be a namespace name")
    return frozenset(value)


def _boolean(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{where}: must be true or false")
    return value


def _number(value: object, where: str, *, minimum: float | None = None, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where}: must be a number")
    if integer and value != int(value):
        raise ValueError(f"{where}: must be an integer")
    if minimum is not None and value < minimum:
        raise ValueError(f"{where}: must be at least {minimum:g}")
    return float(value)


def _enum(kind: type[_E], value: object, where: str) -> _E:
    try:
        return kind(str(value)) if isinstance(value, str) else kind("")
    except ValueError:
        allowed = ", ".join(member.value for member in kind)
        raise ValueError(f"{where}: must be one of {allowed}, got {value!r}") from None
