"""Show a `record.Record` as it fills: a redrawn screen on a terminal, plain lines elsewhere.

On a terminal the screen is redrawn in place (the gpunodes table and the
latest Events), like `watch kubectl get gpunodes`. When stdout is a pipe
or a CI log, redrawing would bury the story in escape codes and repeats,
so each new thing becomes one line instead: every gpu-health Event, every
change to a Node (cordon, label) and every change of a GPUNode's health,
issues or action, in the order they arrived.
"""

import shutil
import time
from typing import TextIO

from gpuhealth_sim.demo import record, view

HOME = "\x1b[H"
CLEAR_LINE = "\x1b[K"
CLEAR_BELOW = "\x1b[J"
CLEAR_SCREEN = "\x1b[2J"


class Live:
    def __init__(self, seen: record.Record, out: TextIO, *, tty: bool, width: int | None = None) -> None:
        self.seen = seen
        self.out = out
        self.tty = tty
        self.width = width
        self._printed_events = 0
        self._printed_happenings = 0
        self._printed_changes = 0
        self._verdicts: dict[str, tuple[str, str, str]] = {}
        self._drawn = False

    def size(self) -> tuple[int, int]:
        columns, lines = shutil.get_terminal_size((80, 24))
        return (self.width or columns), lines

    def refresh(self, title: str, status: str) -> None:
        """Redraw (terminal) or print what is new since the last call (plain)."""
        width, height = self.size()
        now = time.time()
        if self.tty:
            lines = view.screen(self.seen, view.Frame(title, status), now, width, height)
            # Overwrite in place (home, each line then clear its rest, clear below): no flicker.
            first = "" if self._drawn else CLEAR_SCREEN
            self._drawn = True
            self.out.write(first + HOME + "".join(line + CLEAR_LINE + "\n" for line in lines) + CLEAR_BELOW)
        else:
            for line in self._new_lines(width):
                self.out.write(line + "\n")
        self.out.flush()

    def _new_lines(self, width: int) -> list[str]:
        started = self.seen.started_at
        timed: list[tuple[float, str]] = []
        events = self.seen.events()
        timed += [(e.at, view.event_line(e, started, width)) for e in events[self._printed_events :]]
        self._printed_events = len(events)
        happenings = self.seen.happenings()
        timed += [
            (h.at, view.happening_line(h, started, width)) for h in happenings[self._printed_happenings :]
        ]
        self._printed_happenings = len(happenings)
        changes = self.seen.row_changes()
        for at, row in changes[self._printed_changes :]:
            if self._worth_a_line(row):
                timed.append((at, view.row_change_line(at, row, started, width)))
        self._printed_changes = len(changes)
        return [line for _, line in sorted(timed, key=lambda item: item[0])]

    def _worth_a_line(self, row: record.Row) -> bool:
        """A GPUNode verdict that changed, except a node's first, unremarkable Healthy."""
        verdict = (row.health, row.issues, row.action)
        before = self._verdicts.get(row.name)
        if not row.health or not row.reported or verdict == before:
            return False  # not judged yet, judged before the agent's first report, or nothing new
        self._verdicts[row.name] = verdict
        quiet = row.health == "Healthy" and not row.issues and row.action in ("", "None")
        return not (quiet and before is None)

    def table(self) -> None:
        """Print the gpunodes table once, as plain lines (start and end of a non-terminal run)."""
        width, _ = self.size()
        self.out.write("$ kubectl get gpunodes\n")
        for line in view.table(self.seen.rows(), time.time(), width):
            self.out.write(line + "\n")
        self.out.flush()
