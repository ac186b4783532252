"""Text rendering of the demo: the `kubectl get gpunodes` table, Event lines, the live screen.

Pure functions from a `record.Record` snapshot to lines of at most `width`
characters, so the demo stays readable on an 80-column terminal and the
layout is unit-testable. The table keeps kubectl's columns and headers;
when it is too wide, the MODEL column drops its "NVIDIA " prefix and then
MODEL and ISSUES are shortened with "…" before anything is wrapped.
"""

import dataclasses
from collections.abc import Sequence

from gpuhealth_sim.demo import record

HEADERS = ("NAME", "GPUS", "MODEL", "HEALTH", "ISSUES", "ACTION", "MAXTEMP", "AGE")
GAP = "  "
ELLIPSIS = "…"
MIN_WIDTHS = {"MODEL": 9, "ISSUES": 14}
EVENT_REASON_WIDTH = 18
NODE_WIDTH = 12


def age(created: float | None, now: float) -> str:
    """kubectl's short age: 45s, 3m12s, 2h, 4d."""
    if created is None:
        return "<unknown>"
    seconds = max(0, int(now - created))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 600:
        return f"{seconds // 60}m{seconds % 60}s"
    if seconds < 3 * 3600:
        return f"{seconds // 60}m"
    if seconds < 48 * 3600:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def shorten(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    return text[: max(0, width - 1)] + ELLIPSIS if width > 0 else ""


def shorten_words(text: str, width: int) -> str:
    """Keep the whole words that fit ("H100 80GB HBM3" → "H100 80GB"); a lone long word gets "…"."""
    if len(text) <= width:
        return text
    kept = ""
    for word in text.split():
        candidate = f"{kept} {word}" if kept else word
        if len(candidate) > width:
            break
        kept = candidate
    return kept or shorten(text, width)


def _cells(row: record.Row, now: float) -> list[str]:
    return [
        row.name,
        row.gpus,
        row.model,
        row.health,
        row.issues,
        row.action,
        row.max_temp,
        age(row.created, now),
    ]


def table(rows: Sequence[record.Row], now: float, width: int = 80) -> list[str]:
    """The gpunodes table, header first, every line at most `width` characters."""
    cells = [_cells(row, now) for row in rows]
    model = HEADERS.index("MODEL")
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(HEADERS)]

    def total() -> int:
        return sum(widths) + len(GAP) * (len(widths) - 1)

    if total() > width:
        for c in cells:
            c[model] = c[model].removeprefix("NVIDIA ")
        widths[model] = max([len(HEADERS[model])] + [len(c[model]) for c in cells])
    for name in ("MODEL", "ISSUES"):
        index = HEADERS.index(name)
        excess = total() - width
        if excess > 0:
            widths[index] = max(MIN_WIDTHS[name], widths[index] - excess)
    lines = []
    for values in [list(HEADERS), *cells]:
        values[model] = shorten_words(values[model], widths[model])
        padded = [shorten(v, widths[i]).ljust(widths[i]) for i, v in enumerate(values)]
        lines.append(GAP.join(padded).rstrip()[:width])
    return lines


def clock(at: float, started_at: float) -> str:
    """Time since the demo started, as +SS.Ss (fixed width up to 999 s)."""
    return f"+{max(0.0, at - started_at):5.1f}s"


def event_line(event: record.EventLine, started_at: float, width: int = 80) -> str:
    head = f"{clock(event.at, started_at)} {event.reason:<{EVENT_REASON_WIDTH}} {event.node:<{NODE_WIDTH}} "
    return shorten(head + event.message, width)


def happening_line(happening: record.Happening, started_at: float, width: int = 80) -> str:
    detail = f" ({happening.detail})" if happening.detail else ""
    return shorten(f"{clock(happening.at, started_at)} {happening.node}: {happening.what}{detail}", width)


def row_change_line(at: float, row: record.Row, started_at: float, width: int = 80) -> str:
    issues = row.issues or "-"
    action = row.action or "-"
    return shorten(
        f"{clock(at, started_at)} gpunode {row.name}: {row.health or '?'} {issues} action={action}", width
    )


@dataclasses.dataclass(frozen=True)
class Frame:
    """One redraw of the live screen."""

    title: str
    status: str
    """A line under the title: elapsed time, what is happening."""


def screen(snapshot: record.Record, frame: Frame, now: float, width: int = 80, height: int = 24) -> list[str]:
    """The live screen: title, the gpunodes table, then as many recent Events as fit."""
    lines = [shorten(frame.title, width), shorten(frame.status, width), ""]
    lines += ["$ kubectl get gpunodes"]
    rows = snapshot.rows()
    lines += table(rows, now, width) if rows else ["(waiting for the agents' first reports)"]
    lines += ["", "Events (gpu-health):"]
    room = max(3, height - len(lines) - 1)
    events = snapshot.events()
    lines += [event_line(e, snapshot.started_at, width) for e in events[-room:]] or ["(none yet)"]
    return lines
