"""`--log-format json`: one JSON object per line, whatever the message or the exception holds."""

from __future__ import annotations

import io
import json
import logging
import sys
import threading
from collections.abc import Iterator

import pytest

from gpuhealth_api import logformat


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    hooks = (sys.excepthook, threading.excepthook)
    out = io.StringIO()
    logformat.configure("INFO", logformat.JSON, out)
    try:
        yield out
    finally:
        root.handlers[:] = saved[1]
        root.setLevel(saved[0])
        sys.excepthook, threading.excepthook = hooks


def test_a_record_is_one_json_line_with_time_level_logger_message(stream: io.StringIO) -> None:
    logging.getLogger("gpuhealth_agent.runner").warning("GPU %d lost\nsecond line", 3)
    (line,) = stream.getvalue().splitlines()
    record = json.loads(line)
    assert record["level"] == "WARNING"
    assert record["logger"] == "gpuhealth_agent.runner"
    assert record["message"] == "GPU 3 lost\nsecond line"
    assert record["time"].endswith("Z") and "T" in record["time"]
    assert "exception" not in record


def test_an_exception_is_its_text_in_the_same_line(stream: io.StringIO) -> None:
    try:
        raise ValueError("bad value")
    except ValueError:
        logging.getLogger("gpuhealth_operator").exception("reconcile failed")
    (line,) = stream.getvalue().splitlines()
    record = json.loads(line)
    assert record["message"] == "reconcile failed"
    assert "Traceback" in record["exception"] and "ValueError: bad value" in record["exception"]


def test_text_stays_the_default_and_unknown_formats_are_refused() -> None:
    assert logformat.TEXT == "text"
    assert not isinstance(logformat.formatter(logformat.TEXT), logformat.JsonFormatter)
    with pytest.raises(ValueError, match="yaml"):
        logformat.configure("INFO", "yaml")


def test_an_uncaught_exception_is_a_json_line_too(stream: io.StringIO) -> None:
    assert sys.excepthook is not sys.__excepthook__  # the fixture's JSON setup installed ours
    try:
        raise RuntimeError("boom")
    except RuntimeError as error:
        sys.excepthook(RuntimeError, error, error.__traceback__)
    record = json.loads(stream.getvalue().splitlines()[-1])
    assert record["level"] == "CRITICAL" and "RuntimeError: boom" in record["exception"]
