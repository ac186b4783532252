"""Candidates side by side: what each policy's replay of the same trace would have done differently.

Pure: it reads finished replays (and their scores, when `--score` made them) and renders
nothing but data and lines of text. The first policy given is the reference the others are read
against; a node appears only where the policies' Node actions (kind and time) differ, so tuning a
`forSeconds` or a threshold shows exactly the nodes and moments it moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuhealth_sim.backtest import replayer

BREAKER_REASON = "RemediationPaused"


def node_actions(result: replayer.Result) -> dict[str, list[replayer.Action]]:
    """Each node's actions in time order, as the report lists them (the health label aside: it follows
    the verdict, which the other actions already show)."""
    out: dict[str, list[replayer.Action]] = {}
    for action in result.actions:
        if not action.action.startswith("Label health="):
            out.setdefault(action.node, []).append(action)
    for actions in out.values():
        actions.sort(key=lambda a: a.t)  # stable: the operator's order at one instant stays
    return out


def breaker_openings(result: replayer.Result) -> list[float]:
    """When the policy's breaker opened: its RemediationPaused Events on the policy itself (a repair's
    RemediationPaused names a node, not the policy)."""
    return [
        e["t"]
        for e in result.events
        if e["reason"] == BREAKER_REASON and e["node"] == result.policy and e["message"].startswith("Policy ")
    ]


def compare(replayed: Sequence[tuple[replayer.Result, dict[str, Any] | None]]) -> dict[str, Any]:
    """The comparison of two or more replays of one trace (JSON `comparison`)."""
    names = [result.policy for result, _ in replayed]
    per_policy = [node_actions(result) for result, _ in replayed]
    nodes: list[dict[str, Any]] = []
    for node in sorted(set().union(*per_policy)):
        said = [[(a.t, a.action) for a in actions.get(node, [])] for actions in per_policy]
        if all(s == said[0] for s in said[1:]):
            continue
        nodes.append(
            {
                "node": node,
                "actions": {
                    name: [a.to_json() for a in actions.get(node, [])]
                    for name, actions in zip(names, per_policy, strict=True)
                },
            }
        )

    def figure(pick: Any) -> dict[str, Any]:
        return {result.policy: pick(result, score) for result, score in replayed}

    figures = {
        "nodesActedOn": figure(lambda r, _s: len(node_actions(r))),
        "cordonsAndDrains": figure(lambda r, _s: sum(a.action in ("Cordon", "Drain") for a in r.actions)),
        "gpuHoursOutOfService": figure(lambda r, _s: round(r.gpu_hours_out, 1)),
        "leftPending": figure(lambda r, _s: sorted(r.pending_nodes)),
        "breakerOpened": figure(lambda r, _s: [round(t, 3) for t in breaker_openings(r)]),
        "labelFlaps": figure(lambda r, _s: r.label_flaps),
        # Only a scored replay knows which faults it missed (the trace's truth says what they were).
        "faultsMissed": figure(lambda _r, s: None if s is None else list(s["fatal"]["missed"])),
        "falseDisruptive": figure(lambda _r, s: None if s is None else s["fatal"]["falseDisruptive"]),
    }
    return {"policies": names, "figures": figures, "nodes": nodes}


def text(comparison: dict[str, Any], clock: Any) -> list[str]:
    """The comparison as the text report prints it after each policy's own report; `clock` renders a
    trace time (`d<day> hh:mm:ss`)."""
    names: list[str] = comparison["policies"]
    figures = comparison["figures"]
    width = max(len(n) for n in names)
    lines = [f"== side by side: {' vs '.join(names)} ({len(comparison['nodes'])} nodes differ)"]
    missed, false = figures["faultsMissed"], figures["falseDisruptive"]
    rows: list[tuple[str, list[str]]] = [
        ("", names),
        ("nodes acted on", [str(figures["nodesActedOn"][n]) for n in names]),
        ("cordons and drains", [str(figures["cordonsAndDrains"][n]) for n in names]),
        ("GPU-hours out of service", [str(figures["gpuHoursOutOfService"][n]) for n in names]),
        ("left Pending", [str(len(figures["leftPending"][n])) for n in names]),
        ("breaker opened", [clock(t[0]) if (t := figures["breakerOpened"][n]) else "never" for n in names]),
        ("label flaps", [str(figures["labelFlaps"][n]) for n in names]),
        ("fatal faults missed", ["n/a" if missed[n] is None else str(len(missed[n])) for n in names]),
        ("false disruptive", ["n/a" if false[n] is None else str(false[n]) for n in names]),
    ]
    label_width = max(len(label) for label, _ in rows)
    cell_width = max(len(cell) for _, cells in rows for cell in cells)
    for label, cells in rows:
        lines.append(
            (f"  {label:<{label_width}}  " + "  ".join(f"{c:<{cell_width}}" for c in cells)).rstrip()
        )
    for name in names:
        if figures["leftPending"][name]:
            lines.append(f"  {name} left Pending: {', '.join(figures['leftPending'][name])}")
        if missed[name]:
            lines.append(f"  {name} missed: {'; '.join(missed[name])}")
        if len(figures["breakerOpened"][name]) > 1:
            lines.append(
                f"  {name} breaker opened at {', '.join(clock(t) for t in figures['breakerOpened'][name])}"
            )
    for item in comparison["nodes"]:
        lines.append(f"  {item['node']}")
        for name in names:
            said = item["actions"][name]
            what = "; ".join(f"{clock(a['t'])}  {a['action']}" for a in said) if said else "(nothing)"
            lines.append(f"    {name:<{width}}  {what}")
    return lines
