"""What a live operator did to Nodes, in the backtest's words, and how a replay compares with it.

A backtest reports each change the operator made to a Node as an action
(`Cordon`, `Drain`, `Uncordon`, `Label straggler=true`, `Unlabel
thermal-throttled`, `Taint …`, `Untaint`). The same changes can be read off
the Node versions a live cluster went through (a trace's `node` records, or a
watch): this module does that, with the backtest's own rules for what counts
(the policy's `cordoned-by` claim on an unschedulable Node, the drain-started
annotation, gpu-health's labels and taint), and compares the two per node.
GPUs isolated by IsolateGPU are said as the replay says them (`Isolate GPU
3`, `Restore GPU 3`), from a trace's `devicetaintrule` records of the policy.

Live, a cordon and the start of its drain may land in two writes that a
replay, looking once per event, sees as one; `sequence` folds a `Cordon`
followed at once by a `Drain` into the `Drain` on both sides. A GPU's
isolation and the node's health label it brings (`unhealthy`, `degraded`),
written in one pass, are two objects followed by two watches, so a
recording may have them in either order: `sequence` puts the isolation
first when they are less than `SAME_PASS_SECONDS` apart. Pure: dicts in, lists out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from gpuhealth_api import keys
from gpuhealth_operator.decisions import device_taints
from gpuhealth_sim.backtest import replayer, traces

SAME_PASS_SECONDS: Final = 0.5
"""An isolation and a health label this close were written in one pass (see the docstring)."""


def changes(
    t: float, node: str, before: replayer.NodeState, after: replayer.NodeState
) -> list[replayer.Action]:
    """The actions between two states of a Node, as the backtest lists them (`replayer.node_changes`)."""
    return [replayer.Action(t, node, what, "") for what in replayer.node_changes(before, after)]


def actions(versions: Iterable[tuple[float, Mapping[str, Any]]], policy: str) -> list[replayer.Action]:
    """Every change `policy` made to the Nodes, from their versions in the order they arrived; a
    version with `deleted: true` is the Node's deletion (one of its name created later is new). A
    Node's first version is where it starts, as in a replay: a recording that began on a policy's
    cordon holds no Cordon."""
    states: dict[str, replayer.NodeState] = {}
    found: list[replayer.Action] = []
    for t, obj in versions:
        name = str((obj.get("metadata") or {}).get("name"))
        if obj.get("deleted") is True:
            states.pop(name, None)
            continue
        after = replayer.node_state(obj, policy)
        before = states.get(name)
        if before is not None:
            found += changes(t, name, before, after)
        states[name] = after
    return found


def from_trace(records: Iterable[Mapping[str, Any]], policy: str) -> list[replayer.Action]:
    """What the recorded operator did, from a trace's `node` records (they keep its labels and claims)
    and its `devicetaintrule` records (the GPUs it isolated and restored), in time order."""
    versions: list[tuple[float, Mapping[str, Any]]] = []
    isolations: list[replayer.Action] = []
    rules: dict[str, dict[str, Any]] = {}
    ours = device_taints.label_value(policy)
    for record in records:
        if record.get("kind") == "node" and traces.deletion(record):
            versions.append((float(record["t"]), {"metadata": {"name": record["name"]}, "deleted": True}))
        elif record.get("kind") == "node":
            versions.append((float(record["t"]), record["object"]))
        elif record.get("kind") == "devicetaintrule":
            created = "object" in record
            rule = dict(record["object"]) if created else rules.pop(str(record["name"]), None)
            if (
                rule is None
                or ((rule.get("metadata") or {}).get("labels") or {}).get(keys.POLICY_LABEL) != ours
            ):
                continue
            name = str(rule["metadata"]["name"])
            if created and name in rules:
                continue  # a new version of a rule already in place
            if created:
                rules[name] = rule
            change = replayer.rule_action("created" if created else "deleted", rule)
            if change is not None:
                isolations.append(replayer.Action(float(record["t"]), change[0], change[1], ""))
    return sorted(actions(versions, policy) + isolations, key=lambda action: action.t)


def sequence(found: Iterable[replayer.Action], *, health: bool = True) -> dict[str, list[str]]:
    """Per node, the actions in order (a Cordon directly followed by a Drain folded into the Drain)."""
    per_node: dict[str, list[str]] = {}
    last_health: dict[str, float] = {}
    for action in found:
        if (not health and action.action.startswith("Label health=")) or action.action == "DryRun":
            continue
        steps = per_node.setdefault(action.node, [])
        if action.action == "Drain" and steps and steps[-1] == "Cordon":
            steps.pop()
        if action.action.startswith("Label health=") and action.action != "Label health=healthy":
            last_health[action.node] = action.t
        isolation = action.action.startswith("Isolate GPU")
        labelled = last_health.get(action.node, -SAME_PASS_SECONDS)
        if (
            isolation
            and steps
            and steps[-1].startswith("Label health=")
            and steps[-1] != "Label health=healthy"
            and action.t - labelled < SAME_PASS_SECONDS
        ):
            steps.insert(len(steps) - 1, action.action)  # the same pass: the isolation first
            continue
        steps.append(action.action)
    return per_node


def differences(
    live: Iterable[replayer.Action], replayed: Iterable[replayer.Action], *, health: bool = True
) -> dict[str, tuple[list[str], list[str]]]:
    """Nodes whose action sequences differ: node → (live, replayed)."""
    a, b = sequence(live, health=health), sequence(replayed, health=health)
    nodes = sorted(a.keys() | b.keys())
    return {n: (a.get(n, []), b.get(n, [])) for n in nodes if a.get(n, []) != b.get(n, [])}
