"""Backtest: replay a trace through the operator's own code under a simulated clock.

Nothing of the operator is re-implemented here. Each trace record becomes the
watch event the operator would have received, handed to its own kopf handlers
through its replay entry point (`gpuhealth_operator.replay.Operator`), a term
of the operator whose client is an in-memory cluster (`memcluster.MemoryKube`)
and whose clock is the trace's time; between records the operator's own timer
pass (`Operator.tick`) runs every `tick_seconds` of simulated time. So the
signals, hysteresis, stragglers, the budget, the action ladder, recovery and
the human-override rules are the ones the live operator runs, whatever they
become.

What differs from a live run, on purpose: the timer ticks every
`tick_seconds` (default 30 s) instead of every second, with a full pass
(and the policies' status) every FULL_PASS_SECONDS of simulated time; a trace holds no pods, so every
drain completes at once; the operator's own writes are not echoed back as
watch events (its cache already holds them, so live they change nothing).

IsolateGPU reads the cluster's DRA objects, not a watch: a trace's
ResourceSlices and its answer to whether DeviceTaintRules are acted on go
straight into the in-memory cluster (`_dra`), and the rules the operator
creates and deletes there are reported as `Isolate GPU <index>` and
`Restore GPU <index>`.

Node records in a trace carry what others did to a Node (labels, capacity, a
human's cordon): the operator's labels (OUR_LABELS), its annotations and its
taint (keys under gpuhealth.io) stay as the replay made them; `unschedulable`
is applied when it changed between two versions of the trace (someone
cordoned or uncordoned), never otherwise, and not when the operator's
`cordoned-by` annotation changed in the same version (the recorded operator's
own cordon or uncordon, in a trace of an acting policy). A Node's first
version is the cluster's state when the recording found it, the operator's
marks included: a recording that starts on a policy's cordon replays it as
that policy's (live, it uncordons the node once healthy). A Node's deletion
(format 3) takes it out of the fleet, its figures and the budget, and the
DeviceTaintRules it owns with it, as the cluster's garbage collector does.

A `job` record (format 5) is the end of one of the recorded operator's repair
Jobs: the replay's operator creates its own Jobs in the in-memory cluster, where
none runs, and one of the same name (derived from the node, the cycle and the
step) ends as the recorded one did, when it did. A trace without them (older, or
recorded without the right to list Jobs) leaves a replay's repair Jobs running:
each step times out, and only a reboot's new bootId in the trace counts.

A `check` record (format 6) is an active check's run the recording saw end (an
entry of GPUNode `status.checks[]`): a replay runs no check Jobs (its operator's
check step is off), so the run is handed to the operator at its time
(`Operator.check_run`), which adds it to the node's history as its check step
adds a Job's end, says its Event (CheckPassed, CheckFailed, CheckPreempted) and
judges the node: ActiveCheckFailed from the history, acted on by the policy's
rules. The result is the recorded operator's judgement (a candidate policy's
`threshold` is not applied again); a trace without them replays as if no check
ran.

An `agentpod` record (format 4) is the agent's DaemonSet pod as the operator's
pod watch delivers it, handed to its own handler (`Operator.agent_pod_event`): a
NotReady or deleted pod makes the agent stale after the same grace as live. A
trace without pods (older, or recorded without the right to list them) is
judged by the heartbeat alone, as the operator judges agents outside Kubernetes.

A policy's topology domain actions (`spec.topology.domains`) are the same
code's: they show as the label and taint `gpuhealth.io/domain-degraded` set and
removed on each node of the domain, and the transitions (`DomainDegraded`,
`DomainRecovered`, Events on the policy) as actions under the policy's name.

The result per policy: every change the operator made to a Node (cordon,
drain, uncordon, labels, taint) with its time and the GPUNode's issues then,
the Events it said (DryRun ones included), and fleet figures (most nodes
unschedulable at once, nodes left Pending by the budget, GPU-hours out of
service, label flaps).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import pathlib
from collections.abc import Mapping
from typing import Any, Final

import yaml

from gpuhealth_api import keys, resources, timestamps, vocabulary
from gpuhealth_operator import replay
from gpuhealth_operator.decisions import gpu_facts, policies
from gpuhealth_sim.backtest import memcluster, traces

FULL_PASS_SECONDS: Final = 3600.0
"""The live operator's safety net under `ticker.is_due` (its `--full-pass-seconds`, 300 s) catches what
a lost watch event left unjudged; a replay loses no event, so its net is hourly: at 100 nodes and every
600 s it judged more nodes than all the reports together, and changed no action on the benchmark's
traces. The policies' status (output only) is refreshed on these passes, not every tick."""
OUR_LABELS: Final = (*keys.OPERATOR_LABELS, keys.NEEDS_REPAIR_LABEL)
"""The operator's own labels, and repair's retirement mark (set by the operator; a human's uncordon
makes the operator remove it, so in a replay it is the replay's, like the others)."""
OUR_TAINTS: Final = (keys.UNHEALTHY_TAINT, keys.DOMAIN_DEGRADED_TAINT)
DOMAIN_REASONS: Final = frozenset(
    {vocabulary.EventReason.DOMAIN_DEGRADED, vocabulary.EventReason.DOMAIN_RECOVERED}
)
"""Events on the policy that are actions on a whole topology domain (`domain_actions`): listed among the
actions under the policy's name, the domain's nodes' label and taint changes under each node's."""
DRA_KINDS: Final = frozenset({"resourceslice", "devicetaintrule", "cluster"})
"""Trace records of what IsolateGPU reads (format 2); see `Replay._dra`."""
AGENT_OWNER: Final = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "controller": True}
"""A replayed agent pod's owner: a recording keeps only DaemonSet pods (`agent_pods.is_agent`)."""
FLAP_SECONDS: Final = 3600.0
"""A label removed and set again within this long is a flap."""


class PolicyError(Exception):
    """A policy file that is not a GPUHealthPolicy."""


def load_policy(path: pathlib.Path) -> dict[str, Any]:
    """The GPUHealthPolicy object of a YAML file (the first document of that kind)."""
    try:
        documents = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    except (OSError, yaml.YAMLError) as error:
        raise PolicyError(f"{path}: {error}") from error
    for document in documents:
        if isinstance(document, dict) and document.get("kind") == resources.POLICY_KIND:
            metadata, spec = document.setdefault("metadata", {}), document.get("spec") or {}
            if not isinstance(metadata, dict) or not isinstance(spec, dict):
                raise PolicyError(f"{path}: the policy's metadata and spec must be mappings")
            metadata.setdefault("name", path.stem)
            metadata.setdefault("generation", 1)
            try:  # the operator's own reading: live, it would refuse this policy and act on nothing
                policies.parse_policy(str(metadata["name"]), 1, spec)
            except ValueError as error:
                raise PolicyError(f"{path}: policy {metadata['name']} is invalid: {error}") from error
            return document
    raise PolicyError(f"{path}: no {resources.POLICY_KIND} in this file")


@dataclasses.dataclass(frozen=True)
class Action:
    """One change the operator made to a Node (or said it would, in dry run), or to a whole topology domain
    (`node` then names the policy)."""

    t: float
    node: str
    action: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"t": round(self.t, 3), "node": self.node, "action": self.action, "reason": self.reason}


@dataclasses.dataclass
class NodeState:
    unschedulable: bool = False
    ours: bool = False
    drain: bool = False
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    taint: str | None = None
    domain_taint: bool = False
    """The NoSchedule taint gpuhealth.io/domain-degraded (a degraded topology domain, action Taint)."""


def node_state(body: Mapping[str, Any], policy: str) -> NodeState:
    """What of a Node version the report is about: the policy's claim, the drain, our labels and taint."""
    meta, spec = body.get("metadata") or {}, body.get("spec") or {}
    annotations = meta.get("annotations") or {}
    unschedulable = bool(spec.get("unschedulable"))
    return NodeState(
        unschedulable=unschedulable,
        ours=unschedulable and annotations.get(keys.CORDONED_BY_ANNOTATION) == policy,
        drain=replay.DRAIN_STARTED_ANNOTATION in annotations,
        labels={k: v for k, v in (meta.get("labels") or {}).items() if k in OUR_LABELS},
        taint=next(
            (t.get("value") for t in spec.get("taints") or [] if t.get("key") == keys.UNHEALTHY_TAINT), None
        ),
        domain_taint=any(t.get("key") == keys.DOMAIN_DEGRADED_TAINT for t in spec.get("taints") or []),
    )


def node_changes(before: NodeState, after: NodeState) -> list[str]:
    """The actions between two states of a Node, in the order the report lists them."""
    found = []
    if after.ours and not before.ours:
        found.append("Drain" if after.drain else "Cordon")
    elif before.ours and not after.ours:
        found.append("Uncordon")
    elif after.drain and not before.drain and after.ours:
        found.append("Drain")
    for label in OUR_LABELS:
        old, new = before.labels.get(label), after.labels.get(label)
        if old != new:
            short = label.removeprefix(keys.PREFIX + "/")
            found.append(f"Unlabel {short}" if new is None else f"Label {short}={new}")
    if after.taint != before.taint:
        found.append(f"Taint {after.taint}" if after.taint else "Untaint")
    if after.domain_taint != before.domain_taint:
        short = keys.DOMAIN_DEGRADED_TAINT.removeprefix(keys.PREFIX + "/")
        found.append(f"Taint {short}" if after.domain_taint else f"Untaint {short}")
    return found


@dataclasses.dataclass
class Result:
    policy: str
    dry_run: bool
    node_days: float
    nodes: int
    selected: set[str] = dataclasses.field(default_factory=set)
    """The nodes the policy selected at some time in the trace (its pool): what it is scored on."""
    selected_node_days: float = 0.0
    actions: list[Action] = dataclasses.field(default_factory=list)
    issue_changes: list[Action] = dataclasses.field(default_factory=list)
    """Each change of a GPUNode's `status.issues`: action `Issues health=<its Node's health label>`, reason
    the new issues. Not a Node change (not in `actions`): the scorer reads it for a node already labelled
    degraded when a new condition joins (`scoring.score_early_warnings`)."""
    events: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    max_unschedulable: int = 0
    max_cordoned_by_policy: int = 0
    max_unavailable_limit: int = 0
    pending_nodes: set[str] = dataclasses.field(default_factory=set)
    deleted_nodes: list[tuple[float, str]] = dataclasses.field(default_factory=list)
    """(t, node) of each Node deleted during the trace (replaced, or scaled in): not an action."""
    gpu_hours_out: float = 0.0
    label_flaps: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    """CPU time of the replay (this process): on a shared machine, less than `seconds`."""
    records: int = 0

    def summary(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for action in self.actions:
            counts[action.action] = counts.get(action.action, 0) + 1
        return {
            "policy": self.policy,
            "dryRun": self.dry_run,
            "nodes": self.nodes,
            "nodeDays": round(self.node_days, 2),
            "selectedNodes": len(self.selected),
            "selectedNodeDays": round(self.selected_node_days, 2),
            "records": self.records,
            "actions": counts,
            "maxUnschedulable": self.max_unschedulable,
            "maxCordonedByPolicy": self.max_cordoned_by_policy,
            "maxUnavailable": self.max_unavailable_limit,
            "pendingNodes": sorted(self.pending_nodes),
            "deletedNodes": [
                {"t": round(t, 3), "node": node} for t, node in self.deleted_nodes if node in self.selected
            ],
            "gpuHoursOutOfService": round(self.gpu_hours_out, 1),
            "labelFlaps": self.label_flaps,
            "replaySeconds": round(self.seconds, 2),
            "replayCpuSeconds": round(self.cpu_seconds, 2),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "nodeActions": [a.to_json() for a in self.actions],
            "events": self.events,
        }


class Replay:
    """One policy's replay of one trace (module docstring)."""

    def __init__(
        self,
        policy: dict[str, Any],
        start: float,
        tick_seconds: float,
        *,
        agent_pod_namespace: str | None = None,
        straggler_observer: replay.StragglerObserver | None = None,
        straggler_window: bool = True,
    ) -> None:
        self.start = start
        self.now = start
        self.tick_seconds = tick_seconds
        self.client = memcluster.MemoryKube(clock=lambda: self.now)
        # Agent pods are judged by the operator's rule (`replay.is_agent_pod`) in the namespace the
        # recording names (header `agentPodNamespace`); None (an older trace): any namespace.
        self.operator = replay.Operator(
            self.client,
            self.clock,
            agent_pod_namespace=agent_pod_namespace,
            instance="backtest",
            straggler_observer=straggler_observer,
            straggler_window=straggler_window,
        )
        self.policy = policy
        self.name = str(policy["metadata"]["name"])
        self.agent: dict[str, dict[str, Any]] = {}
        """Each GPUNode's last agent report, its GPUs compacted (`_compacted`): the next patch's base."""
        self.trace_unschedulable: dict[str, bool] = {}
        self.trace_claim: dict[str, str | None] = {}
        self.states: dict[str, NodeState] = {}
        self.gpus: dict[str, int] = {}
        self.out_since: dict[str, float] = {}
        self.label_cleared: dict[tuple[str, str], float] = {}
        self.joined: dict[str, float] = {}
        """Each Node in the fleet: when it joined (`t`)."""
        self.gone_seconds: dict[str, float] = {}
        """Each Node deleted: its seconds in the fleet (all its lives, if one of its name came back)."""
        self.pod_nodes: dict[str, str] = {}
        """Each agent pod in the trace ("namespace/name"): its node, for its deletion."""
        self.seen_events = 0
        self.seen_rules = 0
        self.result = Result(self.name, bool(policy.get("spec", {}).get("dryRun")), 0.0, 0)

    def clock(self) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.now, datetime.UTC)

    @property
    def t(self) -> float:
        return self.now - self.start

    async def run(self, records: Any) -> Result:
        await self.operator.policy_event("ADDED", self.policy)
        next_tick = self.start + self.tick_seconds
        last_full = self.start
        for record in records:
            kind = record["kind"]
            if kind == "truth":
                continue
            at = self.start + float(record["t"])
            while next_tick <= at:
                self.now = next_tick
                full = next_tick - last_full >= FULL_PASS_SECONDS
                if full:
                    last_full = next_tick
                await self.operator.tick(full=full, statuses=full)
                self._observe()
                next_tick += self.tick_seconds
            self.now = max(self.now, at)
            self.result.records += 1
            gone = traces.deletion(record)
            if kind in DRA_KINDS:
                self._dra(record)
            elif kind == "agentpod":
                await self._agent_pod(record, gone)
            elif kind == "job":
                self._job(record)
            elif kind == "check":
                await self.operator.check_run(str(record["node"]), dict(record["run"]))
            elif kind == "node" and gone:
                await self._node_deleted(record["name"])
            elif kind == "node":
                await self._node(record["object"])
            elif gone:
                await self._gpunode_deleted(record["name"])
            else:
                await self._gpunode(record)
            self._observe()
        self._finish()
        return self.result

    async def _node(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        current = self.client.nodes.get(name)
        wanted = bool((obj.get("spec") or {}).get("unschedulable"))
        claim = ((obj.get("metadata") or {}).get("annotations") or {}).get(keys.CORDONED_BY_ANNOTATION)
        # A cordon or uncordon that moved the operator's claim with it was the recorded operator's own.
        changed = self.trace_unschedulable.get(name) != wanted and self.trace_claim.get(name) == claim
        self.trace_unschedulable[name] = wanted
        self.trace_claim[name] = claim
        body = _merge_node(current, obj, apply_unschedulable=changed or current is None)
        capacity = (body.get("status") or {}).get("capacity", {}).get(keys.GPU_RESOURCE)
        labels = body["metadata"].get("labels") or {}
        self.gpus[name] = int(labels.get(keys.GPU_COUNT_LABEL) or capacity or 0)
        if current is None:  # as the node was when first seen: only what the replay changes is reported
            self.states[name] = node_state(body, self.name)
            if self.states[name].ours:
                self.out_since[name] = self.t
        self.client.put_node(body)
        self.joined.setdefault(name, self.t)
        self.client.touched[name] = None
        await self.operator.node_event("MODIFIED", dict(body))  # a copy: the handler trims it
        self._note_selected(name)

    def _job(self, record: Mapping[str, Any]) -> None:
        """A repair Job of the recorded operator ended (format 5): the replay's Job of that name ends so,
        at the time it did (or when the replay creates it, if later). A trace holds no pods: without
        these records a replay's repair Jobs never end."""
        name = str(record["name"]).rsplit("/", 1)[-1]
        try:
            at = timestamps.parse(str(record["at"]))
        except ValueError:
            at = self.now
        self.client.end_job(name, record["ended"] == "Succeeded", at)

    async def _node_deleted(self, name: str) -> None:
        """A Node deleted, as a node replaced rather than repaired is: it leaves the fleet, its figures
        and the budget it held, and the garbage collector takes the DeviceTaintRules it owns."""
        self.trace_unschedulable.pop(name, None)
        self.trace_claim.pop(name, None)
        body = self.client.delete_node(name)
        if body is None:
            return
        self._back_in_service(name)
        self.states.pop(name, None)
        self.label_cleared = {key: t for key, t in self.label_cleared.items() if key[0] != name}
        self.gone_seconds[name] = self.gone_seconds.get(name, 0.0) + self.t - self.joined.pop(name, 0.0)
        self.result.deleted_nodes.append((self.t, name))
        await self.operator.node_event("DELETED", body)

    async def _agent_pod(self, record: Mapping[str, Any], gone: bool) -> None:
        """The agent pod's watch event, as the pod the operator would have seen (node, Ready since)."""
        name = str(record["name"])
        node = self.pod_nodes.pop(name, None) if gone else str(record["node"])
        if node is None:
            return  # a pod never seen: the operator knows nothing of it to forget
        if not gone:
            self.pod_nodes[name] = node
        namespace, _, pod = name.rpartition("/")
        ready = {"type": "Ready", "status": "True" if record.get("ready") is True else "False"}
        if record.get("since"):
            ready["lastTransitionTime"] = str(record["since"])
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"namespace": namespace, "name": pod, "ownerReferences": [AGENT_OWNER]},
            "spec": {"nodeName": node},
            "status": {"conditions": [ready]},
        }
        await self.operator.agent_pod_event("DELETED" if gone else "MODIFIED", body)

    async def _gpunode_deleted(self, name: str) -> None:
        self.agent.pop(name, None)
        body = self.client.delete_gpunode(name)
        if body is not None:
            await self.operator.gpunode_event("DELETED", body)

    async def _gpunode(self, record: dict[str, Any]) -> None:
        name = record["name"]
        if "status" in record:
            status = _compacted(record["status"])
        else:
            before = self.agent.get(name)
            if before is None:
                raise traces.TraceError(f"GPUNode {name}: a patch before any full status (t={record['t']})")
            status = _compacted(
                traces.apply_status_patch(
                    before, record["patch"], patch_gpu=_patch_compacted, new_gpu=_new_compacted
                )
            )
        # The agent's report with its GPUs compacted by the operator's own `replay.compact_gpu`, and each
        # patch applied to them as compacted (`_patch_compacted`): what the cluster keeps is then what
        # the operator caches, the answers to its status writes are not compacted again, and no raw
        # copy of a GPU's thirty fields is made per report. It is also the base of the next patch.
        self.agent[name] = status
        new = name not in self.client.gpunodes
        if new:
            created = self.client.put_gpunode(name, {})
            created["metadata"]["creationTimestamp"] = _render(self.now)
            # What the live operator had written when the recording found it (its conditions' times, the
            # GPUs it isolated): the replay goes on from there, as a restarted operator does.
            resumed = record.get("operator") or {}
            created["status"].update({k: resumed[k] for k in traces.RESUMED_STATUS_FIELDS if k in resumed})
        else:
            self._adopt_conditions(name)
        body = self.client.put_gpunode(name, status)
        await self.operator.gpunode_event("MODIFIED", dict(body))
        if new:
            self._note_selected(name)  # a node is selected once it has a GPUNode

    def _adopt_conditions(self, name: str) -> None:
        """Let the cluster hold the operator's conditions as its cache keeps them (equal to the cluster's
        when both are of one version): the report about to be stored carries them, and the cache then
        knows them unchanged by identity instead of comparing fifteen conditions (issue 52). A recorded
        cluster's answers are decoded afresh each time; a replay's are its own objects."""
        kept = self.operator.kept_gpunode(name)
        if kept is not None:
            version, status = kept
            if "conditions" in status:
                self.client.adopt_status(name, version, "conditions", status["conditions"])

    def _note_selected(self, name: str) -> None:
        """Keep `name` among the policy's nodes if it selects it now (its labels, its GPUNode)."""
        if self.operator.selects(self.name, name):
            self.result.selected.add(name)

    def _dra(self, record: dict[str, Any]) -> None:
        """What IsolateGPU reads: ResourceSlices, and whether DeviceTaintRules are served and acted on.

        The operator reads both only in an isolation pass, so no handler runs. The trace's
        `devicetaintrule` records are the recorded operator's own rules (the replay makes its
        own); they only tell `liveactions` what it did. When the cluster's answer changes,
        the operator's probe answer is forgotten, so its next isolation pass probes again:
        live it probed a cluster that already answered so (the recording may start before).
        """
        kind = record["kind"]
        if kind == "devicetaintrule" and record.get("existing") is True and "object" in record:
            self.client.put_rule(record["object"])  # in place when the recording began: the replay's too
        elif kind == "resourceslice":
            if record.get("deleted"):
                self.client.delete_slice(record["name"])
            else:
                self.client.put_slice(record["object"])
        elif kind == "cluster":
            rules = record["deviceTaintRules"]
            version = rules.get("version") if rules.get("actedOn") is True else None
            if self.client.serve_device_taint_rules(version if isinstance(version, str) else None):
                self.operator.cluster_dra_changed()

    def _isolations(self) -> None:
        """The DeviceTaintRules the operator created or deleted since the last look, as actions."""
        log = self.client.rule_log
        for what, rule in log[self.seen_rules :]:
            self.seen_rules += 1
            action = rule_action(what, rule)
            if action is not None:
                node, said = action
                self.result.actions.append(Action(self.t, node, said, self._issues(node)))

    def _observe(self) -> None:
        """Turn the operator's new writes and Events into actions and fleet figures."""
        touched = list(self.client.touched)  # in the operator's order
        self.client.touched.clear()
        if len(self.client.rule_log) > self.seen_rules:
            self._isolations()  # first: the operator isolates before it labels the node
        for name in touched:
            self._diff_node(name)
        for name, issues in self.client.issue_log:
            state = self.states.get(name)
            health = state.labels.get(keys.HEALTH_LABEL) if state is not None else None
            self.result.issue_changes.append(Action(self.t, name, f"Issues health={health}", issues))
        self.client.issue_log.clear()
        log = self.client.event_log
        for event in log[self.seen_events :]:
            node = event["involvedObject"]["name"]
            self.seen_events += 1
            self.result.events.append(
                {"t": round(self.t, 3), "node": node, "reason": event["reason"], "message": event["message"]}
            )
            if event["reason"] == "DisruptionBudgetExceeded":
                self.result.pending_nodes.add(node)
            if event["reason"] in ("DryRun", *DOMAIN_REASONS):
                self.result.actions.append(Action(self.t, node, event["reason"], event["message"]))
        if touched:
            unschedulable = sum(1 for s in self.states.values() if s.unschedulable)
            ours = sum(1 for s in self.states.values() if s.ours)
            self.result.max_unschedulable = max(self.result.max_unschedulable, unschedulable)
            self.result.max_cordoned_by_policy = max(self.result.max_cordoned_by_policy, ours)

    def _diff_node(self, name: str) -> None:
        body = self.client.nodes.get(name)
        if body is None:
            return
        before = self.states.get(name) or NodeState()
        after = self.states[name] = node_state(body, self.name)
        reason = self._issues(name)
        for what in node_changes(before, after):
            self.result.actions.append(Action(self.t, name, what, reason))
            if what in ("Cordon", "Drain") and after.ours and not before.ours:
                self.out_since[name] = self.t
            elif what == "Uncordon":
                self._back_in_service(name)
        for label in OUR_LABELS:
            old, new = before.labels.get(label), after.labels.get(label)
            if old == new:
                continue
            if new is None:
                self.label_cleared[(name, label)] = self.t
            else:
                cleared = self.label_cleared.pop((name, label), None)
                if label != keys.HEALTH_LABEL and cleared is not None and self.t - cleared < FLAP_SECONDS:
                    self.result.label_flaps += 1

    def _issues(self, name: str) -> str:
        gpunode = self.client.gpunodes.get(name)
        return str((gpunode or {}).get("status", {}).get("issues") or "")

    def _back_in_service(self, name: str) -> None:
        since = self.out_since.pop(name, None)
        if since is not None:
            self.result.gpu_hours_out += (self.t - since) / 3600 * self.gpus.get(name, 0)

    def _finish(self) -> None:
        for name in list(self.out_since):
            self._back_in_service(name)
        self.result.nodes = len(self.client.nodes.keys() | self.gone_seconds.keys())
        seconds = dict(self.gone_seconds)
        for name in self.client.nodes:
            seconds[name] = seconds.get(name, 0.0) + self.t - self.joined.get(name, 0.0)
        self.result.node_days = sum(seconds.values()) / 86_400
        self.result.selected_node_days = sum(seconds.get(n, 0.0) for n in self.result.selected) / 86_400
        limit = self.operator.max_unavailable(self.name)
        if limit is not None:
            self.result.max_unavailable_limit = limit


def rule_action(what: str, rule: dict[str, Any]) -> tuple[str, str] | None:
    """(node, `Isolate GPU <index>` | `Restore GPU <index>`) for a gpu-health DeviceTaintRule
    created or deleted; None for another's (or the probe's) rule."""
    labels = (rule.get("metadata") or {}).get("labels") or {}
    node, index = labels.get(keys.NODE_LABEL), labels.get(keys.GPU_INDEX_LABEL)
    if not node or index is None:
        return None
    return str(node), f"{'Isolate' if what == 'created' else 'Restore'} GPU {index}"


def _compact_gpu(gpu: Any) -> Any:
    """One reported GPU as the operator caches it (`replay.compact_gpu`); a malformed entry as it is."""
    return replay.compact_gpu(gpu) if isinstance(gpu, Mapping) else gpu


def _compacted(status: dict[str, Any]) -> dict[str, Any]:
    """An agent status whose GPUs are all compacted (those already so are their own compaction)."""
    gpus = status.get("gpus")
    if not isinstance(gpus, list) or all(type(g) is gpu_facts.GPUFacts for g in gpus):
        return status
    return {**status, "gpus": [_compact_gpu(g) for g in gpus]}


def _new_compacted(change: Mapping[str, Any]) -> Any:
    """A GPU a patch appends, as `traces.apply_status_patch` appends it (the change as it is), compacted."""
    return _compact_gpu(dict(change))


_KEPT: Final = frozenset(gpu_facts.FIELDS)


def _patch_compacted(gpu: Any, change: Mapping[str, Any]) -> Any:
    """`_compact_gpu(traces.merge_patch(raw, change))` for the compacted `gpu` of a raw GPU `raw`, from
    `gpu` alone: compaction keeps only the fields the decisions read (`gpu_facts.FIELDS`), and of a
    nested one its kept keys, so the merge patch of a kept field onto the kept value holds what its
    merge onto the raw one holds there, and a field not kept changes nothing kept. Only the fields
    changed are compacted again (`replay.recompact_gpu`), the rest are the very objects of `gpu`:
    what a healthy report moves is two or three fields of a GPU's seventeen."""
    if type(gpu) is not gpu_facts.GPUFacts or type(change) is not dict:
        return _compact_gpu(traces.merge_patch(gpu, change))
    absent = gpu_facts.ABSENT
    changed: dict[str, Any] = {}
    nested: dict[str, Any] = {}
    for field, value in change.items():
        if field not in _KEPT:
            continue
        if value is None:
            changed[field] = absent
        elif type(value) is dict or isinstance(value, Mapping):
            held = gpu.get(field)
            if type(held) is dict and _nested(held) and _only_changes(held, value):
                nested[field] = {k: _merged(v, value[k]) if k in value else v for k, v in held.items()}
            else:
                changed[field] = traces.merge_patch(held if isinstance(held, Mapping) else {}, value)
        else:
            changed[field] = value
    return replay.recompact_gpu(gpu, changed, nested)


def _nested(part: dict[str, Any]) -> bool:
    """Whether a kept part holds a nested object (PCIe's `aer`): compaction cannot share it whole."""
    return any(type(v) is dict for v in part.values())


def _only_changes(held: Mapping[str, Any], change: Mapping[str, Any]) -> bool:
    """Whether a merge patch only sets keys `held` has (no removal, no new key): the merge keeps the
    keys and their order, so the kept keys of its merge are those of `held`, in `held`'s order."""
    return all(key in held and value is not None for key, value in change.items())


def _merged(held: Any, change: Any) -> Any:
    """One key's value after a merge patch (`traces.merge_patch`), shared as compaction shares it."""
    if type(change) is dict or isinstance(change, Mapping):
        change = traces.merge_patch(held if isinstance(held, Mapping) else {}, change)
    return replay.share_value(change)


def _render(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _merge_node(
    current: dict[str, Any] | None, obj: dict[str, Any], *, apply_unschedulable: bool
) -> dict[str, Any]:
    """The Node after a trace version: others' fields from the trace, the operator's kept (see above)."""
    meta = obj.get("metadata") or {}
    name = meta["name"]
    if current is None:  # its first version is the cluster's state then, the operator's marks included
        current = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-node-{name}", **_ours(meta)},
            "spec": {"taints": [t for t in (obj.get("spec") or {}).get("taints") or [] if _our_taint(t)]},
        }
    old_meta = current.get("metadata") or {}
    # The operator's labels are its own three; others under the prefix (a policy's selector,
    # gpuhealth.io/exclude) are set by people and come from the trace.
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k not in OUR_LABELS}
    labels.update({k: v for k, v in (old_meta.get("labels") or {}).items() if k in OUR_LABELS})
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if not k.startswith(keys.PREFIX)}
    annotations.update(
        {k: v for k, v in (old_meta.get("annotations") or {}).items() if k.startswith(keys.PREFIX)}
    )
    spec = obj.get("spec") or {}
    old_spec = current.get("spec") or {}
    taints = [t for t in spec.get("taints") or [] if not _our_taint(t)]
    taints += [t for t in old_spec.get("taints") or [] if _our_taint(t)]
    unschedulable = spec.get("unschedulable") if apply_unschedulable else old_spec.get("unschedulable")
    status = dict(current.get("status") or {})
    status["capacity"] = (obj.get("status") or {}).get("capacity") or status.get("capacity") or {}
    return {
        **current,
        "metadata": {**old_meta, "labels": labels, "annotations": annotations},
        "spec": {**old_spec, "unschedulable": bool(unschedulable), "taints": taints},
        "status": status,
    }


def _ours(meta: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """The operator's labels and annotations of a Node's metadata."""
    return {
        "labels": {k: v for k, v in (meta.get("labels") or {}).items() if k in OUR_LABELS},
        "annotations": {
            k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(keys.PREFIX)
        },
    }


def _our_taint(taint: Mapping[str, Any]) -> bool:
    return taint.get("key") in OUR_TAINTS


def run(
    trace: pathlib.Path,
    policy: dict[str, Any],
    tick_seconds: float = 30.0,
    *,
    straggler_observer: replay.StragglerObserver | None = None,
    straggler_window: bool = True,
) -> Result:
    """Replay `trace` under `policy`; raises traces.TraceError on a bad trace. `straggler_observer`: told
    each sample a straggler window takes (`replay.StragglerObserver`). `straggler_window`: False judges
    stragglers on each sample alone, the rule before the window (bench/backtest_quality.py's comparison)."""
    logging.getLogger("gpuhealth_operator").setLevel(logging.ERROR)
    import time  # noqa: PLC0415

    began, cpu = time.perf_counter(), time.process_time()
    with traces.open_trace(trace) as (header, records):
        namespace = header.get("agentPodNamespace")
        replay = Replay(
            policy,
            float(header["start"]),
            tick_seconds,
            agent_pod_namespace=namespace if isinstance(namespace, str) and namespace else None,
            straggler_observer=straggler_observer,
            straggler_window=straggler_window,
        )
        result = asyncio.run(replay.run(records))
    result.seconds = time.perf_counter() - began
    result.cpu_seconds = time.process_time() - cpu
    return result
