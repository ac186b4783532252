"""Two backtest reports of the same trace, compared: what changed between two versions of the code.

Reads two JSON reports (`gpu-health-sim backtest -o json`, or the `.backtest.json`
bench/backtest_quality.py writes beside its trace), leaves out the timing
fields, and prints every summary figure, score figure, node action and Event
that differs, per node, with the trace's truth records that overlap the
node's changed actions, so that each change can be explained from the truth.

    .venv/bin/python bench/compare_backtests.py OLD.json NEW.json [--trace T.jsonl.gz] [--policy default]
"""

import argparse
import collections
import difflib
import json
import pathlib
import sys
from typing import Any

from gpuhealth_sim.backtest import traces

TIMING = {"replaySeconds", "replayCpuSeconds"}
SHIFT_SECONDS = 1.0
"""An action found in both reports whose time moved by more than this is listed as moved."""


def load(path: pathlib.Path, policy: str | None) -> dict[str, Any]:
    """One policy's report: `backtest -o json` nests them under `policies`; the bench file is one."""
    data = json.loads(path.read_text(encoding="utf-8"))
    reports = data.get("policies", [data])
    for report in reports:
        if policy is None or report.get("policy") == policy:
            return dict(report)
    raise SystemExit(f"{path}: no policy {policy!r}")


def flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys (lists stay whole: they are compared as values)."""
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, item in value.items():
        out.update(flat(item, f"{prefix}.{key}" if prefix else key))
    return out


def figures(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    skip = TIMING | {"nodeActions", "events", "trace"}
    a = flat({k: v for k, v in old.items() if k not in skip})
    b = flat({k: v for k, v in new.items() if k not in skip})
    return [f"  {k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def by_node(rows: list[dict[str, Any]], key: str) -> dict[str, list[dict[str, Any]]]:
    nodes: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for row in rows:
        nodes[row["node"]].append(row)
    for items in nodes.values():
        items.sort(key=lambda r: (r["t"], r[key]))
    return nodes


def node_changes(old: list[dict[str, Any]], new: list[dict[str, Any]], key: str) -> list[str]:
    """The rows only one side has, and the rows both have at a different time (matched in order)."""
    matcher = difflib.SequenceMatcher(a=[r[key] for r in old], b=[r[key] for r in new], autojunk=False)
    lines: list[str] = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            for a, b in zip(old[i1:i2], new[j1:j2], strict=True):
                if abs(a["t"] - b["t"]) > SHIFT_SECONDS:
                    lines.append(f"    moved {_clock(a['t'])} -> {_clock(b['t'])}: {a[key]}")
            continue
        lines += [f"    old {_clock(r['t'])}: {r[key]} {_detail(r)}" for r in old[i1:i2]]
        lines += [f"    new {_clock(r['t'])}: {r[key]} {_detail(r)}" for r in new[j1:j2]]
    return lines


def _detail(row: dict[str, Any]) -> str:
    text = row.get("reason") if "action" in row else row.get("message")
    return f"({text})" if text else ""


def _clock(t: float) -> str:
    day, rest = divmod(int(t), 86400)
    return f"d{day}+{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"


def truth(trace: pathlib.Path | None) -> dict[str, list[dict[str, Any]]]:
    if trace is None:
        return {}
    records: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    with traces.open_trace(trace) as (_, rows):
        for row in rows:
            if row.get("kind") == "truth" and row.get("type") != "node":
                records[row["node"]].append(row)
    return records


def main() -> int:
    top = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    top.add_argument("old", type=pathlib.Path)
    top.add_argument("new", type=pathlib.Path)
    top.add_argument("--trace", type=pathlib.Path, help="the replayed trace: its truth per changed node")
    top.add_argument("--policy", help="the policy to compare (default: the first)")
    args = top.parse_args()
    old, new = load(args.old, args.policy), load(args.new, args.policy)
    print("figures that differ (timing left out):")
    print("\n".join(figures(old, new)) or "  none")
    actions_old, actions_new = by_node(old["nodeActions"], "action"), by_node(new["nodeActions"], "action")
    events_old, events_new = by_node(old["events"], "reason"), by_node(new["events"], "reason")
    known = truth(args.trace)
    changed = 0
    for node in sorted(set(actions_old) | set(actions_new) | set(events_old) | set(events_new)):
        actions = node_changes(actions_old.get(node, []), actions_new.get(node, []), "action")
        events = node_changes(events_old.get(node, []), events_new.get(node, []), "reason")
        if not actions and not events:
            continue
        changed += 1
        print(f"\n{node}:")
        if actions:
            print("  actions:\n" + "\n".join(actions))
        if events:
            print("  events:\n" + "\n".join(events))
        for record in known.get(node, []):
            start = record.get("start", 0.0)
            span = f"{_clock(start)}..{_clock(record.get('end', start))}"
            rest = {k: v for k, v in record.items() if k not in {"kind", "node", "start", "end"}}
            print(f"  truth {span}: {json.dumps(rest, sort_keys=True)}")
    print(f"\n{changed} node(s) changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
