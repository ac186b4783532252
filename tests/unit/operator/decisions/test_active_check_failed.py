"""Condition ActiveCheckFailed from GPUNode `status.checks[]`: judged like any condition, from the cluster."""

from __future__ import annotations

import datetime

from gpuhealth_api import conditions, vocabulary
from gpuhealth_operator.decisions import model, signals

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
Condition = vocabulary.Condition


def facts(*runs: tuple[str, str]) -> dict[str, object]:
    return {
        "agent": {"heartbeatSeconds": 30, "lastHeartbeat": "2026-01-01T00:00:00Z"},
        "gpus": [{"index": 0, "uuid": "GPU-0"}],
        "checks": [
            {"name": "quick", "time": stamp, "result": result, "template": "DcgmDiagQuick"}
            for stamp, result in runs
        ],
    }


def signal(status: dict[str, object]) -> model.Signal:
    found = signals.raw_signals(status, model.NodeView(name="n"), frozenset(), NOW)  # type: ignore[arg-type]
    return found[Condition.ACTIVE_CHECK_FAILED]


def test_a_failed_run_holds_the_condition_until_a_later_pass() -> None:
    failed = signal(facts(("2025-12-31T23:00:00Z", "Failed")))
    assert failed.present is True
    assert "quick" in failed.message
    assert (
        signal(facts(("2025-12-31T23:00:00Z", "Failed"), ("2025-12-31T23:30:00Z", "Passed"))).present is False
    )


def test_preempted_and_no_history_are_no_fault() -> None:
    assert signal(facts(("2025-12-31T23:00:00Z", "Preempted"))).present is False
    assert signal({"gpus": []}).present is False


def test_a_rule_may_name_it_and_it_makes_the_node_unhealthy() -> None:
    assert Condition.ACTIVE_CHECK_FAILED in conditions.RULE_CONDITIONS
    assert Condition.ACTIVE_CHECK_FAILED in conditions.FATAL
