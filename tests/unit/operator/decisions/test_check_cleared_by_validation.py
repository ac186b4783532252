"""A failed active check is cleared by a later passed repair validation (issue 51 follow-up): the
validation (DCGM diag -r 2) is at least as thorough as the quick check, and a check never runs on the
cordoned node the failure drained, so only the validation can bring it back."""

from __future__ import annotations

from typing import Any

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import signals


def run(time: str, result: str) -> dict[str, Any]:
    return {"name": "quick", "template": "QuickTest", "policy": "p", "time": time, "result": result}


def repair(time: str, result: str) -> dict[str, Any]:
    return {"time": time, "cycle": 1, "step": "reset", "action": "Validation", "result": result}


def failed(facts: dict[str, Any]) -> bool | None:
    return signals.active_check_signal(facts).present  # type: ignore[arg-type]


def test_a_validation_passed_after_the_failure_clears_it() -> None:
    facts = {
        "checks": [run("2026-01-01T10:00:00Z", "Failed")],
        "repairs": [
            repair("2026-01-01T10:05:00Z", "Started"),
            repair("2026-01-01T10:06:00Z", vocabulary.RepairResult.VALIDATION_PASSED.value),
        ],
    }
    assert failed(facts) is False
    assert "validation" in signals.active_check_signal(facts).message  # type: ignore[arg-type]


def test_a_validation_passed_before_the_failure_does_not_clear_it() -> None:
    facts = {
        "checks": [run("2026-01-01T10:00:00Z", "Failed")],
        "repairs": [repair("2026-01-01T09:00:00Z", "ValidationPassed")],
    }
    assert failed(facts) is True


def test_a_failed_validation_does_not_clear_it() -> None:
    facts = {
        "checks": [run("2026-01-01T10:00:00Z", "Failed")],
        "repairs": [repair("2026-01-01T10:06:00Z", "ValidationFailed")],
    }
    assert failed(facts) is True


def test_a_failed_run_after_the_validation_sets_it_again() -> None:
    facts = {
        "checks": [run("2026-01-01T10:00:00Z", "Failed"), run("2026-01-01T11:00:00Z", "Failed")],
        "repairs": [repair("2026-01-01T10:06:00Z", "ValidationPassed")],
    }
    signal = signals.active_check_signal(facts)  # type: ignore[arg-type]
    assert signal.present is True
    assert "2026-01-01T11:00:00" in signal.message


def test_malformed_repair_entries_change_nothing() -> None:
    facts = {
        "checks": [run("2026-01-01T10:00:00Z", "Failed")],
        "repairs": [{"result": "ValidationPassed"}, "junk", {"time": "never", "result": "ValidationPassed"}],
    }
    assert failed(facts) is True
