"""`status --watch`: poll, and draw the screen again only when it changed; Ctrl-C ends it.

Polling (not a Kubernetes watch) because `status` joins four kinds of object
(policies, GPUNodes, Nodes, Events' cousins): one list of each per interval is
cheap at fleet scale and needs only the `list` verbs the on-call role grants.
Pure apart from the callables it is handed, so it is tested without a cluster.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Final, TextIO

from gpuhealth_api import timestamps

CLEAR: Final = "\x1b[H\x1b[2J"
"""Cursor home, clear screen: what `watch(1)` does before each redraw on a terminal."""

DEFAULT_INTERVAL: Final = 5.0


def watch(
    poll: Callable[[], tuple[str, str]],
    *,
    interval: float,
    count: int | None,
    sleep: Callable[[float], None],
    out: TextIO,
    tty: bool,
    header: bool = True,
) -> int:
    """Draw the screen `poll()` returns now and whenever its key (the report as data, so a table's
    ticking ages alone are no change) differs from the last drawn; return how many were drawn.

    `count` stops after that many draws (tests, scripts); None runs until Ctrl-C. On a terminal each
    draw replaces the last; piped, each is appended, under a `--- time` line when `header` (not for
    JSON, which stays one document a line for `jq`).
    """
    drawn = 0
    last: str | None = None
    try:
        while count is None or drawn < count:
            key, text = poll()
            if key != last:
                stamp = timestamps.render(datetime.datetime.now(datetime.UTC).replace(microsecond=0))
                if tty:
                    out.write(CLEAR)
                elif header:
                    out.write(f"--- {stamp}\n")
                out.write(text)
                out.flush()
                last, drawn = key, drawn + 1
                if count is not None and drawn >= count:
                    break
            sleep(interval)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a watch ends: no traceback, exit 0
    return drawn


def interval(text: str) -> float:
    """`--interval` as seconds > 0 (argparse type: a ValueError is its usage error)."""
    seconds = float(text)
    if not seconds > 0:
        raise ValueError(text)
    return seconds
