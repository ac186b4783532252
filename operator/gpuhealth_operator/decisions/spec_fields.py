"""The field parsers every part of a policy's spec is read with: lists, mappings, numbers, booleans,
enums, label keys and selectors, namespaces, node conditions, XIDs, budgets. Each raises ValueError
naming the field (`spec.rules[2].action`), as `policies.parse_policy` reports it.

Split from `decisions/policies.py` (issue 46): the leaves of the parser.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, TypeVar

from gpuhealth_api import keys, vocabulary, xid_catalogue
from gpuhealth_operator.decisions import model

DEFAULT_CRITICAL_XIDS: Final[frozenset[int]] = xid_catalogue.default_critical()
"""XIDs an XidCritical rule without `xids` acts on: the catalogue's critical ones (a GPU reset, a node
reboot or worse, as NVIDIA's XID catalogue resolves them), the same that make `check` exit 1."""
PERCENT = re.compile(r"^(\d{1,3})%$")
NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
SELECTOR_OPERATORS: Final = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})
_E = TypeVar(
    "_E", vocabulary.Condition, vocabulary.Action, vocabulary.IsolationEffect, vocabulary.RepairAction
)
DEFAULT_MAX_GPUS_PER_NODE: Final = 2
MAX_GPUS_PER_NODE_LIMIT: Final = 64
"""The CRD's maximum for spec.isolation.maxGPUsPerNode."""
MAX_TOPOLOGY_ENTRIES: Final = 8
"""The CRD's maxItems for spec.topology.budgets and spec.topology.domains."""
LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def list(value: object, where: str) -> Sequence[object]:
    if value is None:
        return ()
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ValueError(f"{where}: must be a list")
    if len(value) > MAX_TOPOLOGY_ENTRIES:
        raise ValueError(f"{where}: must have at most {MAX_TOPOLOGY_ENTRIES} items")
    return value


def label_key(value: object, where: str) -> str:
    """A Kubernetes label key: an optional DNS subdomain prefix (at most 253) and '/', a name (at most 63)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where}: required, a label key")
    prefix, slash, label = value.rpartition("/")
    if not LABEL_NAME.match(label) or (slash and (len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix))):
        raise ValueError(f"{where}: must be a label key like 'topology.kubernetes.io/zone', got {value!r}")
    return value


NODE_CONDITION_TYPE = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


def node_condition(value: object, where: str) -> vocabulary.NodeCondition:
    """A rule's `nodeCondition: {type, status}` (status default "True"): another tool's Node condition."""
    raw = mapping(value, where)
    kind, wanted = raw.get("type"), raw.get("status", "True")
    if not isinstance(kind, str) or not NODE_CONDITION_TYPE.match(kind):
        raise ValueError(f"{where}.type: required, a Node condition type (for example KernelDeadlock)")
    if kind == keys.NODE_CONDITION_TYPE:
        raise ValueError(f"{where}.type: {kind} is gpu-health's own Node condition")
    if wanted not in vocabulary.NODE_CONDITION_STATUSES:
        raise ValueError(f"{where}.status: must be True, False or Unknown")
    opt_in = vocabulary.ALLOW_KUBELET_CONDITION
    allowed = boolean(raw.get(opt_in, False), f"{where}.{opt_in}")
    if kind in vocabulary.KUBELET_NODE_CONDITIONS and not allowed:
        # The CRD refuses it too; this is for a cluster whose CRD is older than the rule (issue 45).
        raise ValueError(
            f"{where}.type: {kind} is kubelet's own Node condition, which can flip on every node at once: "
            f"a rule names it only with {opt_in}: true"
        )
    return vocabulary.node_condition(kind, wanted)


def xids(value: object, where: str) -> frozenset[int]:
    if value is None:
        return DEFAULT_CRITICAL_XIDS
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise ValueError(f"{where}: must be a non-empty list of XID codes")
    return frozenset(int(number(x, f"{where}[{i}]", minimum=1, integer=True)) for i, x in enumerate(value))


def match_labels(value: object) -> dict[str, str]:
    labels = mapping(value, "spec.nodeSelector.matchLabels")
    for key, label in labels.items():
        if not isinstance(key, str) or not isinstance(label, str):
            raise ValueError(f"spec.nodeSelector.matchLabels[{key!r}]: keys and values must be strings")
    return dict(labels)


def match_expressions(value: object) -> tuple[model.LabelSelectorRequirement, ...]:
    if value is None:
        return ()
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ValueError("spec.nodeSelector.matchExpressions: must be a list")
    requirements = []
    for i, item in enumerate(value):
        where = f"spec.nodeSelector.matchExpressions[{i}]"
        raw = mapping(item, where)
        key, operator, values = raw.get("key"), raw.get("operator"), raw.get("values") or []
        if not isinstance(key, str) or not key:
            raise ValueError(f"{where}.key: required, a non-empty string")
        if operator not in SELECTOR_OPERATORS:
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


def max_gpus_per_node(value: object) -> int:
    where = "spec.isolation.maxGPUsPerNode"
    if value is None:
        return DEFAULT_MAX_GPUS_PER_NODE
    count = int(number(value, where, minimum=1, integer=True))
    if count > MAX_GPUS_PER_NODE_LIMIT:
        raise ValueError(f"{where}: must be at most {MAX_GPUS_PER_NODE_LIMIT}")
    return count


def max_unavailable(value: object, where: str = "spec.maxUnavailable") -> int | str:
    if isinstance(value, bool):
        raise ValueError(f"{where}: must be an integer or a percent like '10%'")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"{where}: must be at least 1")
        return value
    if isinstance(value, str):
        if value.isdigit() and int(value) >= 1:
            return int(value)
        match = PERCENT.match(value)
        if match is not None and 1 <= int(match.group(1)) <= 100:
            return value
    raise ValueError(f"{where}: must be an integer >= 1 or a percent from 1% to 100%, got {value!r}")


def mapping(value: object, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: must be an object")
    return value


def namespaces(value: object, where: str) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ValueError(f"{where}: must be a list")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not NAMESPACE.match(item):
            raise ValueError(f"{where}[{i}]: must be a namespace name")
    return frozenset(value)


def boolean(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{where}: must be true or false")
    return value


def number(value: object, where: str, *, minimum: float | None = None, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where}: must be a number")
    if integer and value != int(value):
        raise ValueError(f"{where}: must be an integer")
    if minimum is not None and value < minimum:
        raise ValueError(f"{where}: must be at least {minimum:g}")
    return float(value)


def enum(kind: type[_E], value: object, where: str) -> _E:
    try:
        return kind(str(value)) if isinstance(value, str) else kind("")
    except ValueError:
        allowed = ", ".join(member.value for member in kind)
        raise ValueError(f"{where}: must be one of {allowed}, got {value!r}") from None
