"""How the simulated node ends a check pod (`checks:`), read back as the operator reads a real one."""

import pytest

from gpuhealth_agent import scenario
from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import checks as decisions
from gpuhealth_sim.fleet import checks, repairs

Result = vocabulary.CheckResult
POD = {
    "metadata": {"name": "check-a", "namespace": "gpu-health"},
    "spec": {"containers": [{"name": "check", "image": "dcgm"}]},
    "status": {"phase": "Running", "startTime": "2026-12-01T12:00:00Z"},
}


def said(**outcomes: object) -> scenario.Checks:
    return scenario.from_data({"gpus": 8, "checks": outcomes}, "test.yaml").checks


@pytest.mark.parametrize(
    ("outcomes", "template", "result", "figures"),
    [
        ({}, "DcgmDiagQuick", Result.PASSED, {}),
        ({"DcgmDiag": "fail"}, "DcgmDiag", Result.FAILED, {}),
        ({"Nccl": {"busBandwidthGBps": 310.5}}, "Nccl", Result.PASSED, {"busBandwidthGBps": 310.5}),
    ],
)
def test_the_operator_reads_the_simulated_end_as_the_scenario_says(
    outcomes: dict[str, object], template: str, result: Result, figures: dict[str, float]
) -> None:
    outcome = checks.decide(said(**outcomes), template, 0)
    ended = {**POD, **repairs.terminal_status(POD, outcome, 1_764_590_460.0)}
    assert decisions.result_of(None, ended) is result
    assert decisions.figures_of(ended)[0] == figures


def test_attempts_follow_the_scenarios_list() -> None:
    scripted = said(DcgmDiag=["fail", "pass"])
    assert [checks.decide(scripted, "DcgmDiag", i).succeeded for i in range(3)] == [False, True, True]
