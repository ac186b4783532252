#!/usr/bin/env python3
"""Move `ctx.<field>` to the step memory that owns it now (issue 46): `ctx.isolations` →
`ctx.steps.isolate.isolations`, `ctx.stragglers` → `ctx.judging.stragglers`, ...

Re-runnable and idempotent: a moved name no longer matches (`ctx.steps.isolate.isolations` is not
`ctx.isolations`), so running it over a tree already moved changes nothing. Written for the merger:
a branch that still says `ctx.<old field>` is brought over by running

    python3 hack/move_memories.py [ROOT ...]     # default: operator/ tests/ sim/ bench/ plugin/

It rewrites `.py` files in place and prints each file it changed. The receivers it knows are the
names the code gives a Context (`ctx`, `_ctx`, `self.ctx`, `memo`, `restarted`, `successor`) and
`Context.` in prose. In `verdict/` and `runtime/` (readers, not owners) a few fields move to the
read-only views of `ladder/memories.py` instead (`READERS`); a write through a view fails the type
check, which is the point. It does not rename modules or functions.
"""

from __future__ import annotations

import pathlib
import re
import sys
import types

MOVES = types.MappingProxyType(
    {
        # judging (state/judged.py)
        "stragglers": "judging.stragglers",
        "straggler_samples": "judging.straggler_samples",
        "straggler_cohorts": "judging.straggler_cohorts",
        "resting": "judging.resting",
        # policy status (shared/context.py StatusMemory)
        "policy_status_written": "status.written",
        "status_marks": "status.marks",
        "gpus_counted_marks": "status.gpus_marks",
        # isolate (ladder/isolate/memory.py)
        "isolation_support": "steps.isolate.support",
        "isolations": "steps.isolate.isolations",
        "rules_read": "steps.isolate.rules_read",
        "devices_read": "steps.isolate.devices_read",
        "isolation_discovery": "steps.isolate.discovery",
        "isolation_locks": "steps.isolate.locks",
        # dry runs of every step (ladder/memories.py)
        "dry_run_said": "steps.dry_run.said",
        # repair (ladder/repair/memory.py)
        "repair_history": "steps.repair.history",
        "repair_finished_seen": "steps.repair.finished_seen",
        "validations_running": "steps.repair.validations",
        "repair_tokens": "steps.repair.tokens",
        "repair_busy_said": "steps.repair.busy_said",
        "repair_waiting": "steps.repair.waiting",
        "repair_refused": "steps.repair.refused",
        "repair_permitted": "steps.repair.permitted",
        "gone_nodes": "steps.repair.gone_nodes",
        "repair_templates": "steps.repair.templates",
        # cordon (ladder/cordon/memory.py)
        "cordons_unknown": "steps.cordon.unknown",
        "announced_cordons": "steps.cordon.announced",
        # drain (ladder/drain/memory.py: the drains' owner itself)
        "drains": "steps.drain",
        "eviction_slots": "steps.drain.eviction_slots",
        # drill (ladder/drill/memory.py)
        "drill_said": "steps.drill.said",
        "drill_health": "steps.drill.health",
        # domain (ladder/domain/memory.py)
        "domains": "steps.domain",
        # new-node validation (ladder/new_nodes/memory.py)
        "new_nodes_in_service": "steps.new_nodes.in_service",
        "new_nodes_said": "steps.new_nodes.said",
    }
)
"""Old Context field → its place now, relative to the Context."""

READERS = types.MappingProxyType(
    {
        "isolations": "steps.isolated",
        "repair_history": "steps.repairs",
        "cordons_unknown": "steps.cordons_unknown",
    }
)
"""In the reading packages (`READING`), these fields move to the typed read-only views."""

READING = ("gpuhealth_operator/verdict/", "gpuhealth_operator/runtime/ticker.py")

RECEIVER = r"(?P<receiver>\b(?:_?ctx|memo|restarted|successor|Context))"
ROOTS = ("operator", "tests", "sim", "bench", "plugin")
SKIP = ("hack/move_memories.py", "gpuhealth_operator/shared/context.py")


_FIELDS = "|".join(sorted(map(re.escape, MOVES), key=len, reverse=True))
_ALL = re.compile(rf"{RECEIVER}\.(?P<field>{_FIELDS})\b(?!\s*=[^=])")
_ASSIGNED = re.compile(rf"{RECEIVER}\.(?P<field>{_FIELDS})\b(?=\s*=[^=])")


def move(text: str, *, reading: bool) -> str:
    """`text` with every Context field moved; in a reading package the views where there is one."""

    def where(match: re.Match[str]) -> str:
        field = match["field"]
        target = READERS[field] if reading and field in READERS else MOVES[field]
        return f"{match['receiver']}.{target}"

    def assigned(match: re.Match[str]) -> str:  # an assignment goes to the owner, never to a view
        return f"{match['receiver']}.{MOVES[match['field']]}"

    return _ALL.sub(where, _ASSIGNED.sub(assigned, text))


def _is_memory_module(path: pathlib.Path) -> bool:
    return path.name in {"memory.py", "memories.py"} and "gpuhealth_operator" in path.parts


def main(argv: list[str]) -> int:
    roots = [pathlib.Path(a) for a in argv] or [pathlib.Path(r) for r in ROOTS if pathlib.Path(r).exists()]
    for root in roots:
        files = [root] if root.is_file() else sorted(root.rglob("*.py"))
        for path in files:
            posix = path.as_posix()
            if posix.endswith(SKIP) or _is_memory_module(path):
                continue  # the moved fields' new homes, and this script's own table
            text = path.read_text()
            new = move(text, reading=any(part in posix for part in READING))
            if new != text:
                path.write_text(new)
                print(posix)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
