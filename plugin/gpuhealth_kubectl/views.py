"""What `status` and `why` show: pure functions from cluster objects (plain dicts) to a report and its text.

A report is plain JSON data (`-o json` prints it as it is); `render_*` lays it
out for a terminal. Which rule fired is worked out the way the operator does
(`decisions.verdicts`): under each policy that selects the node, a rule fires
when its condition is True in GPUNode status and has held for its
`forSeconds`; the strongest node action wins. Fields other issues will add
(`status.repairs[]`, the `domain-degraded` and `needs-repair` labels) are shown
only where present.
"""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from gpuhealth_api import keys, status, timestamps, vocabulary
from gpuhealth_operator.decisions import isolation, model, policies, repair, severity

Body = Mapping[str, Any]
Report = dict[str, Any]

REPAIR_ACTIONS: Final = frozenset({"Repairing", "Validating", "Retired"})
PAUSED_CONDITION: Final = vocabulary.PolicyConditionType.PAUSED.value
READY_CONDITION: Final = vocabulary.PolicyConditionType.READY.value
HEALTH_ORDER: Final = tuple(h.value for h in vocabulary.Health)


# --- small readers --------------------------------------------------------------------------------


def _meta(obj: Body) -> Body:
    return obj.get("metadata") or {}


def _name(obj: Body) -> str:
    return str(_meta(obj).get("name", ""))


def _status(obj: Body | None) -> Body:
    return (obj or {}).get("status") or {}


def _condition(obj: Body, kind: str) -> Body | None:
    return next((c for c in _status(obj).get("conditions") or [] if c.get("type") == kind), None)


def _time(value: object) -> datetime.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.datetime.fromtimestamp(timestamps.parse(value), tz=datetime.UTC)
    except (ValueError, OverflowError):
        return None


def age(value: object, now: datetime.datetime) -> str:
    """ "42s", "5m", "3h", "2d" since an RFC 3339 time; "-" when there is none."""
    when = _time(value)
    if when is None:
        return "-"
    seconds = max(0, int((now - when).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def issue_list(value: object) -> list[str]:
    """`status.issues` (comma-joined on the GPUNode, as `kubectl get` prints it) as a list for JSON."""
    if isinstance(value, list):
        return [str(v) for v in value]
    return [w.strip() for w in str(value or "").split(",") if w.strip()]


def _node_view(node: Body | None, name: str) -> model.NodeView:
    meta = _meta(node or {})
    return model.NodeView(
        name=name,
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        unschedulable=bool(((node or {}).get("spec") or {}).get("unschedulable")),
    )


def parsed_policy(policy: Body) -> tuple[model.Policy | None, str | None]:
    """The policy as the operator reads it, or None and the reason it is invalid."""
    try:
        return policies.parse_policy(
            _name(policy), int(_meta(policy).get("generation") or 0), policy.get("spec") or {}
        ), None
    except (ValueError, TypeError) as error:
        return None, str(error)


def breaker(policy: Body) -> Report:
    """The fleet circuit breaker as the policy's `Paused` condition says it."""
    if (policy.get("spec") or {}).get("dryRun"):
        return {"state": "None", "reason": "DryRun", "message": "a dryRun policy has no breaker"}
    paused = _condition(policy, PAUSED_CONDITION)
    if paused is None:
        return {"state": "Unknown", "reason": "", "message": "the operator has not reported the breaker yet"}
    reason = str(paused.get("reason") or "")
    state = "Closed"
    if paused.get("status") == "True":
        state = "HalfOpen" if reason == vocabulary.PolicyConditionReason.HALF_OPEN else "Open"
    return {
        "state": state,
        "reason": reason,
        "message": str(paused.get("message") or ""),
        "since": paused.get("lastTransitionTime"),
    }


def _verdict(gpunode: Body, policy: str) -> Body:
    """A policy's own verdict on the node: `status.policies[]` when several select it, else the status."""
    own = _status(gpunode)
    verdicts = _policy_verdicts(gpunode)
    if policy in verdicts:
        return {**verdicts[policy], "issues": issue_list(verdicts[policy].get("issues"))}
    if verdicts:  # several policies judged the node, not this one yet: the status reports another's
        return {"policy": policy, "health": None, "issues": None, "action": None}
    return {
        "policy": policy,
        "health": own.get("health"),
        "issues": issue_list(own.get("issues")),
        "action": own.get("action"),
    }


def _policy_verdicts(gpunode: Body) -> dict[str, Body]:
    """policy → its verdict in `status.policies[]` (empty when one policy or none selects the node)."""
    entries = _status(gpunode).get("policies")
    if not isinstance(entries, list):
        return {}
    return {str(e["policy"]): e for e in entries if isinstance(e, Mapping) and e.get("policy")}


# --- status: the fleet at a glance -----------------------------------------------------------------


def status_report(
    policy_bodies: Sequence[Body], gpunodes: Sequence[Body], nodes: Sequence[Body], now: datetime.datetime
) -> Report:
    node_by_name = {_name(n): n for n in nodes}
    rows = []
    for body in sorted(policy_bodies, key=_name):
        rows.append(_policy_row(body, gpunodes, node_by_name))
    attention = [
        _node_row(g, now)
        for g in sorted(gpunodes, key=_name)
        if (_status(g).get("health") or "Unknown") != vocabulary.Health.HEALTHY.value
        or (_status(g).get("action") or "None") not in {"None", ""}
    ]
    report: Report = {
        "gpuNodes": len(gpunodes),
        "health": _health_counts(gpunodes, lambda g: _status(g).get("health")),
        "policies": rows,
        "nodes": attention,
        "drills": [
            {"node": _name(g), "condition": _meta(g).get("annotations", {}).get(keys.DRILL_ANNOTATION)}
            for g in sorted(gpunodes, key=_name)
            if (_meta(g).get("annotations") or {}).get(keys.DRILL_ANNOTATION)
        ],
    }
    repairs = _repairs(gpunodes, node_by_name)
    if repairs:
        report["repairs"] = repairs
    domains = _degraded_domains(policy_bodies, nodes)
    if domains:
        report["degradedDomains"] = domains
    return report


def _node_row(g: Body, now: datetime.datetime) -> Report:
    row: Report = {
        "node": _name(g),
        "health": _status(g).get("health") or "Unknown",
        "issues": issue_list(_status(g).get("issues")),
        "action": _status(g).get("action") or "",
        # A time, not an age: JSON is for scripts; the table shows the age (render_status).
        "lastHeartbeatTime": (_status(g).get("agent") or {}).get("lastHeartbeatTime"),
    }
    retired = retired_for(_status(g).get("repairs") or []) if row["action"] == "Retired" else None
    if retired is not None:  # healthy by now, maybe: what it was retired for
        row["retiredFor"] = retired[0]
    return row


def _issues_words(row: Mapping[str, Any]) -> str:
    issues = ",".join(row.get("issues") or [])
    words = [w for w in (issues, row.get("retiredFor") and f"retired for {row['retiredFor']}") if w]
    return "; ".join(str(w) for w in words) or "-"


def _health_counts(items: Iterable[Body], health: Any) -> dict[str, int]:
    counts = Counter(str(health(i) or "Unknown") for i in items)
    return {h: counts[h] for h in HEALTH_ORDER if counts[h]}


def _policy_row(body: Body, gpunodes: Sequence[Body], node_by_name: Mapping[str, Body]) -> Report:
    name = _name(body)
    spec = body.get("spec") or {}
    own = _status(body)
    ready = _condition(body, READY_CONDITION) or {}
    row: Report = {
        "name": name,
        "dryRun": bool(spec.get("dryRun")),
        "ready": {
            "status": ready.get("status", "Unknown"),
            "reason": ready.get("reason", ""),
            "message": ready.get("message", ""),
        },
        "selected": own.get("selectedNodes"),
        "unhealthy": own.get("unhealthyNodes"),
        "cordoned": own.get("cordonedNodes"),
        "pending": own.get("pendingNodes"),
        "breaker": breaker(body),
    }
    parsed, error = parsed_policy(body)
    if parsed is None:
        row["error"] = error
        return row
    selected = [
        g
        for g in gpunodes
        if _name(g) in node_by_name and policies.selects(parsed, _node_view(node_by_name[_name(g)], _name(g)))
    ]
    row["health"] = _health_counts(selected, lambda g: _verdict(g, name).get("health"))
    unavailable = sum(1 for g in selected if (node_by_name[_name(g)].get("spec") or {}).get("unschedulable"))
    row["budget"] = {
        "maxUnavailable": parsed.max_unavailable,
        "allowed": policies.resolve_max_unavailable(parsed, len(selected)),
        "unavailable": unavailable,
    }
    return row


def repair_cycles(history: Sequence[Body], node: Body | None) -> int:
    """The repair cycles a node ran: distinct cycle numbers of its history (several entries each) and of
    the cycle starts the Node keeps (`keys.REPAIR_CYCLES_ANNOTATION`, what maxAttempts counts)."""
    started = repair.parse_cycles(
        (_meta(node or {}).get("annotations") or {}).get(keys.REPAIR_CYCLES_ANNOTATION)
    )
    numbers = {
        c for e in history if isinstance(c := e.get("cycle"), int) and not isinstance(c, bool) and c > 0
    }
    return len(numbers | {n for n, _ in started})


def retired_for(history: Sequence[Body]) -> tuple[str, int | None] | None:
    """(the fault, its cycle) that began the cycle the node was last retired in; None if never retired or
    not recorded (an operator before issue 45 wrote no `fault`)."""
    last = next((e for e in reversed(history) if e.get("result") == "Retired"), None)
    if last is None:
        return None
    cycle = last.get("cycle") if isinstance(last.get("cycle"), int) else None
    if last.get("fault"):
        return str(last["fault"]), cycle
    began = next((e for e in history if e.get("cycle") == cycle and e.get("fault")), None)
    return (str(began["fault"]), cycle) if began is not None else None


def _repairs(gpunodes: Sequence[Body], node_by_name: Mapping[str, Body]) -> list[Report]:
    """Nodes in repair, retired, or with repair history; empty until repair exists (DESIGN.md wave 3)."""
    found = []
    for g in sorted(gpunodes, key=_name):
        history = _status(g).get("repairs") or []
        action = _status(g).get("action") or ""
        node = node_by_name.get(_name(g))
        label = (_meta(node or {}).get("labels") or {}).get(keys.NEEDS_REPAIR_LABEL)
        if history or action in REPAIR_ACTIONS or label:
            entry: Report = {"node": _name(g), "action": action, "cycles": repair_cycles(history, node)}
            if history:
                entry["last"] = history[-1]
            retired = retired_for(history)
            if retired is not None and action == "Retired":
                entry["retiredFor"] = retired[0]
            if label:
                entry["needsRepair"] = label
            found.append(entry)
    return found


def _degraded_domains(policy_bodies: Sequence[Body], nodes: Sequence[Body]) -> list[Report]:
    """Nodes labelled domain-degraded, grouped by the domain keys the policies name (else one group)."""
    degraded = [n for n in nodes if (_meta(n).get("labels") or {}).get(keys.DOMAIN_DEGRADED_LABEL) == "true"]
    if not degraded:
        return []
    domain_keys = sorted(
        {
            str(d.get("key"))
            for p in policy_bodies
            for d in ((p.get("spec") or {}).get("topology") or {}).get("domains") or []
            if d.get("key")
        }
    )
    groups: dict[tuple[str, str], list[str]] = {}
    for node in degraded:
        labels = _meta(node).get("labels") or {}
        key = next((k for k in domain_keys if k in labels), "")
        groups.setdefault((key, str(labels.get(key, "")) if key else ""), []).append(_name(node))
    return [{"key": k, "value": v, "nodes": sorted(names)} for (k, v), names in sorted(groups.items())]


def render_status(report: Report, now: datetime.datetime | None = None) -> str:
    now = now or datetime.datetime.now(datetime.UTC)
    lines = []
    counts = ", ".join(f"{n} {h}" for h, n in report["health"].items()) or "none reported"
    lines.append(f"GPU nodes: {report['gpuNodes']} ({counts})")
    lines.append("")
    if report["policies"]:
        table = [["POLICY", "MODE", "SELECTED", "HEALTH", "BUDGET", "PENDING", "BREAKER"]]
        for row in report["policies"]:
            mode = "dry-run" if row["dryRun"] else "acting"
            if row["ready"]["status"] == "False":
                mode = f"invalid ({row['ready']['reason']})"
            budget = row.get("budget")
            table.append(
                [
                    row["name"],
                    mode,
                    _dash(row["selected"]),
                    ", ".join(f"{n} {h}" for h, n in (row.get("health") or {}).items()) or "-",
                    f"{budget['unavailable']}/{budget['allowed']} unschedulable" if budget else "-",
                    _dash(row["pending"]),
                    row["breaker"]["state"],
                ]
            )
        lines.extend(_table(table))
        for row in report["policies"]:
            if row["breaker"]["state"] in {"Open", "HalfOpen"}:
                lines.append(
                    f"  breaker of {row['name']} is {row['breaker']['state']}: {row['breaker']['message']}"
                )
                lines.append(f"    resume: kubectl gpuhealth resume {row['name']}")
            if row.get("error"):
                lines.append(f"  policy {row['name']} is invalid: {row['error']}")
    else:
        lines.append("No GPUHealthPolicy: nothing is judged.")
    lines.append("")
    if report["nodes"]:
        table = [["NODE", "HEALTH", "ISSUES", "ACTION", "HEARTBEAT"]]
        table += [
            [n["node"], n["health"], _issues_words(n), n["action"] or "-", age(n["lastHeartbeatTime"], now)]
            for n in report["nodes"]
        ]
        lines.extend(_table(table))
        lines.append("  explain one: kubectl gpuhealth why NODE")
    else:
        lines.append("Every GPU node is Healthy and untouched.")
    for drill in report["drills"]:
        lines.append(f"Drill running on {drill['node']}: {drill['condition']}")
    if report.get("repairs"):
        lines.append("")
        table = [["REPAIR NODE", "ACTION", "CYCLES", "RETIRED FOR", "LAST"]]
        for r in report["repairs"]:
            last = r.get("last") or {}
            text = " ".join(str(last.get(k)) for k in ("step", "result") if last.get(k)) or r.get(
                "needsRepair", "-"
            )
            table.append([r["node"], r["action"] or "-", str(r["cycles"]), r.get("retiredFor") or "-", text])
        lines.extend(_table(table))
    if report.get("degradedDomains"):
        lines.append("")
        for d in report["degradedDomains"]:
            where = f"{d['key']}={d['value']}" if d["key"] else "domain"
            lines.append(f"Degraded {where}: {', '.join(d['nodes'])}")
    return "\n".join(lines).rstrip() + "\n"


# --- why: one node, from facts to Events -------------------------------------------------------------


def gpu_facts(gpunode: Body) -> list[Report]:
    """Per GPU, the facts that stand out (what a fatal or sustained condition reads); quiet GPUs omitted."""
    found = []
    for gpu in _status(gpunode).get("gpus") or []:
        notes = _gpu_notes(gpu)
        if notes:
            found.append({"index": gpu.get("index"), "uuid": gpu.get("uuid"), "facts": notes})
    return found


def _gpu_notes(gpu: Body) -> list[str]:
    notes = []
    if gpu.get("lost"):
        notes.append("lost (fell off the bus)")
    ecc = gpu.get("ecc") or {}
    if ecc.get("uncorrectedVolatile"):
        notes.append(f"ecc.uncorrectedVolatile={ecc['uncorrectedVolatile']}")
    rows = gpu.get("remappedRows") or {}
    for field in ("failure", "pending"):
        if rows.get(field):
            notes.append(f"remappedRows.{field}={rows[field]}")
    pages = gpu.get("retiredPages") or {}
    if pages.get("pending"):
        notes.append(f"retiredPages.pending={pages['pending']}")
    for xid in gpu.get("xids") or []:
        notes.append(f"xid {xid.get('code')} x{xid.get('count', 1)} (last {xid.get('lastSeen', '?')})")
    recovery = gpu.get("recoveryAction")
    if recovery and recovery != vocabulary.RecoveryAction.NONE.value:
        notes.append(f"recoveryAction={recovery}")
    reasons = [
        r for r in gpu.get("clockEventReasons") or [] if r in status.THERMAL_REASONS | status.POWER_REASONS
    ]
    if reasons:
        notes.append(f"clockEventReasons={','.join(reasons)}")
    temperature, slowdown = gpu.get("temperatureCelsius"), gpu.get("slowdownTemperatureCelsius")
    if isinstance(temperature, int | float) and isinstance(slowdown, int | float) and temperature >= slowdown:
        notes.append(f"temperature {temperature}C >= slowdown {slowdown}C")
    pcie = gpu.get("pcie") or {}
    for now_key, max_key in (("generation", "maxGeneration"), ("width", "maxWidth")):
        if (
            isinstance(pcie.get(now_key), int)
            and isinstance(pcie.get(max_key), int)
            and pcie[now_key] < pcie[max_key]
        ):
            notes.append(f"pcie.{now_key}={pcie[now_key]} < {pcie[max_key]}")
    return notes


def _held_seconds(condition: Body, now: datetime.datetime) -> float | None:
    since = _time(condition.get("observedSince")) or _time(condition.get("lastTransitionTime"))
    return None if since is None else (now - since).total_seconds()


def rules_for(parsed: model.Policy, conditions: Sequence[Body], now: datetime.datetime) -> Report:
    """The policy's rules on the node's True conditions: those that fired (strongest first) and those
    that wait for their forSeconds; as `decisions.verdicts.judge` ranks them."""
    true = {str(c.get("type")): c for c in conditions if c.get("status") == "True"}
    fired: list[model.Rule] = []
    waiting: list[Report] = []
    for rule in parsed.rules:
        condition = true.get(rule.condition.value)
        if condition is None:
            continue
        held = _held_seconds(condition, now)
        if held is not None and held < rule.for_seconds:
            waiting.append({**_rule(rule), "firesInSeconds": round(rule.for_seconds - held)})
        else:
            fired.append(rule)
    fired.sort(
        key=lambda r: (
            -vocabulary.ACTION_ORDER[isolation.node_action(r.action)],
            severity.rank(r.condition),
            r.name,
        )
    )
    return {
        "policy": parsed.name,
        "dryRun": parsed.dry_run,
        "fired": [_rule(r) for r in fired],
        "waiting": waiting,
        "wins": _rule(fired[0]) if fired else None,
    }


def _rule(rule: model.Rule) -> Report:
    return {
        "rule": rule.name,
        "condition": rule.condition.value,
        "action": rule.action.value,
        "forSeconds": rule.for_seconds,
    }


def why_report(
    name: str,
    node: Body | None,
    gpunode: Body | None,
    *,
    policy_bodies: Sequence[Body],
    events: Sequence[Body],
    now: datetime.datetime,
) -> Report:
    meta = _meta(node or {})
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    own = _status(gpunode)
    gpunode_annotations = _meta(gpunode or {}).get("annotations") or {}
    view = _node_view(node, name)
    conditions = [dict(c) for c in own.get("conditions") or []]
    selecting: list[Report] = []
    for body in sorted(policy_bodies, key=_name):
        parsed, error = parsed_policy(body)
        if parsed is None:
            if policies.excluded(view):
                continue
            selecting.append({"policy": _name(body), "error": error})
        elif node is not None and policies.selects(parsed, view):
            entry = rules_for(parsed, conditions, now)
            entry["verdict"] = _verdict(gpunode or {}, parsed.name)
            entry["breaker"] = breaker(body)
            entry["listed"] = True
            selecting.append(entry)
    # A verdict the operator wrote for a policy not matched above (deleted since, not readable, or
    # its selector no longer matches the Node): still one of the node's verdicts, shown as written.
    shown = {str(entry["policy"]) for entry in selecting}
    for policy_name, written in _policy_verdicts(gpunode or {}).items():
        if policy_name not in shown:
            selecting.append(
                {
                    "policy": policy_name,
                    "dryRun": bool(written.get("dryRun")),
                    "verdict": dict(written),
                    "listed": False,
                }
            )
    selecting.sort(key=lambda entry: str(entry["policy"]))
    report: Report = {
        "node": name,
        "nodeExists": node is not None,
        "gpuNodeExists": gpunode is not None,
        "schedulable": not view.unschedulable,
        "excluded": policies.excluded(view),
        "cordonedBy": annotations.get(keys.CORDONED_BY_ANNOTATION),
        "cordonedAt": annotations.get(keys.CORDONED_AT_ANNOTATION),
        "labels": {k: v for k, v in sorted(labels.items()) if k.startswith(f"{keys.PREFIX}/")},
        "annotations": {k: v for k, v in sorted(annotations.items()) if k.startswith(f"{keys.PREFIX}/")},
        "taints": [
            t
            for t in ((node or {}).get("spec") or {}).get("taints") or []
            if str(t.get("key", "")).startswith(f"{keys.PREFIX}/")
        ],
        "nodeCondition": next(
            (
                c
                for c in ((node or {}).get("status") or {}).get("conditions") or []
                if c.get("type") == keys.NODE_CONDITION_TYPE
            ),
            None,
        ),
        "agent": {
            k: v
            for k, v in (own.get("agent") or {}).items()
            if k in {"version", "backend", "lastHeartbeatTime", "error", "driverVersion"}
        },
        "health": own.get("health"),
        "issues": issue_list(own.get("issues")),
        "action": own.get("action"),
        "facts": gpu_facts(gpunode or {}),
        "straggler": own.get("straggler"),
        "conditions": sorted(conditions, key=lambda c: (c.get("status") != "True", str(c.get("type")))),
        "policies": selecting,
        "events": [_event(e) for e in sorted(events, key=_event_time)],
    }
    drill = gpunode_annotations.get(keys.DRILL_ANNOTATION)
    if drill:
        report["drill"] = {
            "condition": drill,
            "ttl": gpunode_annotations.get(keys.DRILL_TTL_ANNOTATION),
            "started": gpunode_annotations.get(keys.DRILL_STARTED_ANNOTATION),
        }
    if own.get("isolatedGPUs"):
        report["isolatedGPUs"] = own["isolatedGPUs"]
    if own.get("repairs"):
        report["repairs"] = own["repairs"]
        retired = retired_for(own["repairs"]) if own.get("action") == "Retired" else None
        if retired is not None:
            report["retiredFor"] = {"fault": retired[0], "cycle": retired[1]}
    return report


def _event_time(event: Body) -> str:
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or event.get("firstTimestamp")
        or _meta(event).get("creationTimestamp")
        or ""
    )


def _event(event: Body) -> Report:
    involved = event.get("involvedObject") or {}
    return {
        "time": _event_time(event),
        "type": event.get("type"),
        "reason": event.get("reason"),
        "message": event.get("message"),
        "count": event.get("count") or 1,
        "object": f"{involved.get('kind', '')}/{involved.get('name', '')}",
    }


def render_why(report: Report, now: datetime.datetime) -> str:
    name = report["node"]
    lines = []
    if not report["gpuNodeExists"]:
        lines.append(f"{name}: no GPUNode, so no agent reports on this node and no policy judges it.")
    else:
        issues = ",".join(report["issues"]) or "no issues"
        retired = report.get("retiredFor")
        why = ""
        if retired:
            cycle = f" in repair cycle {retired['cycle']}" if retired.get("cycle") is not None else ""
            why = f" (retired for {retired['fault']}{cycle})"
        health = report["health"] or "not judged yet"
        lines.append(f"{name}: {health} ({issues}), action {report['action'] or '-'}{why}")
    if not report["nodeExists"]:
        lines.append("  the Node does not exist")
    else:
        state = "schedulable" if report["schedulable"] else "cordoned (unschedulable)"
        if report["cordonedBy"]:
            state += f" by policy {report['cordonedBy']}"
            if report["cordonedAt"]:
                state += f" {age(report['cordonedAt'], now)} ago"
        elif not report["schedulable"]:
            state += f" by someone else (no {keys.CORDONED_BY_ANNOTATION})"
        lines.append(f"  Node: {state}")
        if report["excluded"]:
            lines.append(f"  excluded: {keys.EXCLUDE_LABEL}=true, no policy judges or acts on it")
        marks = [f"{k}={v}" for k, v in report["labels"].items()]
        marks += [f"{k}={v}" for k, v in report["annotations"].items() if k != keys.CORDONED_BY_ANNOTATION]
        marks += [f"taint {t.get('key')}={t.get('value', '')}:{t.get('effect')}" for t in report["taints"]]
        if marks:
            lines.append(f"  marks: {', '.join(marks)}")
    agent = report["agent"]
    if agent:
        heartbeat = age(agent.get("lastHeartbeatTime"), now)
        line = (
            f"  agent: {agent.get('version', '?')} ({agent.get('backend', '?')}), heartbeat {heartbeat} ago"
        )
        if agent.get("error"):
            line += f"; error: {agent['error']}"
        lines.append(line)
    if report.get("drill"):
        d = report["drill"]
        lines.append(
            f"  drill running: {d['condition']} (ttl {d['ttl'] or '10m'},"
            f" started {age(d['started'], now)} ago)"
        )

    lines += ["", "Facts (agent):"]
    for gpu in report["facts"]:
        lines.append(f"  GPU {gpu['index']} {gpu['uuid'] or ''}: {'; '.join(gpu['facts'])}")
    if report.get("straggler"):
        s = report["straggler"]
        lines.append(f"  straggler score {s.get('score')} (z {s.get('zScore')}, {s.get('peers')} peers)")
    if not report["facts"] and not report.get("straggler"):
        lines.append("  nothing stands out")

    lines += ["", "Conditions (operator):"]
    true = [c for c in report["conditions"] if c.get("status") != "False"]
    for c in true:
        since = c.get("observedSince") or c.get("lastTransitionTime")
        lines.append(
            f"  {c.get('type')}={c.get('status')} for {age(since, now)}:"
            f" {c.get('message') or c.get('reason') or ''}"
        )
    if not true:
        lines.append("  no condition is True")
    others = len(report["conditions"]) - len(true)
    if others:
        lines.append(f"  ({others} other conditions False)")

    lines += ["", "Rules:"]
    if not report["policies"]:
        lines.append("  no policy selects this node")
    for p in report["policies"]:
        if p.get("error"):
            lines.append(f"  policy {p['policy']}: invalid, not acting ({p['error']})")
            continue
        verdict = p.get("verdict") or {}
        dry_run = verdict.get("dryRun", p["dryRun"])  # as judged; the spec may have changed since
        mode = " (dryRun: decides and says, changes nothing)" if dry_run else ""
        issues = f" ({','.join(issue_list(verdict['issues']))})" if verdict.get("issues") else ""
        lines.append(
            f"  policy {p['policy']}{mode}: {verdict.get('health') or 'not judged yet'}{issues},"
            f" action {verdict.get('action') or '-'}"
        )
        if not p.get("listed", True):
            lines.append(
                "    not among the policies listed (deleted, not readable, or no longer selecting"
                " the Node): the operator's last verdict"
            )
            continue
        for r in p["fired"]:
            won = "  <- wins" if r == p["wins"] else ""
            lines.append(f"    rule {r['rule']}: {r['condition']} -> {r['action']} fired{won}")
        for r in p["waiting"]:
            lines.append(
                f"    rule {r['rule']}: {r['condition']} -> {r['action']}"
                f" fires in {r['firesInSeconds']}s (forSeconds)"
            )
        if not p["fired"] and not p["waiting"]:
            lines.append("    no rule fires")
        if p["breaker"]["state"] in {"Open", "HalfOpen"}:
            lines.append(f"    breaker {p['breaker']['state']}: {p['breaker']['message']}")

    if report.get("isolatedGPUs"):
        lines += ["", "Isolated GPUs:"]
        for gpu in report["isolatedGPUs"]:
            lines.append(
                f"  GPU {gpu.get('index')} {gpu.get('uuid', '')}: {gpu.get('state', '')}"
                f" by rule {gpu.get('rule', '?')}"
            )
    if report.get("repairs"):
        lines += ["", "Repairs (oldest first):"]
        lines += ["  " + repair_line(r, now) for r in report["repairs"]]

    lines += ["", "Events (oldest first):"]
    for e in report["events"]:
        count = f" (x{e['count']})" if e["count"] > 1 else ""
        lines.append(f"  {age(e['time'], now):>4}  {e['type'] or '':7} {e['reason']}{count}: {e['message']}")
    if not report["events"]:
        lines.append("  none (Events expire after an hour by default)")
    return "\n".join(lines) + "\n"


def repair_line(entry: Body, now: datetime.datetime) -> str:
    """One `status.repairs[]` entry in words: `5m  cycle 3  reset (ResetGPU) NoEffect on GPU-…: why`."""
    step, action = entry.get("step") or "", entry.get("action") or ""
    what = f"{step} ({action}) " if step and action else (f"{step or action} " if step or action else "")
    gpus = entry.get("gpus") or []
    on = f" on {', '.join(str(g) for g in gpus)}" if action and gpus else ""
    message = f": {entry['message']}" if entry.get("message") else ""
    fault = f" (fault {entry['fault']})" if entry.get("fault") else ""
    when = age(entry.get("time"), now)
    return f"{when:>4}  cycle {entry.get('cycle', '?')}  {what}{entry.get('result')}{on}{message}{fault}"


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
