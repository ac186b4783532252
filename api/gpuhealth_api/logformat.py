"""Log lines for people (`text`, the default) or for a log pipeline (`json`), one setup for every command.

`--log-format json` writes one JSON object per line: `time` (RFC 3339, UTC,
milliseconds), `level`, `logger`, `message`, and `exception` (the traceback's
text) when the record carries one. Loki, Elasticsearch or Cloud Logging then
parse the lines without a regex. Standard library only: the agent, the
operator and the simulator all import it (this package imports no component).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
from types import TracebackType
from typing import Final, TextIO

from gpuhealth_api import timestamps

TEXT: Final = "text"
JSON: Final = "json"
FORMATS: Final = (TEXT, JSON)
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines in a message or traceback are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, str] = {
            "time": timestamps.rfc3339(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False)


def formatter(log_format: str) -> logging.Formatter:
    return JsonFormatter() if log_format == JSON else logging.Formatter(TEXT_FORMAT)


def configure(level: str | int, log_format: str = TEXT, stream: TextIO | None = None) -> None:
    """Set up the root logger (as `logging.basicConfig` would) with `log_format`'s lines on stderr.

    Replaces handlers set up before (`force`): a library that logged first must not keep
    writing plain text beside the JSON lines.
    """
    if log_format not in FORMATS:
        raise ValueError(f"log format {log_format!r} is not one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(formatter(log_format))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    if log_format == JSON:
        # A crash is a log line too: its traceback in `exception`, not plain text among the JSON.
        sys.excepthook = _log_uncaught
        threading.excepthook = lambda hook: _log_uncaught(
            hook.exc_type, hook.exc_value or hook.exc_type(), hook.exc_traceback, hook.thread
        )


def _log_uncaught(
    kind: type[BaseException],
    error: BaseException,
    trace: TracebackType | None,
    thread: threading.Thread | None = None,
) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, error, trace)
        return
    where = f" in thread {thread.name}" if thread is not None else ""
    logging.getLogger("uncaught").critical("uncaught exception%s", where, exc_info=(kind, error, trace))


def add_argument(parser: argparse.ArgumentParser, default: str = TEXT) -> None:
    """`--log-format {text,json}` on an argparse parser."""
    parser.add_argument(
        "--log-format",
        default=default,
        choices=FORMATS,
        help="text: lines for people (default); json: one JSON object per line "
        "(time, level, logger, message, exception)",
    )
