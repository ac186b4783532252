"""Poll a condition until it holds or a deadline passes: the only way tests wait (and `holds` observes).

Tests never sleep for a fixed time to "let things settle"; they poll with a
deadline and fail with a message saying what never happened and what was last
seen. Errors that only mean "not yet" (the API server is restarting, an object
is not there yet) are retried and reported if the deadline passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final, TypeVar

import urllib3.exceptions
from kubernetes.client import exceptions as kube_exceptions

T = TypeVar("T")

TRANSIENT: Final[tuple[type[BaseException], ...]] = (
    kube_exceptions.ApiException,
    urllib3.exceptions.HTTPError,
    ConnectionError,
    TimeoutError,
    OSError,
)
"""Exceptions a predicate may raise that mean "not yet" rather than "broken"."""


def wait_until(
    predicate: Callable[[], T | None],
    *,
    timeout_seconds: float,
    interval_seconds: float = 0.1,
    message: str,
    transient: tuple[type[BaseException], ...] = TRANSIENT,
) -> T:
    """Call `predicate` until it returns a truthy value, and return that value.

    Raises TimeoutError naming `message`, the last value and the last transient
    error if `timeout_seconds` pass first. Non-transient exceptions propagate at once.
    """
    deadline = time.monotonic() + timeout_seconds
    last_value: object = None
    last_error: BaseException | None = None
    attempts = 0
    while True:
        attempts += 1
        try:
            value = predicate()
        except transient as error:
            last_error = error
        else:
            if value:
                return value
            last_value = value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        time.sleep(min(interval_seconds, remaining))
    detail = f"last value: {last_value!r}"
    if last_error is not None:
        detail += f"; last error: {_describe(last_error)}"
    raise TimeoutError(f"{message} (not true after {timeout_seconds:g}s, {attempts} attempts; {detail})")


def holds(
    predicate: Callable[[], object],
    *,
    seconds: float,
    interval_seconds: float = 0.1,
    message: str,
) -> None:
    """Check that `predicate` stays truthy for `seconds`: an observation, not a synchronisation.

    For what must never happen (a budget exceeded, a human's cordon lifted):
    AssertionError naming `message` and the value at the first look it failed.
    """
    started = time.monotonic()
    deadline = started + seconds
    while True:
        value = predicate()
        if not value:
            raise AssertionError(f"{message} (broken after {time.monotonic() - started:.1f}s: {value!r})")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        time.sleep(min(interval_seconds, remaining))


def _describe(error: BaseException) -> str:
    if isinstance(error, kube_exceptions.ApiException):
        return f"ApiException {error.status} {error.reason}: {str(error.body)[:500]}"
    return f"{type(error).__name__}: {error}"
