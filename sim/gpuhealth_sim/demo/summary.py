"""The demo's closing summary: per node, what gpu-health detected, what it did, and how fast.

Detection-to-action time is measured as the operator's metric defines it:
from the moment the agent read the fact (the newest `observedTime` of the
node's GPUs before the action) to the moment the demo saw the Node change
(cordon, label) or the drain finish. For sustained conditions it includes
the policy's `forSeconds` (or `healthyForSeconds` for a removal): the
operator waits that long on purpose. Pure: reads a `record.Record`.
"""

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

from gpuhealth_api import keys, vocabulary
from gpuhealth_sim.demo import record, view

CONDITIONS: frozenset[str] = frozenset(vocabulary.Condition)


@dataclasses.dataclass(frozen=True)
class Action:
    what: str
    at_seconds: float
    """Since the demo started."""
    detection_to_action_seconds: float | None
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class NodeSummary:
    name: str
    detected: tuple[str, ...]
    actions: tuple[Action, ...]
    health: str
    issues: str
    action: str
    unschedulable: bool
    cordoned_by: str | None
    labels: Mapping[str, str]
    """gpu-health's labels on the Node at the end."""
    human_cordoned: bool
    our_events: int


@dataclasses.dataclass(frozen=True)
class Isolation:
    """A node whose faulty GPUs were isolated instead of the node drained (IsolateGPU)."""

    node: str
    gpus: int
    isolated: int
    """GPUs isolated at the end of the demo (at most; restored ones are not subtracted)."""
    kept_gpu_hours: float
    """GPU-hours the node's other GPUs served from the first isolation to the end: what a drain loses."""


@dataclasses.dataclass(frozen=True)
class Summary:
    duration_seconds: float
    nodes: tuple[NodeSummary, ...]
    isolations: tuple[Isolation, ...] = ()

    def node(self, name: str) -> NodeSummary:
        for item in self.nodes:
            if item.name == name:
                return item
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "durationSeconds": round(self.duration_seconds, 1),
            "nodes": {
                n.name: {
                    "detected": list(n.detected),
                    "actions": [
                        {
                            "what": a.what,
                            "atSeconds": round(a.at_seconds, 2),
                            "detectionToActionSeconds": None
                            if a.detection_to_action_seconds is None
                            else round(a.detection_to_action_seconds, 3),
                            "detail": a.detail,
                        }
                        for a in n.actions
                    ],
                    "health": n.health,
                    "issues": n.issues,
                    "action": n.action,
                    "unschedulable": n.unschedulable,
                    "cordonedBy": n.cordoned_by,
                    "labels": dict(n.labels),
                    "humanCordoned": n.human_cordoned,
                    "gpuHealthEvents": n.our_events,
                }
                for n in self.nodes
            },
            "isolations": [
                {
                    "node": i.node,
                    "gpus": i.gpus,
                    "isolated": i.isolated,
                    "gpuHoursSavedVsDrain": round(i.kept_gpu_hours, 4),
                }
                for i in self.isolations
            ],
        }


OUR_LABELS = (*keys.OPERATOR_LABELS, keys.NEEDS_REPAIR_LABEL)
"""The labels the summary reports: the operator's own and repair's retirement mark."""


def build(
    seen: record.Record,
    ended_at: float,
    human_cordoned: Collection[str] = (),
    gpus: Mapping[str, int] | None = None,
) -> Summary:
    """Summarise every node that had an issue, an action, an Event, or a human's cordon.

    `gpus`: GPUs per node, to count the GPU-hours isolation kept in service against a drain.
    """
    rows = {row.name: row for row in seen.rows()}
    nodes = seen.nodes()
    events = seen.events()
    happenings = sorted(seen.happenings(), key=lambda h: h.at)
    detected: dict[str, list[str]] = {}
    for _, row in seen.row_changes():
        if not row.reported:
            continue  # a verdict on a GPUNode whose agent has not reported yet says nothing of the GPUs
        for issue in filter(None, (i.strip() for i in row.issues.split(","))):
            if issue not in detected.setdefault(row.name, []):
                detected[row.name].append(issue)
    for event in events:
        if event.reason in CONDITIONS and event.reason not in detected.setdefault(event.node, []):
            detected[event.node].append(event.reason)
    names = set(detected) | {h.node for h in happenings} | {e.node for e in events} | set(human_cordoned)
    result = []
    for name in sorted(names, key=record.natural_order):
        actions = []
        for h in (h for h in happenings if h.node == name):
            observed = seen.detected_before(name, h.at)
            latency = None if observed is None or name in human_cordoned else max(0.0, h.at - observed)
            actions.append(Action(h.what, h.at - seen.started_at, latency, h.detail))
        current = rows.get(name)
        state = nodes.get(name)
        result.append(
            NodeSummary(
                name=name,
                detected=tuple(i for i in detected.get(name, []) if i),
                actions=tuple(actions),
                health=current.health if current else "",
                issues=current.issues if current else "",
                action=current.action if current else "",
                unschedulable=bool(state and state.unschedulable),
                cordoned_by=state.annotations.get(keys.CORDONED_BY_ANNOTATION) if state else None,
                labels={k: v for k, v in (state.labels if state else {}).items() if k in OUR_LABELS},
                human_cordoned=name in human_cordoned,
                our_events=sum(1 for e in events if e.node == name),
            )
        )
    return Summary(
        duration_seconds=ended_at - seen.started_at,
        nodes=tuple(result),
        isolations=_isolations(happenings, ended_at, gpus or {}),
    )


def _isolations(
    happenings: list[record.Happening], ended_at: float, gpus: Mapping[str, int]
) -> tuple[Isolation, ...]:
    found = []
    for name in sorted({h.node for h in happenings if h.what == record.ISOLATED}, key=record.natural_order):
        isolated = [h for h in happenings if h.node == name and h.what == record.ISOLATED]
        restored = sum(1 for h in happenings if h.node == name and h.what == record.RESTORED)
        count = gpus.get(name, 0)
        still = max(0, len({h.detail for h in isolated}) - restored)
        kept = max(0, count - max(still, 1)) * max(0.0, ended_at - isolated[0].at) / 3600
        found.append(Isolation(name, count, still, kept))
    return tuple(found)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


STALE = vocabulary.Condition.AGENT_STALE


def _stale_blip(node: NodeSummary) -> bool:
    """AgentStale came and went (e.g. a verdict before the agent's first report) and caused nothing."""
    return STALE in node.detected and STALE not in node.issues.split(",")


def _only_stale_blip(node: NodeSummary) -> bool:
    return (
        _stale_blip(node) and set(node.detected) == {STALE} and not node.actions and not node.human_cordoned
    )


def render(result: Summary, width: int = 80) -> list[str]:
    lines = [
        f"Summary after {result.duration_seconds:.0f} s: what gpu-health detected and did",
        "(time since start; detection→action = agent read the fact → Node changed;",
        " label/taint set/removed includes the policy's forSeconds / healthyForSeconds)",
        "",
    ]
    blips = [n for n in result.nodes if _only_stale_blip(n)]
    passing = [n.name for n in result.nodes if _stale_blip(n)]
    if passing:
        names = ", ".join(passing)
        lines.append(view.shorten(f"briefly Unknown (AgentStale), no action: {names}", width))
    for node in result.nodes:
        if node in blips:
            continue
        if node.human_cordoned:
            verdict = "still cordoned" if node.unschedulable else "NOT cordoned any more"
            owner = (
                f"annotated {keys.CORDONED_BY_ANNOTATION}={node.cordoned_by}"
                if node.cordoned_by
                else "no gpu-health annotation"
            )
            lines.append(view.shorten(f"{node.name}: cordoned by a human: {verdict}, {owner}", width))
            touched = [a for a in node.actions if a.what != "cordoned"]
            lines.append(
                view.shorten(
                    f"  gpu-health actions: {len(touched)}, Events: {node.our_events} (left alone)", width
                )
            )
            continue
        shown = [i for i in node.detected if not (i == STALE and _stale_blip(node))]
        issues = ", ".join(shown) or "no issue"
        lines.append(
            view.shorten(f"{node.name}: {issues}  →  now {node.health or '?'}, {node.action or '-'}", width)
        )
        for action in node.actions:
            detail = f" ({action.detail})" if action.detail else ""
            lines.append(
                view.shorten(
                    f"  +{action.at_seconds:5.1f}s {action.what:<26} detection→action "
                    f"{_seconds(action.detection_to_action_seconds)}{detail}",
                    width,
                )
            )
        if not node.actions:
            lines.append("  no action on the Node")
    for isolation in result.isolations:
        serving = isolation.gpus - isolation.isolated
        lines.append(
            view.shorten(
                f"{isolation.node}: {serving} of {isolation.gpus} GPUs kept in service (IsolateGPU)", width
            )
        )
        lines.append(
            view.shorten(
                f"  {isolation.kept_gpu_hours:.3f} GPU-hours saved against a whole-node drain "
                f"({serving} per hour)",
                width,
            )
        )
    if not result.nodes:
        lines.append("Nothing was detected.")
    return lines
