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
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from gpuhealth_api import conditions, keys, vocabulary
from gpuhealth_operator.decisions import breaker, model, spec_fields, step_kinds

Condition = vocabulary.Condition

DEFAULT_MAX_UNAVAILABLE: Final = "10%"
DEFAULT_STRAGGLER_THRESHOLD: Final = 3.5
DEFAULT_CRITICAL_XIDS = spec_fields.DEFAULT_CRITICAL_XIDS
"""XIDs an XidCritical rule without `xids` acts on (`spec_fields`)."""
DEFAULT_MAX_GPUS_PER_NODE = spec_fields.DEFAULT_MAX_GPUS_PER_NODE
MAX_GPUS_PER_NODE_LIMIT = spec_fields.MAX_GPUS_PER_NODE_LIMIT
MAX_TOPOLOGY_ENTRIES = spec_fields.MAX_TOPOLOGY_ENTRIES

_STALE_ACTIONS: Final = frozenset({vocabulary.Action.EVENT, vocabulary.Action.LABEL})
"""Missing data is never a reason to disrupt a node (the CRD enforces the same)."""


def parse_policy(name: str, generation: int, spec: Mapping[str, Any]) -> model.Policy:
    """A Policy from a GPUHealthPolicy's `spec`; ValueError naming the field if it is invalid."""
    if not isinstance(spec, Mapping):
        raise ValueError("spec: must be an object")
    selector = spec_fields.mapping(spec.get("nodeSelector"), "spec.nodeSelector")
    drain = spec_fields.mapping(spec.get("drain"), "spec.drain")
    recovery = spec_fields.mapping(spec.get("recovery"), "spec.recovery")
    breaker_spec = spec_fields.mapping(spec.get("breaker"), "spec.breaker")
    isolation = spec_fields.mapping(spec.get("isolation"), "spec.isolation")
    grace = drain.get("gracePeriodSeconds")
    if grace is not None:
        grace = int(spec_fields.number(grace, "spec.drain.gracePeriodSeconds", minimum=0, integer=True))
    return model.Policy(
        name=name,
        generation=generation,
        match_labels=spec_fields.match_labels(selector.get("matchLabels")),
        match_expressions=spec_fields.match_expressions(selector.get("matchExpressions")),
        dry_run=spec_fields.boolean(spec.get("dryRun", False), "spec.dryRun"),
        max_unavailable=spec_fields.max_unavailable(spec.get("maxUnavailable", DEFAULT_MAX_UNAVAILABLE)),
        max_unavailable_gpus=spec_fields.max_unavailable(
            spec.get("maxUnavailableGPUs", DEFAULT_MAX_UNAVAILABLE), "spec.maxUnavailableGPUs"
        ),
        isolation_max_gpus_per_node=spec_fields.max_gpus_per_node(isolation.get("maxGPUsPerNode")),
        isolation_effect=spec_fields.enum(
            vocabulary.IsolationEffect,
            isolation.get("effect", vocabulary.IsolationEffect.NO_EXECUTE.value),
            "spec.isolation.effect",
        ),
        rules=_rules(spec.get("rules")),
        drain_timeout_seconds=spec_fields.number(
            drain.get("timeoutSeconds", 900), "spec.drain.timeoutSeconds", minimum=1
        ),
        drain_grace_period_seconds=grace,
        drain_delete_empty_dir_data=spec_fields.boolean(
            drain.get("deleteEmptyDirData", True), "spec.drain.deleteEmptyDirData"
        ),
        drain_force=spec_fields.boolean(drain.get("force", False), "spec.drain.force"),
        drain_exclude_namespaces=spec_fields.namespaces(
            drain.get("excludeNamespaces"), "spec.drain.excludeNamespaces"
        ),
        recovery_uncordon=spec_fields.boolean(recovery.get("uncordon", True), "spec.recovery.uncordon"),
        recovery_healthy_for_seconds=spec_fields.number(
            recovery.get("healthyForSeconds", 600), "spec.recovery.healthyForSeconds", minimum=0
        ),
        breaker_max_new_unhealthy=spec_fields.max_unavailable(
            breaker_spec.get("maxNewUnhealthy", breaker.DEFAULT_MAX_NEW_UNHEALTHY),
            "spec.breaker.maxNewUnhealthy",
        ),
        breaker_window_seconds=spec_fields.number(
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


def selecting(candidates: Iterable[model.Policy], node: model.NodeView) -> list[model.Policy]:
    """Those of `candidates` that select the node (`selects`), in their order: one call for them all."""
    if excluded(node):
        return []
    return [p for p in candidates if matches(p, node)]


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
    match = spec_fields.PERCENT.match(value)
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
        raw = spec_fields.mapping(item, where)
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
            condition = spec_fields.node_condition(raw["nodeCondition"], f"{where}.nodeCondition")
        else:
            condition = spec_fields.enum(vocabulary.Condition, raw.get("condition"), f"{where}.condition")
        action = spec_fields.enum(vocabulary.Action, raw.get("action"), f"{where}.action")
        if condition is Condition.AGENT_STALE and action not in _STALE_ACTIONS:
            raise ValueError(f"{where}.action: must be Event or Label when condition is AgentStale")
        if action is vocabulary.Action.ISOLATE_GPU and condition not in conditions.PER_GPU_CONDITIONS:
            raise ValueError(
                f"{where}.action: IsolateGPU needs a fault of one GPU (condition EccUncorrectable, "
                "RowRemapFailure, XidCritical, GPULost or RecoveryRequired)"
            )
        for_seconds = spec_fields.number(raw.get("forSeconds", 0), f"{where}.forSeconds", minimum=0)
        threshold = None
        if condition is Condition.STRAGGLER:
            threshold = spec_fields.number(
                raw.get("threshold", DEFAULT_STRAGGLER_THRESHOLD), f"{where}.threshold"
            )
            if threshold <= 0:
                raise ValueError(f"{where}.threshold: must be greater than 0")
        elif condition in conditions.DEFAULT_THRESHOLDS and raw.get("threshold") is not None:
            # growth per hour the trend tolerates; omitted: conditions.DEFAULT_THRESHOLDS
            threshold = spec_fields.number(raw["threshold"], f"{where}.threshold", minimum=0)
        xids: frozenset[int] = frozenset()
        if condition is Condition.XID_CRITICAL:
            xids = spec_fields.xids(raw.get("xids"), f"{where}.xids")
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
    raw = spec_fields.mapping(value, "spec.topology")
    budgets: list[model.TopologyBudget] = []
    for i, item in enumerate(spec_fields.list(raw.get("budgets"), "spec.topology.budgets")):
        where = f"spec.topology.budgets[{i}]"
        entry = spec_fields.mapping(item, where)
        key = spec_fields.label_key(entry.get("key"), f"{where}.key")
        if any(b.key == key for b in budgets):
            raise ValueError(f"{where}.key: duplicate key {key!r}")
        if "maxUnavailable" not in entry:
            raise ValueError(f"{where}.maxUnavailable: required")
        budgets.append(
            model.TopologyBudget(
                key=key,
                max_unavailable=spec_fields.max_unavailable(
                    entry["maxUnavailable"], f"{where}.maxUnavailable"
                ),
            )
        )
    domains: list[model.TopologyDomain] = []
    for i, item in enumerate(spec_fields.list(raw.get("domains"), "spec.topology.domains")):
        where = f"spec.topology.domains[{i}]"
        entry = spec_fields.mapping(item, where)
        key = spec_fields.label_key(entry.get("key"), f"{where}.key")
        if any(d.key == key for d in domains):
            raise ValueError(f"{where}.key: duplicate key {key!r}")
        if "unhealthy" not in entry:
            raise ValueError(f"{where}.unhealthy: required")
        action = spec_fields.enum(vocabulary.Action, entry.get("action", "Label"), f"{where}.action")
        if action not in vocabulary.DOMAIN_ACTIONS:
            raise ValueError(f"{where}.action: must be one of Label, Taint, got {action.value!r}")
        domains.append(
            model.TopologyDomain(
                key=key,
                unhealthy=spec_fields.max_unavailable(entry["unhealthy"], f"{where}.unhealthy"),
                action=action,
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
    raw = spec_fields.mapping(value, "spec.repair")
    items = raw.get("steps")
    if not isinstance(items, Sequence) or isinstance(items, str) or not items:
        raise ValueError("spec.repair.steps: required, a list of 1 to 4 steps")
    if len(items) > MAX_REPAIR_STEPS:
        raise ValueError(f"spec.repair.steps: must have at most {MAX_REPAIR_STEPS} items")
    steps: list[model.RepairStep] = []
    for i, item in enumerate(items):
        where = f"spec.repair.steps[{i}]"
        entry = spec_fields.mapping(item, where)
        name = entry.get("name")
        if not isinstance(name, str) or not _STEP_NAME.match(name):
            raise ValueError(f"{where}.name: required, a lowercase DNS label like 'reset', got {name!r}")
        if any(s.name == name for s in steps):
            raise ValueError(f"{where}.name: duplicate name {name!r}")
        action = spec_fields.enum(vocabulary.RepairAction, entry.get("action"), f"{where}.action")
        timeout = spec_fields.number(
            entry.get("timeoutSeconds", DEFAULT_STEP_TIMEOUTS[action]),
            f"{where}.timeoutSeconds",
            minimum=1,
            integer=True,
        )
        steps.append(model.RepairStep(name=name, action=action, timeout_seconds=timeout))
    validation: float | None = None
    new_nodes = False
    if raw.get("validation") is not None:
        checks = spec_fields.mapping(raw.get("validation"), "spec.repair.validation")
        validation = spec_fields.number(
            checks.get("timeoutSeconds", DEFAULT_VALIDATION_TIMEOUT),
            "spec.repair.validation.timeoutSeconds",
            minimum=1,
            integer=True,
        )
        new_nodes = spec_fields.boolean(checks.get("newNodes", False), "spec.repair.validation.newNodes")
    return model.RepairSpec(
        steps=tuple(steps),
        validation_timeout_seconds=validation,
        validation_new_nodes=new_nodes,
        max_concurrent=spec_fields.max_unavailable(raw.get("maxConcurrent", 1), "spec.repair.maxConcurrent"),
        max_attempts=int(
            spec_fields.number(raw.get("maxAttempts", 3), "spec.repair.maxAttempts", minimum=1, integer=True)
        ),
        attempt_window_seconds=spec_fields.number(
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
        if item is None:  # spec_fields.mapping takes None for an omitted object; an entry is never omitted
            raise ValueError(f"{where}: must be an object")
        entry = spec_fields.mapping(item, where)
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
            threshold = spec_fields.number(threshold, f"{where}.threshold", minimum=0)
            if threshold <= 0:
                raise ValueError(f"{where}.threshold: must be greater than 0")
        checks.append(
            model.ActiveCheck(
                name=name,
                template=template,
                every_seconds=spec_fields.number(
                    entry.get("everySeconds", DEFAULT_CHECK_EVERY_SECONDS),
                    f"{where}.everySeconds",
                    minimum=MIN_CHECK_EVERY_SECONDS,
                    integer=True,
                ),
                idle_for_seconds=spec_fields.number(
                    entry.get("idleForSeconds", DEFAULT_CHECK_IDLE_FOR_SECONDS),
                    f"{where}.idleForSeconds",
                    minimum=0,
                    integer=True,
                ),
                timeout_seconds=spec_fields.number(
                    entry.get("timeoutSeconds", DEFAULT_CHECK_TIMEOUT_SECONDS),
                    f"{where}.timeoutSeconds",
                    minimum=1,
                    integer=True,
                ),
                max_concurrent=spec_fields.max_unavailable(
                    entry.get("maxConcurrent", DEFAULT_CHECK_MAX_CONCURRENT), f"{where}.maxConcurrent"
                ),
                threshold=threshold,
            )
        )
    return tuple(checks)


def resolve_check_max_concurrent(check: model.ActiveCheck, selected_count: int) -> int:
    """A check's `maxConcurrent` in nodes: an int, or a percent of `selected_count`; at least 1."""
    return _resolve_budget(check.max_concurrent, selected_count)
