"""The simulated node's side of active checks: the scenario's `checks:` key, how each check pod ends.

`checks: {TEMPLATE: pass | fail | {figure: value}}` (or a list: one outcome per attempt, the last
repeats); a template the scenario does not name passes with no figures.
"""

import pytest
import yaml

from gpuhealth_agent import scenario

BASE = {"gpus": 8}


def plan(checks: object = None) -> scenario.Scenario:
    data: dict[str, object] = dict(BASE)
    if checks is not None:
        data["checks"] = checks
    return scenario.parse(yaml.safe_dump(data), "test.yaml")


def test_without_checks_every_check_passes_with_no_figures() -> None:
    checks = plan().checks
    assert checks.outcome("DcgmDiagQuick", 0) == scenario.CheckOutcome(passed=True)
    assert checks.outcome("NcclAllReduce", 5).figures == {}


def test_pass_fail_figures_and_lists_per_attempt() -> None:
    checks = plan(
        {
            "DcgmDiagQuick": "fail",
            "DcgmDiag": ["fail", "pass"],
            "NcclAllReduce": {"busBandwidthGBps": 310.5, "durationSeconds": 20},
        }
    ).checks
    assert checks.outcome("DcgmDiagQuick", 0) == scenario.CheckOutcome(passed=False)
    assert [checks.outcome("DcgmDiag", i).passed for i in range(3)] == [False, True, True]
    nccl = checks.outcome("NcclAllReduce", 0)
    assert nccl.passed and nccl.figures == {"busBandwidthGBps": 310.5, "durationSeconds": 20.0}
    assert checks.outcome("DcgmDiagQuick", 9).passed is False  # the last outcome repeats


def test_the_agent_ignores_checks() -> None:
    """A scenario with checks reads the same GPUs: the key is the fleet simulator's alone."""
    with_checks = plan({"DcgmDiag": "fail"})
    assert (with_checks.gpus, with_checks.timeline, with_checks.defaults) == (8, (), plan().defaults)


@pytest.mark.parametrize(
    ("checks", "said"),
    [
        ("pass", "test.yaml: checks: expected a mapping like {DcgmDiagQuick: pass"),
        ({"DcgmDiag": "works"}, "test.yaml: checks.DcgmDiag: expected pass, fail"),
        ({"DcgmDiag": ["pass", "maybe"]}, "test.yaml: checks.DcgmDiag[1]: expected pass, fail"),
        ({"DcgmDiag": []}, "test.yaml: checks.DcgmDiag: expected pass, fail"),
        ({"Dcgm Diag": "pass"}, "test.yaml: checks.Dcgm Diag: expected a template key"),
        ({"DcgmDiag": {"bw": "fast"}}, "test.yaml: checks.DcgmDiag.bw: expected a finite number"),
        ({"DcgmDiag": {"bw": True}}, "test.yaml: checks.DcgmDiag.bw: expected a finite number"),
        ({"DcgmDiag": {"bw": float("inf")}}, "test.yaml: checks.DcgmDiag.bw: expected a finite number"),
        ({"DcgmDiag": {"x" * 64: 1}}, "test.yaml: checks.DcgmDiag: expected figure names of 1 to 63"),
        ({"DcgmDiag": {}}, "test.yaml: checks.DcgmDiag: expected pass, fail"),
        (
            {"DcgmDiag": {f"f{i}": i for i in range(17)}},
            "test.yaml: checks.DcgmDiag: expected at most 16 figures",
        ),
    ],
)
def test_a_bad_checks_key_is_named(checks: object, said: str) -> None:
    with pytest.raises(scenario.ScenarioError) as error:
        plan(checks)
    assert str(error.value).startswith(said), str(error.value)
