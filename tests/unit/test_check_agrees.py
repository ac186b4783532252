"""`gpu-health-agent check` and the operator give one answer to the same facts.

Each case is a simulated scenario. It runs through `gpu-health-agent check`
(the command line, `-o json`: the exit code and the status the agent would
report), and that status, heartbeat stamped as the reporter would, runs
through the operator's verdict under the default policy plus Event rules for
the conditions it does not name. Both must find the same conditions, and
`check` exits 1 exactly when the node is Unhealthy: condition by condition,
and XID by XID over the whole catalogue.
"""

import datetime
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth_agent import check, cli, scenario, xids
from gpuhealth_api import keys, vocabulary, xid_catalogue
from gpuhealth_operator.decisions import model, policies, severity, times, verdicts

Condition = vocabulary.Condition
ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = xids.Catalogue.packaged()
FACT_CONDITIONS = frozenset(Condition) - {Condition.AGENT_STALE, Condition.STRAGGLER}


def default_policy_judging_every_condition() -> model.Policy:
    """The shipped default policy, plus Event rules for the conditions it leaves alone."""
    spec = yaml.safe_load((ROOT / "examples" / "default-policy.yaml").read_text())["spec"]
    xid_rules = [r for r in spec["rules"] if r["condition"] == Condition.XID_CRITICAL]
    assert xid_rules and all("xids" not in r for r in xid_rules), "the shipped policy follows the catalogue"
    named = {r["condition"] for r in spec["rules"]}
    extra = [
        {"name": c.lower(), "condition": str(c), "action": "Event"} for c in sorted(FACT_CONDITIONS - named)
    ]
    return policies.parse_policy("default", 1, {**spec, "rules": [*spec["rules"], *extra]})


POLICY = default_policy_judging_every_condition()


def run_check(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> tuple[int, Any]:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    code = cli.main(["check", "--backend", "sim", "--sim-scenario", str(path), "-o", "json"])
    return code, json.loads(capsys.readouterr().out)


def operator_verdict(facts: Any, plan: scenario.Scenario) -> model.NodeVerdict:
    """The verdict once every rule's forSeconds has passed, as the operator reaches it."""
    now = datetime.datetime.now(datetime.UTC)
    later = now + datetime.timedelta(seconds=max(r.for_seconds for r in POLICY.rules) + 1)
    facts["agent"]["lastHeartbeatTime"] = times.render(later)  # the reporter stamps each write
    node = model.NodeView(
        name="gpu-node-0",
        labels={keys.GPU_PRESENT_LABEL: "true", keys.GPU_COUNT_LABEL: str(plan.expected_gpus)},
        gpu_capacity=plan.expected_gpus,
    )
    first = verdicts.judge(POLICY, node, facts, {}, None, now)
    return verdicts.judge(POLICY, node, facts, first.conditions, None, later)


def assert_agree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: set[Condition]
) -> None:
    code, facts = run_check(tmp_path, capsys, text)
    found_by_check = check.conditions(facts, CATALOGUE)
    verdict = operator_verdict(facts, scenario.parse(text))
    found_by_operator = set(verdict.issues) & FACT_CONDITIONS
    assert found_by_check == found_by_operator == expected, verdict
    assert (code == check.FATAL_EXIT) is (verdict.health is vocabulary.Health.UNHEALTHY)
    assert (code == check.FATAL_EXIT) is bool(expected & severity.FATAL)


BUSY = "defaults: {utilizationPercent: 95}\n"
IDLE = "defaults: {utilizationPercent: 0}\n"


def at_once(facts: str, defaults: str = BUSY, gpus: int = 2) -> str:
    return f"gpus: {gpus}\n{defaults}timeline:\n- {{after: 1s, gpu: 1, set: {facts}}}\n"


CASES: dict[str, tuple[str, set[Condition]]] = {
    "healthy": (f"gpus: 2\n{BUSY}", set()),
    "ecc": (at_once("{eccUncorrectedVolatile: 1}"), {Condition.ECC_UNCORRECTABLE}),
    "ecc-aggregate-only": (at_once("{eccUncorrectedAggregate: 3}"), set()),
    "remap-failure": (at_once("{remappedRowsFailure: true}"), {Condition.ROW_REMAP_FAILURE}),
    "remap-pending-correctable": (at_once("{remappedRowsPending: true}"), {Condition.MEMORY_DEGRADING}),
    "remap-pending-uncorrectable": (
        at_once("{remappedRowsPending: true, remappedRowsUncorrectable: 1}"),
        {Condition.ROW_REMAP_FAILURE},
    ),
    "retired-page-pending-double-bit": (
        at_once("{retiredPagesPending: true, retiredPagesDoubleBit: 1}"),
        {Condition.ROW_REMAP_FAILURE},
    ),
    "retired-page-pending": (at_once("{retiredPagesPending: true}"), {Condition.MEMORY_DEGRADING}),
    # One report cannot show a trend: errors or a link down that was up need the operator's memory.
    "corrected-ecc-once": (at_once("{eccCorrectedVolatile: 5000}"), set()),
    "nvlink-errors-once": (at_once("{nvlinkCrcErrors: 5000, nvlinkLinksDown: 2}"), set()),
    "pcie-board-no-nvlink": (at_once("{nvlinks: 0}"), set()),
    "fabric-failed": (
        at_once("{fabricState: Completed, fabricStatus: Unknown}"),
        {Condition.FABRIC_UNHEALTHY},
    ),
    "fabric-pending": (at_once("{fabricState: InProgress}"), {Condition.FABRIC_UNHEALTHY}),
    "fabric-done": (at_once("{fabricState: Completed, fabricStatus: Success}"), set()),
    "fabric-not-supported": (at_once("{fabricState: NotSupported}"), set()),
    "aer-fatal": (at_once("{pcieAerFatal: 1}"), {Condition.PCIE_ERRORS}),
    "aer-non-fatal-once": (at_once("{pcieAerNonFatal: 7, pcieAerCorrectable: 90}"), set()),
    "recovery": (at_once("{recoveryAction: NodeReboot}"), {Condition.RECOVERY_REQUIRED}),
    "missing-gpu": ("gpus: 7\nexpectedGpus: 8\n", {Condition.GPU_LOST}),
    "thermal-reason": (at_once("{clockEventReasons: [SwThermalSlowdown]}"), {Condition.THERMAL_THROTTLED}),
    "hot": (
        at_once("{temperatureCelsius: 95, slowdownTemperatureCelsius: 90}"),
        {Condition.THERMAL_THROTTLED},
    ),
    "power-brake": (at_once("{clockEventReasons: [HwPowerBrakeSlowdown]}"), {Condition.POWER_THROTTLED}),
    "hw-slowdown": (at_once("{clockEventReasons: [HwSlowdown]}"), {Condition.POWER_THROTTLED}),
    "sw-power-cap": (at_once("{clockEventReasons: [SwPowerCap]}"), set()),
    "pcie-busy": (at_once("{pcieGeneration: 3, pcieWidth: 8}"), {Condition.PCIE_DEGRADED}),
    "pcie-idle": (at_once("{pcieGeneration: 1, pcieWidth: 4}", IDLE), set()),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_check_and_operator_agree_on_every_condition(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text, expected = CASES[case]
    assert_agree(tmp_path, capsys, text, expected)


def xid_expectation(code: int) -> set[Condition]:
    expected = {Condition.XID_CRITICAL} if CATALOGUE.lookup(code).critical else set()
    if code == 79:  # the simulated GPU falls off the bus with it, as a real one does
        expected.add(Condition.GPU_LOST)
    if code == 92:  # high single-bit ECC rate: the driver's own pre-failure warning
        expected.add(Condition.MEMORY_DEGRADING)
    return expected


@pytest.mark.parametrize("code", [info.code for info in CATALOGUE.entries()] + [999])
def test_check_and_operator_agree_xid_by_xid(
    code: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = f"gpus: 2\n{BUSY}timeline:\n- {{after: 1s, gpu: 1, xid: {code}}}\n"
    assert_agree(tmp_path, capsys, text, xid_expectation(code))


def test_the_operator_default_is_the_catalogue() -> None:
    assert policies.DEFAULT_CRITICAL_XIDS == xid_catalogue.default_critical() == CATALOGUE.critical
