"""The closed sets of names in the contract: conditions, actions, health, reasons.

They are `str` enums so that values compare equal to the strings stored in
the cluster and serialise without ceremony.
"""

import enum
from typing import Final


class Condition(enum.StrEnum):
    """A fact-derived condition a policy rule can match (DESIGN.md table). What each means and how it is
    judged is its row in `conditions.ROWS` (which derives the conditions a rule may name, and those
    IsolateGPU may answer)."""

    ECC_UNCORRECTABLE = "EccUncorrectable"
    ROW_REMAP_FAILURE = "RowRemapFailure"
    XID_CRITICAL = "XidCritical"
    GPU_LOST = "GPULost"
    RECOVERY_REQUIRED = "RecoveryRequired"
    THERMAL_THROTTLED = "ThermalThrottled"
    POWER_THROTTLED = "PowerThrottled"
    PCIE_DEGRADED = "PcieDegraded"
    NVLINK_DEGRADED = "NvLinkDegraded"
    """A GPU's NVLink lost a link it had up, or its CRC/replay/recovery errors grow faster than the rule's
    threshold per hour."""
    FABRIC_UNHEALTHY = "FabricUnhealthy"
    """A GPU's NVSwitch fabric registration failed, or is not completed (for the rule's forSeconds)."""
    NIC_DEGRADED = "NicDegraded"
    """An InfiniBand/RoCE port of the node went down after being up, runs below its highest rate seen, or
    its link-down / error counters grow faster than the rule's threshold per hour."""
    PCIE_ERRORS = "PcieErrors"
    """A GPU's PCIe function logged a fatal AER error, or its non-fatal AER errors grow."""
    MEMORY_DEGRADING = "MemoryDegrading"
    """Pre-failure: corrected ECC errors or correctable row remaps grow faster than the rule's threshold per
    hour, XID 92 (high single-bit ECC rate), or retired pages pending."""
    STRAGGLER = "Straggler"
    ACTIVE_CHECK_FAILED = "ActiveCheckFailed"
    """An active check's run failed (GPUNode `status.checks[]`, policy `spec.activeChecks`) and no later run
    of that check passed."""
    AGENT_STALE = "AgentStale"
    AGENT_ERROR = "AgentError"
    """The agent reports it cannot do its job (`status.agent.error`): health Unknown, never a disruption.
    Judged on every node like AgentStale; no policy rule names it."""
    GPU_OPERATOR_MAINTENANCE = "GPUOperatorMaintenance"
    """The GPU Operator upgrades the node's driver or reconfigures its MIG devices (its node labels say so):
    the GPUs come and go on purpose, so health is Unknown and nothing is disrupted. Judged on every node;
    no policy rule names it."""


NODE_CONDITION_PREFIX = "Node:"
"""How another tool's Node condition is named among ours (`status.issues`, `status.conditions`, Events)."""


class NodeCondition(str):
    """Another tool's Node condition a rule names (`nodeCondition: {type, status}`), keyed as ours are:
    `Node:KernelDeadlock` when the rule matches status "True", `Node:Ready=False` for another status.

    A `str` (as `Condition` values are) with `value` (as an enum member has), so it goes wherever a
    condition's name goes: the GPUNode's conditions and issues, Events, metric labels."""

    __slots__ = ()

    @property
    def value(self) -> str:
        return str(self)

    @property
    def node_type(self) -> str:
        """The Node condition's `type` (`KernelDeadlock`)."""
        return self.removeprefix(NODE_CONDITION_PREFIX).split("=", 1)[0]

    @property
    def status(self) -> str:
        """The Node condition `status` that makes it true ("True" unless the name says otherwise)."""
        _, _, status = self.partition("=")
        return status or "True"

    @property
    def label_value(self) -> str:
        """The name as a label or taint value can hold it (no ':' or '='): `Node.KernelDeadlock`."""
        return self.replace(":", ".").replace("=", ".")[:63].rstrip("-_.")

    def __str__(self) -> str:
        return str.__str__(self)


NODE_CONDITION_STATUSES: tuple[str, ...] = ("True", "False", "Unknown")

KUBELET_NODE_CONDITIONS: Final[tuple[str, ...]] = (
    "Ready",
    "MemoryPressure",
    "DiskPressure",
    "PIDPressure",
    "NetworkUnavailable",
)
"""Kubelet's own Node conditions. They flip on many nodes at once (an API server or network blip, a
full image disk), so a rule names one only with `nodeCondition.allowKubeletCondition: true` (the CRD
and the operator refuse it otherwise), and the chart's admission policy asks a grant of whoever writes
such a policy (docs/policy.md, "Privileged policies")."""
ALLOW_KUBELET_CONDITION: Final = "allowKubeletCondition"
"""The `nodeCondition` field that opts a rule in to one of KUBELET_NODE_CONDITIONS."""


def node_condition(node_type: str, status: str = "True") -> NodeCondition:
    """The key of a rule's `nodeCondition: {type: node_type, status: status}`."""
    suffix = "" if status == "True" else f"={status}"
    return NodeCondition(f"{NODE_CONDITION_PREFIX}{node_type}{suffix}")


def parse_node_condition(name: str) -> NodeCondition | None:
    """A `Node:...` name as `node_condition` writes it; None for anything else."""
    if not name.startswith(NODE_CONDITION_PREFIX):
        return None
    key = NodeCondition(name)
    if not key.node_type or key.status not in NODE_CONDITION_STATUSES:
        return None
    return key


ConditionKey = Condition | NodeCondition
"""What a rule matches and a verdict holds: one of our conditions, or another tool's Node condition."""


class Action(enum.StrEnum):
    """What a rule asks for, least to most disruptive."""

    EVENT = "Event"
    LABEL = "Label"
    TAINT = "Taint"
    ISOLATE_GPU = "IsolateGPU"
    """A DRA DeviceTaintRule on the faulty GPU only; the node ladder where the cluster cannot."""
    CORDON = "Cordon"
    DRAIN = "Drain"


ACTION_ORDER: dict[Action, int] = {a: i for i, a in enumerate(Action)}
"""Rank of each action by disruption; the strongest wanted action wins."""

DISRUPTIVE_ACTIONS: frozenset[Action] = frozenset({Action.CORDON, Action.DRAIN})
"""Actions that take capacity away and so count against maxUnavailable."""

DOMAIN_ACTIONS: frozenset[Action] = frozenset({Action.LABEL, Action.TAINT})
"""What `spec.topology.domains[].action` may ask for a degraded domain: never a cordon or drain."""


class IsolationEffect(enum.StrEnum):
    """`spec.isolation.effect`: the DeviceTaintRule's effect on the isolated GPU's pods."""

    NO_EXECUTE = "NoExecute"
    """Evict the pods using the GPU, and place no new ones on it."""
    NO_SCHEDULE = "NoSchedule"
    """Place no new pods on the GPU; leave running ones alone."""


class Health(enum.StrEnum):
    HEALTHY = "Healthy"
    DEGRADED = "Degraded"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"


class NodeAction(enum.StrEnum):
    """`status.action` on a GPUNode: what the operator has done to the node."""

    NONE = "None"
    EVENT = "Event"
    LABELED = "Labeled"
    TAINTED = "Tainted"
    CORDONED = "Cordoned"
    DRAINING = "Draining"
    DRAINED = "Drained"
    PENDING = "Pending"
    DRY_RUN = "DryRun"
    OVERRIDDEN = "Overridden"
    """Someone else made the node we cordoned schedulable; we act again only on new evidence."""
    DRILL = "Drill"
    """A fire drill runs on the node (GPUNode annotation `gpuhealth.io/drill`): said, not done."""
    ISOLATED = "Isolated"
    """GPUs of the node are isolated by DeviceTaintRules; the node itself stays schedulable."""
    REPAIRING = "Repairing"
    """A repair step (`spec.repair.steps`) runs on the drained node, or its effect is awaited."""
    VALIDATING = "Validating"
    """The repaired node's validation Job runs; a pass returns it to service at once."""
    RETIRED = "Retired"
    """Repair gave up (no step left, or too many cycles): cordoned with `gpuhealth.io/needs-repair=manual`."""


class EventReason(enum.StrEnum):
    """Event reasons beyond the condition names (which are reasons too)."""

    NODE_CORDONED = "NodeCordoned"
    NODE_DRAINED = "NodeDrained"
    DRAIN_FAILED = "DrainFailed"
    NODE_UNCORDONED = "NodeUncordoned"
    NODE_UNLABELED = "NodeUnlabeled"
    """A label of ours (`gpuhealth.io/straggler`, `/thermal-throttled`) was removed: no rule wants it now."""
    NODE_UNTAINTED = "NodeUntainted"
    """Our `gpuhealth.io/unhealthy` taint was removed: no Taint rule fires now."""
    BUDGET_EXCEEDED = "DisruptionBudgetExceeded"
    AGENT_STALE = "AgentStale"
    DRY_RUN = "DryRun"
    OVERRIDDEN_BY_USER = "OverriddenByUser"
    REMEDIATION_PAUSED = "RemediationPaused"
    """A running drain stopped (exclude label, dry run, policy deleted), or a deleted policy left a cordon;
    on a GPUHealthPolicy: its fleet circuit breaker tripped and no new cordon or drain starts."""
    DRILL = "Drill"
    GPU_ISOLATED = "GPUIsolated"
    """A DeviceTaintRule now isolates one faulty GPU (names its index and UUID)."""
    GPU_RESTORED = "GPURestored"
    """The DeviceTaintRule of a recovered GPU was deleted: the GPU is allocatable again."""
    DOMAIN_DEGRADED = "DomainDegraded"
    """A topology domain (`spec.topology.domains`) has too many Unhealthy nodes: its nodes are marked."""
    DOMAIN_RECOVERED = "DomainRecovered"
    """A degraded topology domain was below its threshold for recovery.healthyForSeconds: marks lifted."""
    REPAIR_STARTED = "RepairStarted"
    """A repair step's Job was created (names the step, its action and the GPUs)."""
    REPAIR_SUCCEEDED = "RepairSucceeded"
    """A repair cycle ended with a passed validation: the node is back in service."""
    REPAIR_FAILED = "RepairFailed"
    """A step failed (Job failed, could not be created, timed out, or its effect was not seen)."""
    VALIDATION_PASSED = "ValidationPassed"
    VALIDATION_FAILED = "ValidationFailed"
    NODE_RETIRED = "NodeRetired"
    """Repair gave up on the node: it stays cordoned with `gpuhealth.io/needs-repair=manual`."""
    CHECK_PASSED = "CheckPassed"
    """An active check's run passed (names the check, its template and its figures)."""
    CHECK_FAILED = "CheckFailed"
    """An active check's run failed or timed out; a failed run holds ActiveCheckFailed until a later pass."""
    CHECK_PREEMPTED = "CheckPreempted"
    """The scheduler preempted a check's pod for real work: tried again later, never a failure."""
    CHECK_REFUSED = "CheckRefused"
    """A request to check now (`kubectl gpuhealth check`) was not run: the message names its token and why."""


class RepairAction(enum.StrEnum):
    """`spec.repair.steps[].action`: what a repair step does (each runs as a Job on the node)."""

    RESET_GPU = "ResetGPU"
    """Reset the faulty GPUs only (`nvidia-smi --gpu-reset -i UUID`); effect: their volatile counters and
    XIDs read clean in the agent's next report."""
    REBOOT_NODE = "RebootNode"
    """Reboot through the host; effect: the agent reports a new `bootId`."""


VALIDATION_JOB: Final = "Validation"
"""The template key (and Job label value) of the validation that follows a successful step."""


class RepairResult(enum.StrEnum):
    """`status.repairs[].result` on a GPUNode."""

    STARTED = "Started"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    TIMED_OUT = "TimedOut"
    NO_EFFECT = "NoEffect"
    CANCELLED = "Cancelled"
    VALIDATION_PASSED = "ValidationPassed"
    VALIDATION_FAILED = "ValidationFailed"
    RETIRED = "Retired"


class CheckResult(enum.StrEnum):
    """`status.checks[].result` on a GPUNode: how an active check's run ended."""

    PASSED = "Passed"
    FAILED = "Failed"
    PREEMPTED = "Preempted"
    """The scheduler preempted the check's pod for real work: tried again later, never a failure."""
    TIMED_OUT = "TimedOut"


class AgentErrorReason(enum.StrEnum):
    """`status.agent.error.reason`: why the agent cannot report its node's GPUs."""

    NO_GPUS_VISIBLE = "NoGPUsVisible"
    """NVML shows the agent no GPU and it has seen none since it started: the container runtime hides
    them (or NVML cannot count them). A configuration error of the agent, not a fault of the GPUs."""


class RecoveryAction(enum.StrEnum):
    """NVML's GPU recovery-action names (nvmlDeviceGetFieldValues, FI_DEV_GET_GPU_RECOVERY_ACTION)."""

    NONE = "None"
    GPU_RESET = "GpuReset"
    NODE_REBOOT = "NodeReboot"
    DRAIN_P2P = "DrainP2P"
    DRAIN_AND_RESET = "DrainAndReset"
    RECOVER_IMEX_DOMAIN = "RecoverImexDomain"
    BUS_RESET = "BusReset"
    SYSTEM_REBOOT = "SystemReboot"


GPU_RECOVERY_ACTIONS: frozenset[RecoveryAction] = frozenset(
    {RecoveryAction.GPU_RESET, RecoveryAction.BUS_RESET}
)
"""Recovery actions whose cure touches the faulty GPU alone (a GPU reset, a reset of its PCIe bus).

Every other action but None is node-wide: a reboot of the node or system, a recovery of the IMEX
domain, or a drain of peer-to-peer traffic (DrainP2P, DrainAndReset: every process that talks to
the GPU over P2P must stop, on whichever GPU it runs), so isolating one GPU does not cure it."""


class PolicyConditionType(enum.StrEnum):
    """`status.conditions[].type` on a GPUHealthPolicy."""

    READY = "Ready"
    """True when the spec was accepted (reasons ACCEPTED / INVALID_SPEC)."""
    PAUSED = "Paused"
    """True while the fleet circuit breaker holds new disruptions back (FAULT_STORM / HALF_OPEN /
    BREAKER_CLOSED)."""
    GPU_ISOLATION = "GPUIsolation"
    """A policy with IsolateGPU: whether GPUs are isolated by DeviceTaintRules or fall back to the node
    ladder (DRY_RUN / NOT_PROBED / PROBE_FAILED / PROBE_TIMED_OUT / DEVICE_TAINT_RULES /
    NODE_LADDER_FALLBACK)."""
    REPAIR_PERMITTED = "RepairPermitted"
    """A policy with `spec.repair`: whether the Job API lets the operator create its Jobs
    (JOB_CREATE_REFUSED / JOBS_CREATED / NOT_TRIED)."""


class PolicyConditionReason(enum.StrEnum):
    """`status.conditions[].reason` on a GPUHealthPolicy (the type each belongs to in the comments)."""

    # Ready
    ACCEPTED = "Accepted"
    INVALID_SPEC = "InvalidSpec"
    # Paused
    FAULT_STORM = "FaultStorm"
    HALF_OPEN = "HalfOpen"
    BREAKER_CLOSED = "BreakerClosed"
    # GPUIsolation
    DRY_RUN = "DryRun"
    NOT_PROBED = "NotProbed"
    PROBE_FAILED = "ProbeFailed"
    PROBE_TIMED_OUT = "ProbeTimedOut"
    DEVICE_TAINT_RULES = "DeviceTaintRules"
    NODE_LADDER_FALLBACK = "NodeLadderFallback"
    # RepairPermitted
    JOB_CREATE_REFUSED = "JobCreateRefused"
    JOBS_CREATED = "JobsCreated"
    NOT_TRIED = "NotTried"
