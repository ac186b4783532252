"""IsolateGPU: quarantine one GPU through a DRA device taint, or fall back to the node ladder.

Where GPUs are allocated through Dynamic Resource Allocation, each GPU is a
device in its node's ResourceSlice, and a `DeviceTaintRule` (resource.k8s.io)
selecting exactly that device stops the scheduler giving it to new claims
and, with effect NoExecute, makes the controller manager evict only the pods
using it. The other GPUs of the node stay in service.

Isolation is only right when the fault is one GPU's and the cluster can
taint that GPU. So, per faulty GPU, this module decides one of:
- ISOLATE: a DeviceTaintRule on its device;
- WAIT: it should be isolated, but the policy's maxUnavailableGPUs is spent;
- NODE_LADDER: Cordon/Drain the node instead, with the reason in words:
  the cluster does not act on DeviceTaintRules; the GPU is no DRA device (a
  device-plugin node, or its UUID is in no ResourceSlice); the fault is
  node-wide (the driver asks for a node reboot, an NVLink/fabric or
  reboot-class XID, fewer GPUs answer than the node has and none is
  identifiable); or the node would have more than `maxGPUsPerNode` GPUs
  isolated. One GPU on the ladder takes the whole node there: draining a
  node already frees every GPU on it.

Faults are attributed to GPUs by the same per-GPU predicates the conditions
are judged by (`gpuhealth_api.faults`). The I/O layer supplies what only the
cluster knows, read with `device_taints`: the devices (`devices_by_uuid`
over the node's ResourceSlices), the API version to write rules in
(`served_version` over discovery; None when not served, or when the probe
rule is not `acknowledged`) and the GPU budget left (the operator's
`isolating` module). Until a node's GPUs are decided, IsolateGPU ranks and
acts as its fallback, Drain (`node_action`); `verdicts.with_isolation` takes
it off the node ladder once every faulty GPU is isolated or waits.

Pure: no kopf, no Kubernetes client.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Collection, Mapping, Sequence
from typing import Final

from gpuhealth_api import conditions as condition_table
from gpuhealth_api import faults, status, vocabulary, xid_catalogue
from gpuhealth_operator.decisions import device_taints, gpu_facts, hysteresis, model, signals

Action = vocabulary.Action
Condition = vocabulary.Condition

FALLBACK_ACTION: Final = Action.DRAIN
"""What IsolateGPU becomes on the node ladder: the GPU's pods must leave, so the node is drained."""
NODE_WIDE_XID_ACTIONS: Final = frozenset({"RESTART_BM", "WORKFLOW_NVLINK_ERR"})
"""XID catalogue actions whose cure reaches past the GPU: a node reboot, or the NVLink fabric GPUs share."""


def node_action(action: Action) -> Action:
    """The action the node ladder takes for a rule's action: IsolateGPU's fallback, else itself.

    Until the node's GPUs are decided (and whenever the decision is the node ladder),
    a fired IsolateGPU rule is ranked, budgeted and applied exactly as a Drain rule.
    """
    return FALLBACK_ACTION if action is Action.ISOLATE_GPU else action


DISRUPTING: Final = frozenset(a for a in Action if node_action(a) in vocabulary.DISRUPTIVE_ACTIONS)
"""The rule actions whose `node_action` is Cordon or Drain: a set to test rules against, not a call each."""


class Outcome(enum.StrEnum):
    ISOLATE = "Isolate"
    WAIT = "Wait"
    NODE_LADDER = "NodeLadder"


@dataclasses.dataclass(frozen=True)
class GPUFault:
    """One faulty GPU: which of the wanted conditions it shows, and why its fault may be node-wide."""

    index: int | None
    uuid: str | None
    conditions: tuple[Condition, ...]
    """Most severe first."""
    node_wide: str | None = None


@dataclasses.dataclass(frozen=True)
class Attribution:
    gpus: tuple[GPUFault, ...]
    unattributed: str | None = None
    """Why a wanted condition holds with no single GPU to blame (e.g. GPUs missing from enumeration)."""


@dataclasses.dataclass(frozen=True)
class GPUDecision:
    index: int | None
    uuid: str | None
    conditions: tuple[Condition, ...]
    outcome: Outcome
    reason: str
    device: device_taints.Device | None = None


@dataclasses.dataclass(frozen=True)
class NodeIsolation:
    gpus: tuple[GPUDecision, ...]
    node_ladder: str | None = None
    """Why the node is cordoned and drained instead; None when every faulty GPU isolates or waits."""

    def with_outcome(self, outcome: Outcome) -> tuple[GPUDecision, ...]:
        return tuple(gpu for gpu in self.gpus if gpu.outcome is outcome)


@dataclasses.dataclass(frozen=True)
class Support:
    """Whether the cluster acts on DeviceTaintRules, as probed for one generation of a policy."""

    generation: int
    api_version: str | None
    """The resource.k8s.io version rules are written in; None: IsolateGPU takes the node ladder."""
    message: str
    """The probe's finding in words (for the policy's status)."""
    definite: bool = True
    """False: no answer to act on (the probe met transient errors, or only discovery was read for a
    dry run or a drill); IsolateGPU then neither isolates nor falls back, and the probe is tried again."""
    at: datetime.datetime | None = None
    """When an answer that is not `definite` was found (the probe is tried again a little later)."""
    failing_since: datetime.datetime | None = None
    """When the probes of this generation began to meet only transient errors (None: not failing)."""
    timed_out: bool = False
    """The probe has failed for longer than the operator waits: the node ladder is taken meanwhile
    (`definite`, no `api_version`), and the probe is still tried again."""


@dataclasses.dataclass(frozen=True)
class Isolated:
    """One GPU with a DeviceTaintRule of ours, or whose rule someone else deleted (an override)."""

    index: int | None
    uuid: str
    rule: str
    since: str | None = None
    """When the evidence the rule was created on began (RFC 3339): newer evidence ends an override."""


@dataclasses.dataclass(frozen=True)
class NodeState:
    """What the operator knows of one node's isolation under one policy (GPUNode `status.isolatedGPUs`)."""

    decision: NodeIsolation | None = None
    in_place: tuple[Isolated, ...] = ()
    overridden: tuple[Isolated, ...] = ()
    """GPUs whose rule someone else deleted: not isolated again on the same evidence."""


def of_node(states: Sequence[NodeState]) -> NodeState:
    """A node's GPUs isolated (or overridden) under any of its policies, each GPU once, in the order
    given: what its GPUNode lists whichever policy's verdict the status reports. A GPU has one rule
    (its name is the node's and the GPU's), so one policy's own; isolated wins over overridden."""
    in_place: dict[str, Isolated] = {}
    overridden: dict[str, Isolated] = {}
    for state in states:
        for gpu in state.in_place:
            in_place.setdefault(gpu.uuid, gpu)
        for gpu in state.overridden:
            overridden.setdefault(gpu.uuid, gpu)
    return NodeState(
        None,
        tuple(in_place.values()),
        tuple(gpu for uuid, gpu in overridden.items() if uuid not in in_place),
    )


def may_restore(policy: model.Policy, verdict: model.NodeVerdict, now: datetime.datetime) -> bool:
    """Whether isolated GPUs free of fault may be given back: the policy's IsolateGPU conditions recovered.

    The same hysteresis as an uncordon: none of them True, each free of evidence for
    recovery.healthyForSeconds; a stale agent (health Unknown) releases nothing.
    """
    if verdict.health is vocabulary.Health.UNKNOWN:
        return False
    for condition in {r.condition for r in policy.rules if r.action is Action.ISOLATE_GPU}:
        state = verdict.conditions.get(condition)
        if state is None:
            continue
        if state.status == hysteresis.TRUE:
            return False
        since = hysteresis.healthy_since(state)
        if since is None or (now - since).total_seconds() < policy.recovery_healthy_for_seconds:
            return False
    return True


# --- whose fault --------------------------------------------------------------------------------


def attribute(
    facts: status.GPUNodeStatus,
    node: model.NodeView,
    wanted: Collection[vocabulary.ConditionKey],
    *,
    critical_xids: frozenset[int],
    catalogue: xid_catalogue.Catalogue | None = None,
) -> Attribution:
    """The GPUs showing a `wanted` condition (those of fired IsolateGPU rules), by the per-GPU predicates."""
    catalogue = catalogue or xid_catalogue.Catalogue.packaged()
    listed = listed_gpus(facts)
    found: list[GPUFault] = []
    for gpu in listed:
        shown = condition_table.gpu_faults(gpu, critical_xids)
        conditions = tuple(c for c in shown if c in wanted)
        if conditions:
            found.append(
                gpu_fault(gpu, conditions, node_wide=_node_wide(gpu, conditions, critical_xids, catalogue))
            )
    unattributed = None
    if Condition.GPU_LOST in wanted:
        # As the GPULost signal counts them; a GPU missing from the list has no UUID to taint.
        missing = faults.missing_gpus(len(listed), signals.expected_gpus(facts, node))
        if missing is not None:
            unattributed = f"GPULost: {missing}, and a GPU that is not listed has no device to taint"
    return Attribution(tuple(found), unattributed)


def listed_gpus(facts: status.GPUNodeStatus) -> list[status.GPUStatus]:
    """The GPUs the agent lists (malformed entries left out)."""
    gpus = facts.get("gpus")
    return [gpu for gpu in gpus if isinstance(gpu, gpu_facts.MAPPINGS)] if isinstance(gpus, list) else []


def gpu_fault(
    gpu: status.GPUStatus, conditions: tuple[Condition, ...], *, node_wide: str | None = None
) -> GPUFault:
    """`gpu`'s fault of `conditions`, named by its index and UUID where it reports valid ones."""
    index, uuid = gpu.get("index"), gpu.get("uuid")
    return GPUFault(
        index=index if isinstance(index, int) and not isinstance(index, bool) else None,
        uuid=uuid if isinstance(uuid, str) and uuid else None,
        conditions=conditions,
        node_wide=node_wide,
    )


def _node_wide(
    gpu: status.GPUStatus,
    conditions: Sequence[Condition],
    critical_xids: frozenset[int],
    catalogue: xid_catalogue.Catalogue,
) -> str | None:
    if Condition.RECOVERY_REQUIRED in conditions:
        # Every recovery action NVML defines but a GPU or bus reset (faults.node_wide_recovery).
        why = faults.node_wide_recovery(gpu)
        if why is not None:
            return why
    if Condition.XID_CRITICAL in conditions:
        for record in faults.matching_xids(gpu, critical_xids):
            info = catalogue.lookup(record["code"])
            if info.action in NODE_WIDE_XID_ACTIONS:
                return f"XID {info.code} ({info.name}) needs {_cure(info.action)}"
    return None


def _cure(action: str) -> str:
    return "a node reboot" if action == "RESTART_BM" else "the NVLink fabric the node's GPUs share reset"


# --- what to do ---------------------------------------------------------------------------------


def decide(
    attribution: Attribution,
    *,
    devices: Mapping[str, device_taints.Device],
    api_version: str | None,
    max_gpus_per_node: int,
    already_isolated: Collection[str] = (),
    budget_left: int,
    wait_reason: str | None = None,
) -> NodeIsolation:
    """Per faulty GPU: isolate, wait for the GPU budget, or the node ladder (module docstring).

    `api_version` is where rules are written, None when the cluster does not act on them;
    `already_isolated` are UUIDs of this node with a rule in place (they use no new budget);
    `budget_left` is how many more GPUs may be isolated now (the least room left under the
    maxUnavailableGPUs of every isolating policy that selects the node, or 0 while a breaker holds
    disruptions back); `wait_reason` says why a GPU waits when it is not maxUnavailableGPUs.
    """
    gpus = attribution.gpus
    if not gpus and attribution.unattributed is None:
        return NodeIsolation(())
    ladder = _node_ladder(attribution, devices, api_version, max_gpus_per_node, already_isolated)
    if ladder is not None:
        return NodeIsolation(
            tuple(
                GPUDecision(
                    gpu.index,
                    gpu.uuid,
                    gpu.conditions,
                    Outcome.NODE_LADDER,
                    _own_reason(gpu, devices) or ladder,
                    devices.get(gpu.uuid) if gpu.uuid is not None else None,
                )
                for gpu in sorted(gpus, key=_order)
            ),
            ladder,
        )
    decided: list[GPUDecision] = []
    for gpu in sorted(gpus, key=lambda g: (g.uuid not in already_isolated, _order(g))):
        device = devices[gpu.uuid or ""]
        if gpu.uuid in already_isolated:
            decided.append(
                GPUDecision(gpu.index, gpu.uuid, gpu.conditions, Outcome.ISOLATE, "isolated", device)
            )
        elif budget_left > 0:
            budget_left -= 1
            reason = f"{_name(gpu)} is device {device.name} of pool {device.pool}"
            decided.append(GPUDecision(gpu.index, gpu.uuid, gpu.conditions, Outcome.ISOLATE, reason, device))
        else:
            reason = wait_reason or "maxUnavailableGPUs reached: waits for an isolated GPU to recover"
            decided.append(GPUDecision(gpu.index, gpu.uuid, gpu.conditions, Outcome.WAIT, reason, device))
    return NodeIsolation(tuple(sorted(decided, key=_order)))


def undecided(attribution: Attribution, reason: str) -> NodeIsolation:
    """Every faulty GPU waits: whether the cluster acts on DeviceTaintRules is not known yet (the probe
    met only transient errors). Neither a rule nor the node ladder is taken on a guess."""
    return NodeIsolation(
        tuple(
            GPUDecision(g.index, g.uuid, g.conditions, Outcome.WAIT, reason)
            for g in sorted(attribution.gpus, key=_order)
        )
    )


@dataclasses.dataclass(frozen=True)
class GPUBudget:
    """One isolating policy's maxUnavailableGPUs as it stands: GPUs of its selected nodes under a
    DeviceTaintRule of gpu-health (any policy's), against its limit."""

    policy: str
    selected: frozenset[str]
    limit: int
    isolated: int


def budget_left(name: str, budgets: Sequence[GPUBudget]) -> tuple[int, str | None]:
    """How many more GPUs of node `name` may be isolated: the least room of every budget selecting it
    (one budget over all policies, as for cordons), and, with none left, whose budget is spent."""
    selecting = [b for b in budgets if name in b.selected]
    if not selecting:
        return 0, "no isolating policy selects the node"
    tightest = min(selecting, key=lambda b: (b.limit - b.isolated, b.policy))
    left = max(0, tightest.limit - tightest.isolated)
    if left > 0:
        return left, None
    return 0, (
        f"maxUnavailableGPUs of policy {tightest.policy} reached ({tightest.isolated} of its limit "
        f"{tightest.limit} isolated): waits for an isolated GPU to recover"
    )


def dry_run_changes(decision: NodeIsolation, named: str | None = None) -> list[str]:
    """What isolating would do, in the words of a dry run's Event (the node ladder says its own);
    `named`: how to name every GPU instead of by index and UUID (a drill's stand-in GPU)."""
    if decision.node_ladder is not None:
        return []
    words = {Outcome.ISOLATE: "isolate {}", Outcome.WAIT: "isolate {} once maxUnavailableGPUs allows"}
    said = []
    for gpu in decision.gpus:
        name = named or (f"GPU {gpu.index} ({gpu.uuid})" if gpu.index is not None else f"GPU {gpu.uuid}")
        if gpu.outcome is Outcome.WAIT and "maxUnavailableGPUs" not in gpu.reason:
            said.append(f"wait to isolate {name} ({gpu.reason})")  # the probe's answer, a breaker
        elif gpu.outcome in words:
            said.append(words[gpu.outcome].format(name))
    return said


def _node_ladder(
    attribution: Attribution,
    devices: Mapping[str, device_taints.Device],
    api_version: str | None,
    max_gpus_per_node: int,
    already_isolated: Collection[str],
) -> str | None:
    """Why the node goes to the ladder, most fundamental reason first; None to isolate."""
    if attribution.unattributed is not None:
        return f"node-wide fault: {attribution.unattributed}"
    for gpu in sorted(attribution.gpus, key=_order):
        if gpu.node_wide is not None:
            return f"node-wide fault on {_name(gpu)}: {gpu.node_wide}"
    if api_version is None:
        return (
            "the cluster does not act on DeviceTaintRules (resource.k8s.io version not served, "
            "or feature gate DRADeviceTaintRules off)"
        )
    for gpu in sorted(attribution.gpus, key=_order):
        own = _own_reason(gpu, devices)
        if own is not None:
            return own
    isolated = {g.uuid for g in attribution.gpus} | set(already_isolated)
    if len(isolated) > max_gpus_per_node:
        return (
            f"{len(isolated)} GPUs of the node would be isolated, more than isolation.maxGPUsPerNode "
            f"({max_gpus_per_node})"
        )
    return None


def _own_reason(gpu: GPUFault, devices: Mapping[str, device_taints.Device]) -> str | None:
    """Why this GPU cannot be isolated whatever the rest of the node does."""
    if gpu.uuid is None:
        return f"{_name(gpu)} reports no UUID to find its DRA device by"
    if gpu.uuid not in devices:
        return f"{_name(gpu)} is no DRA device (no ResourceSlice of the node lists UUID {gpu.uuid})"
    return None


def _order(gpu: GPUFault | GPUDecision) -> tuple[int, str]:
    return (gpu.index if gpu.index is not None else faults.MAX_GPUS, gpu.uuid or "")


def _name(gpu: GPUFault) -> str:
    return f"GPU {gpu.index}" if gpu.index is not None else f"GPU {gpu.uuid or '?'}"
