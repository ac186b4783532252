"""Plain data the decision core consumes and produces.

The I/O layers translate cluster objects into these and back; the decision
modules never see a raw Kubernetes body.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
from collections.abc import Mapping

from gpuhealth_api import keys, status, vocabulary


@dataclasses.dataclass(frozen=True)
class Rule:
    name: str
    condition: vocabulary.ConditionKey
    """One of our conditions (`condition`), or another tool's Node condition (`nodeCondition`)."""
    action: vocabulary.Action
    for_seconds: float = 0.0
    """How long the condition must hold before the rule fires (hysteresis on the way in)."""
    threshold: float | None = None
    """Straggler: robust z-score below the cohort median that flags a node. NvLinkDegraded, NicDegraded,
    PcieErrors, MemoryDegrading: the growth per hour of their counters tolerated (None: the default)."""
    xids: frozenset[int] = frozenset()
    """XidCritical only: the XID codes this rule treats as critical."""


@dataclasses.dataclass(frozen=True)
class LabelSelectorRequirement:
    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist
    values: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class TopologyBudget:
    """`spec.topology.budgets[]`: at most `max_unavailable` unschedulable nodes per value of label `key`."""

    key: str
    max_unavailable: int | str
    """An int, or a percent string of the domain's selected GPU nodes; at least 1 either way."""


@dataclasses.dataclass(frozen=True)
class TopologyDomain:
    """`spec.topology.domains[]`: a domain (a value of `key`) with `unhealthy` Unhealthy nodes is degraded."""

    key: str
    unhealthy: int | str
    """An int, or a percent string of the domain's selected GPU nodes."""
    action: vocabulary.Action = vocabulary.Action.LABEL
    """Label or Taint (`vocabulary.DOMAIN_ACTIONS`)."""


@dataclasses.dataclass(frozen=True)
class Topology:
    """`spec.topology`: budgets and actions per failure domain; empty when the policy has none."""

    budgets: tuple[TopologyBudget, ...] = ()
    domains: tuple[TopologyDomain, ...] = ()


@dataclasses.dataclass(frozen=True)
class RepairStep:
    """`spec.repair.steps[]`: one repair step, run as a Job on the node from its action's template."""

    name: str
    action: vocabulary.RepairAction
    timeout_seconds: float


@dataclasses.dataclass(frozen=True)
class RepairSpec:
    """`spec.repair`: the steps tried in order on a node the policy cordoned and drained, then validation."""

    steps: tuple[RepairStep, ...]
    validation_timeout_seconds: float | None = None
    """None: no validation Job (a successful step returns the node after recovery.healthyForSeconds)."""
    validation_new_nodes: bool = False
    max_concurrent: int | str = 1
    """Repairs in progress at once, all policies together: an int, or a percent string of the policy's
    selected GPU nodes (rounded down, at least 1)."""
    max_attempts: int = 3
    attempt_window_seconds: float = 604800.0


@dataclasses.dataclass(frozen=True)
class ActiveCheck:
    """`spec.activeChecks[]`: a check Job run on each selected idle node at least every `every_seconds`."""

    name: str
    template: str
    """A key of the chart's check templates (DcgmDiagQuick, DcgmDiag, or the user's own)."""
    every_seconds: float
    idle_for_seconds: float
    """No pod using GPUs on the node for this long before a check starts."""
    timeout_seconds: float
    max_concurrent: int | str
    """Checks in flight at once, all policies together: an int, or a percent string of the selected GPU
    nodes of all policies with checks (rounded down, at least 1)."""
    threshold: float | None = None
    """A reported figure this many robust z-scores below same-model nodes fails the run; None: none."""


@dataclasses.dataclass(frozen=True)
class Policy:
    name: str
    generation: int = 0
    match_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    match_expressions: tuple[LabelSelectorRequirement, ...] = ()
    dry_run: bool = False
    max_unavailable: int | str = "10%"
    """An int, or a percent string of the nodes the policy selects; at least 1 either way."""
    rules: tuple[Rule, ...] = ()
    drain_timeout_seconds: float = 900.0
    drain_grace_period_seconds: int | None = None
    drain_delete_empty_dir_data: bool = True
    drain_force: bool = False
    """Evict pods that have no controller too."""
    drain_exclude_namespaces: frozenset[str] = frozenset()
    recovery_uncordon: bool = True
    recovery_healthy_for_seconds: float = 600.0
    max_unavailable_gpus: int | str = "10%"
    """IsolateGPU's budget: an int, or a percent string of the GPUs on the selected nodes; at least 1."""
    isolation_max_gpus_per_node: int = 2
    """More faulty GPUs than this on one node: the node ladder (Cordon/Drain) instead of isolation."""
    isolation_effect: vocabulary.IsolationEffect = vocabulary.IsolationEffect.NO_EXECUTE
    breaker_max_new_unhealthy: int | str = "5%"
    """The fleet circuit breaker: an int, or a percent string of the selected GPU nodes; at least 1."""
    breaker_window_seconds: float = 600.0
    topology: Topology = Topology()
    """`spec.topology`: per-domain budgets (on top of max_unavailable) and domain actions."""
    repair: RepairSpec | None = None
    """`spec.repair`: None (omitted) keeps a drained node cordoned until recovery.healthyForSeconds."""
    active_checks: tuple[ActiveCheck, ...] = ()
    """`spec.activeChecks`: none when omitted."""
    created: str = ""
    """metadata.creationTimestamp (RFC 3339; "" unknown): a node created later is new to the policy."""


@dataclasses.dataclass(frozen=True)
class NodeView:
    """What the decision core needs to know of a Node."""

    name: str
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    unschedulable: bool = False
    taint_keys: frozenset[str] = frozenset()
    gpu_capacity: int | None = None
    """`nvidia.com/gpu` capacity the node advertises, if any."""
    conditions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The Node's `status.conditions` by type → status (other tools' too: node-problem-detector's,
    a cloud's maintenance conditions), but our own GPUHealthy; what `nodeCondition` rules match."""

    @functools.cached_property
    def cordoned_by(self) -> str | None:
        """The policy our cordon annotation names. Answered once per view: every step of a pass over the
        node (adopt, override, repair, announce, drain) asks it of the same version."""
        return self.annotations.get(keys.CORDONED_BY_ANNOTATION)


@dataclasses.dataclass(frozen=True)
class Signal:
    """A condition's raw evidence at one instant, before hysteresis.

    `present` is None when the facts cannot tell (stale agent, GPUs not yet
    reported): unknown is neither fault nor health, and keeps the previous state.
    """

    condition: vocabulary.ConditionKey
    present: bool | None
    message: str
    observed_at: datetime.datetime | None = None
    """Since when the evidence holds by the operator's clock (a stale agent's, a straggler's window, a
    drill's start); None: from now, its receipt. Never the agent's stamps: its clock may be off."""


class ConditionRecord(status.ConditionStatus, total=False):
    """A `status.conditions[]` item with our hysteresis timestamps (RFC 3339)."""

    observedSince: str
    recoveringSince: str


@dataclasses.dataclass(frozen=True, slots=True)
class ConditionState:
    """One condition of one node, as kept in GPUNode `status.conditions[]`.

    `observed_since` and `recovering_since` make hysteresis survive restarts:
    the raw signal's first sighting in this episode, and the first sighting
    of its absence while the condition is still held True.
    """

    type: vocabulary.ConditionKey
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str
    last_transition_time: datetime.datetime
    observed_since: datetime.datetime | None = None
    recovering_since: datetime.datetime | None = None
    """On a True condition: evidence absent since (clearing after clear_seconds).
    On a False condition: evidence absent since (the recovery clock); None means
    since `last_transition_time`."""


@dataclasses.dataclass(frozen=True)
class StragglerScore:
    score: float
    z_score: float
    peers: int
    flagged: bool
    """Below -threshold against a cohort of at least 4 peers (before forSeconds)."""
    since: datetime.datetime | None = None
    """Flagged on a window of samples (stragglers.windowed): the window's oldest sample."""


@dataclasses.dataclass(frozen=True)
class NodeVerdict:
    """The judgement of one node under one policy at one instant."""

    node: str
    conditions: Mapping[vocabulary.ConditionKey, ConditionState]
    health: vocabulary.Health
    issues: tuple[vocabulary.ConditionKey, ...]
    """True conditions, most severe first."""
    fired_rules: tuple[Rule, ...]
    """Rules whose condition holds (after forSeconds), strongest action first."""
    wanted_action: vocabulary.Action | None
    """The strongest action of the fired rules; None when nothing fired."""
    wanted_labels: Mapping[str, str | None]
    """Node labels to set (value) or remove (None)."""
    wanted_taint: str | None
    """Value of the gpuhealth.io/unhealthy taint to hold, or None to remove ours."""
    recovered: bool
    """Healthy for recovery.healthyForSeconds: our cordon/taint may be lifted."""
    detected_at: datetime.datetime | None
    """Earliest observation time of the facts behind the fired disruptive rule."""
    overridden: bool = False
    """A human overrode our cordon and the evidence is no newer: Cordon/Drain fired but is not wanted."""


@dataclasses.dataclass(frozen=True)
class BudgetPlan:
    admitted: frozenset[str]
    """Nodes that may be cordoned/drained now."""
    pending: tuple[str, ...]
    """Nodes that want disruption but wait, in the order they will be admitted."""
    limit: int


StatusFacts = status.GPUNodeStatus
