"""Polling with a deadline: returns the first truthy value, explains a timeout."""

import itertools

import pytest
from kubernetes.client import exceptions as kube_exceptions

from gpuhealth_sim import waiting


def test_returns_the_first_truthy_value() -> None:
    values = iter([None, 0, "", "ready"])

    assert (
        waiting.wait_until(lambda: next(values), timeout_seconds=5, interval_seconds=0, message="x")
        == "ready"
    )


def test_timeout_names_the_message_and_the_last_value() -> None:
    phases = itertools.chain(["Pending"], itertools.repeat(""))

    with pytest.raises(TimeoutError, match=r"pod running \(not true after 0.05s, .*last value: ''\)"):
        waiting.wait_until(
            lambda: next(phases) == "Running" or "", timeout_seconds=0.05, message="pod running"
        )


def test_transient_errors_are_retried_and_reported() -> None:
    def not_found() -> bool:
        raise kube_exceptions.ApiException(status=404, reason="Not Found")

    with pytest.raises(TimeoutError, match="last error: ApiException 404 Not Found"):
        waiting.wait_until(not_found, timeout_seconds=0.05, interval_seconds=0.01, message="node exists")


def test_transient_error_then_success() -> None:
    attempts = iter([ConnectionRefusedError("down"), None, True])

    def flaky() -> bool | None:
        outcome = next(attempts)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert waiting.wait_until(flaky, timeout_seconds=5, interval_seconds=0, message="x") is True


def test_other_errors_propagate_at_once() -> None:
    def broken() -> bool:
        raise ValueError("bug")

    with pytest.raises(ValueError, match="bug"):
        waiting.wait_until(broken, timeout_seconds=5, message="x")


def test_holds_returns_when_the_predicate_stays_true() -> None:
    looks = []
    waiting.holds(lambda: looks.append(1) or True, seconds=0.2, interval_seconds=0.05, message="stays")
    assert len(looks) >= 3


def test_holds_fails_at_the_first_false_look() -> None:
    values = iter([True, True, 0])
    with pytest.raises(AssertionError, match=r"budget kept .*: 0\)"):
        waiting.holds(lambda: next(values), seconds=5, interval_seconds=0.01, message="budget kept")
