"""What `why`, `status` and `check` show of active checks (policy `spec.activeChecks`): pure functions.

- `history`: a node's last runs of each check, from GPUNode `status.checks[]` (the operator's record);
- `overdue`: the (node, policy, check) pairs with no pass within the check's `everySeconds`, worked out
  as the operator does (`decisions.checks.overdue`: since the last pass, else since the node joined);
- `request_outcome`: the end of one `kubectl gpuhealth check` request, found by its token: the run that
  carries it (`status.checks[].requestId`) or the `CheckRefused` Event that names it.

Reports are plain JSON data; `render_*` lay them out for a terminal.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any, Final

from gpuhealth_api import timestamps, vocabulary
from gpuhealth_kubectl import views
from gpuhealth_operator.decisions import checks, policies

Body = Mapping[str, Any]
Report = dict[str, Any]

PER_CHECK: Final = 3
"""Runs of each check `why` shows (the GPUNode keeps the last 20 of all checks)."""
REFUSED: Final = "Refused"
"""`request_outcome`'s result for a request the operator refused (a `CheckRefused` Event)."""
REFUSED_REASON: Final = vocabulary.EventReason.CHECK_REFUSED.value
RUN_KEYS: Final = (
    "name",
    "template",
    "policy",
    "started",
    "time",
    "result",
    "figures",
    "message",
    "requestId",
)


def _entries(gpunode: Body) -> list[Body]:
    found = (gpunode.get("status") or {}).get("checks")
    return [e for e in found if isinstance(e, Mapping) and e.get("name")] if isinstance(found, list) else []


def _row(entry: Body) -> Report:
    return {key: entry[key] for key in RUN_KEYS if entry.get(key) not in (None, "", {})}


def history(gpunode: Body, per_check: int = PER_CHECK) -> list[Report]:
    """The last `per_check` runs of each check on the node: by check name, newest first."""
    by_check: dict[str, list[Body]] = {}
    for entry in _entries(gpunode):
        by_check.setdefault(str(entry["name"]), []).append(entry)
    rows: list[Report] = []
    for name in sorted(by_check):
        newest = sorted(by_check[name], key=lambda e: _seconds(e.get("time")), reverse=True)
        rows += [_row(e) for e in newest[:per_check]]
    return rows


def _seconds(value: object) -> float:
    when = _parse(value)
    return when.timestamp() if when is not None else 0.0


def _parse(value: object) -> datetime.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.datetime.fromtimestamp(timestamps.parse(value), tz=datetime.UTC)
    except (ValueError, OverflowError):
        return None


def _runs(gpunode: Body) -> tuple[checks.Run, ...]:
    """`status.checks[]` as the decisions read it; an entry with an unknown result or no time is skipped."""
    runs = []
    for entry in _entries(gpunode):
        when = _parse(entry.get("time"))
        try:
            result = vocabulary.CheckResult(str(entry.get("result")))
        except ValueError:
            continue
        if when is not None:
            runs.append(checks.Run(check=str(entry["name"]), time=when, result=result))
    return tuple(runs)


def overdue(
    policy_bodies: Sequence[Body], gpunodes: Sequence[Body], nodes: Sequence[Body], now: datetime.datetime
) -> list[Report]:
    """The nodes overdue for a check (module docstring), by node, policy and check; `since` is when each
    became overdue (RFC 3339; None where the operator could not know)."""
    node_by_name = {views._name(n): n for n in nodes}
    states = []
    for g in gpunodes:
        name = views._name(g)
        view = views._node_view(node_by_name.get(name), name)
        states.append(
            checks.NodeState(
                name=name,
                idle_since=None,
                known_since=_parse(views._meta(g).get("creationTimestamp")),
                runs=_runs(g),
                excluded=policies.excluded(view),
            )
        )
    entries = []
    for body in policy_bodies:
        parsed, _ = views.parsed_policy(body)
        if parsed is None or not parsed.active_checks:
            continue
        selected = frozenset(
            s.name
            for s in states
            if s.name in node_by_name
            and policies.selects(parsed, views._node_view(node_by_name[s.name], s.name))
        )
        entries.append(checks.PolicyChecks(parsed.name, parsed.dry_run, parsed.active_checks, selected))
    return [
        {
            "node": o.node,
            "policy": o.policy,
            "check": o.check,
            "since": timestamps.rfc3339(o.since.timestamp()) if o.since is not None else None,
        }
        for o in checks.overdue(entries, states, now)
    ]


def has_checks(policy_bodies: Sequence[Body]) -> bool:
    """Whether any policy has `spec.activeChecks` (else `status` says nothing of checks)."""
    return any((b.get("spec") or {}).get("activeChecks") for b in policy_bodies)


def request_outcome(gpunode: Body | None, events: Sequence[Body], token: str) -> Report | None:
    """How the request `token` ended: its run (`requestId`), else its `CheckRefused` Event; None: not yet."""
    mine = [e for e in _entries(gpunode or {}) if e.get("requestId") == token]
    if mine:
        return _row(max(mine, key=lambda e: _seconds(e.get("time"))))
    for event in events:
        message = str(event.get("message") or "")
        if event.get("reason") == REFUSED_REASON and token in message:
            return {"result": REFUSED, "message": message}
    return None


def exit_code(outcome: Body) -> int:
    """0 for a pass; 1 for anything else (Failed, TimedOut, Preempted, Refused): a script that waits on a
    check learns that the node proved itself, or that it did not (yet)."""
    return 0 if outcome.get("result") == vocabulary.CheckResult.PASSED.value else 1


def figures_words(figures: object) -> str:
    if not isinstance(figures, Mapping) or not figures:
        return ""
    return ", ".join(f"{name}={value:g}" for name, value in sorted(figures.items()))


def render_outcome(node: str, outcome: Body) -> str:
    result = str(outcome.get("result") or "")
    what = f"check {outcome['name']} ({outcome.get('template', '?')})" if outcome.get("name") else "check"
    lines = [f"{node}: {what} {result}"]
    if result == REFUSED:
        lines = [f"{node}: the check request was refused"]
    elif result == vocabulary.CheckResult.PREEMPTED.value:
        lines.append(
            "Preempted: real work wanted the GPUs (not a failure); the node was not proven. Try later."
        )
    elif result == vocabulary.CheckResult.TIMED_OUT.value:
        lines.append("Timed out: the check did not finish in its timeoutSeconds (not judged a GPU failure).")
    if figures := figures_words(outcome.get("figures")):
        lines.append(f"  figures: {figures}")
    if outcome.get("message"):
        lines.append(f"  message: {outcome['message']}")
    return "\n".join(lines) + "\n"


def render_history(rows: Sequence[Body], now: datetime.datetime) -> list[str]:
    """The `why` section: one line per run (check, template, result, age, figures, message)."""
    if not rows:
        return ["  none yet"]
    table = [["CHECK", "TEMPLATE", "RESULT", "AGE", "FIGURES", "MESSAGE"]] + [
        [
            str(r.get("name", "")),
            str(r.get("template") or "-"),
            str(r.get("result", "")),
            views.age(r.get("time"), now),
            figures_words(r.get("figures")) or "-",
            str(r.get("message") or "-"),
        ]
        for r in rows
    ]
    return ["  " + line for line in views._table(table)]


def render_overdue(rows: Sequence[Body], now: datetime.datetime) -> list[str]:
    """Overdue (node, policy, check) rows, with how long each has been overdue."""
    if not rows:
        return ["  none: every selected node passed each check within its everySeconds"]
    table = [["NODE", "POLICY", "CHECK", "OVERDUE FOR"]] + [
        [str(r["node"]), str(r["policy"]), str(r["check"]), views.age(r.get("since"), now)] for r in rows
    ]
    return ["  " + line for line in views._table(table)]
