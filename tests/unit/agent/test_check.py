"""`gpu-health-agent check` and the command line: output a human reads, exit codes a script reads."""

import json
import re
from pathlib import Path

import pynvml
import pytest

from gpuhealth_agent import check, cli, xids
from gpuhealth_api import status, vocabulary

Condition = vocabulary.Condition

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "scenarios"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_healthy_node_prints_ok_rows_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "check", "--backend", "sim", "--sim-scenario", str(EXAMPLES / "healthy.yaml"))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("8 GPU(s) answering of 8 expected, model NVIDIA H100 80GB HBM3")
    assert lines[1].split() == [
        *("GPU", "UUID", "TEMP", "POWER", "SM", "CLOCK", "NVLINK", "FABRIC", "AER", "F/NF/C", "STATUS")
    ]
    assert len(lines) == 10
    assert all(line.endswith("ok") for line in lines[2:])


@pytest.mark.parametrize(
    ("example", "gpu", "words"),
    [
        ("ecc-uncorrectable.yaml", 3, "FATAL EccUncorrectable: 1 uncorrectable volatile ECC error"),
        ("xid79-gpu-lost.yaml", 0, "FATAL GPULost: fell off the bus"),
        ("remap-failure.yaml", 5, "FATAL RowRemapFailure: row remapping failed"),
        ("recovery-action.yaml", 2, None),  # reset at the end of the timeline: healthy again
        ("missing-gpu.yaml", 7, "FATAL GPULost: fell off the bus"),
    ],
)
def test_fatal_faults_exit_one_with_plain_words(
    capsys: pytest.CaptureFixture[str], example: str, gpu: int, words: str | None
) -> None:
    code, out, _ = run(capsys, "check", "--backend", "sim", "--sim-scenario", str(EXAMPLES / example))
    row = out.splitlines()[2 + gpu]
    if words is None:
        assert code == 0 and row.endswith("ok")
    else:
        assert code == 1
        assert words in row


def test_at_picks_the_scenario_time(capsys: pytest.CaptureFixture[str]) -> None:
    scenario = str(EXAMPLES / "recovery-action.yaml")
    code, out, _ = run(capsys, "check", "--backend", "sim", "--sim-scenario", scenario, "--at", "30")
    assert code == 1
    row = out.splitlines()[4]
    assert "FATAL RecoveryRequired: driver asks for recovery action GpuReset" in row
    assert "XID 154" in row
    code, out, _ = run(capsys, "check", "--backend", "sim", "--sim-scenario", scenario, "--at", "10")
    assert code == 0


def test_slow_counters_are_read_at_the_checked_moment(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    plan = tmp_path / "pending.yaml"
    plan.write_text(
        "gpus: 2\ntimeline:\n"
        "- {after: 3s, gpu: 1, set: {remappedRowsPending: true, remappedRowsUncorrectable: 1}}\n"
    )
    code, out, _ = run(capsys, "check", "--backend", "sim", "--sim-scenario", str(plan))
    assert code == 1
    assert "FATAL RowRemapFailure: row remap pending a GPU reset" in out.splitlines()[3]


def test_xids_on_other_gpus_are_seen_when_one_is_lost_from_the_start(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    plan = tmp_path / "lost.yaml"
    plan.write_text(
        "gpus: 4\ntimeline:\n- {after: 0s, gpu: 0, xid: 79}\n- {after: 0s, gpu: 2, xid: 48}\n"
        "- {after: 2s, gpu: 3, xid: 94}\n"
    )
    code, out, _ = run(capsys, "check", "--backend", "sim", "--sim-scenario", str(plan))
    assert code == 1
    rows = out.splitlines()[2:]
    assert "FATAL GPULost: fell off the bus" in rows[0]
    assert "FATAL XidCritical: XID 48" in rows[2]  # at 0s: the agent's first event set gets it
    assert "INFO XID 94" in rows[3] and "(not critical)" in rows[3]


def test_warnings_do_not_fail_the_check(capsys: pytest.CaptureFixture[str]) -> None:
    for example, gpu, words in [
        ("thermal-throttle.yaml", 1, "WARNING ThermalThrottled: HwThermalSlowdown"),
        ("pcie-degraded.yaml", 6, "WARNING PcieDegraded: PCIe gen 3 of 5, x8 of x16 at 96% utilization"),
    ]:
        code, out, _ = run(
            capsys, "check", "--backend", "sim", "--sim-scenario", str(EXAMPLES / example), "--at", "60"
        )
        assert code == 0, out
        assert words in out.splitlines()[2 + gpu]


def test_json_output_is_the_status_the_agent_would_report(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "check",
        "--backend",
        "sim",
        "--sim-scenario",
        str(EXAMPLES / "ecc-uncorrectable.yaml"),
        "-o",
        "json",
    )
    assert code == 1
    node = json.loads(out)
    assert set(node) == {"agent", "summary", "gpus", "verdict"}  # the status, and check's verdict
    assert node["agent"]["backend"] == "sim"
    assert node["gpus"][3]["ecc"]["uncorrectedVolatile"] == 1
    assert node["gpus"][3]["xids"][0]["code"] == 48


def test_a_bad_scenario_stops_the_agent_with_exit_two(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus: 2\ntimeline:\n- {after: 1s, gpu: 9, xid: 79}\n")
    for argv in (["run", "--node-name", "n1"], ["check"]):
        code, out, err = run(capsys, *argv, "--backend", "sim", "--sim-scenario", str(bad))
        assert code == 2
        assert out == ""
        assert str(bad) in err and "timeline[0] (line 3).gpu" in err


def test_run_needs_a_node_name(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    code, _, err = run(capsys, "--backend", "sim", "--sim-scenario", str(EXAMPLES / "healthy.yaml"))
    assert code == 2
    assert "--node-name" in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    assert re.fullmatch(r"gpu-health-agent \d+\.\d+\.\d+(\.dev\d+|rc\d+)?\n", capsys.readouterr().out)


def test_problems_are_sorted_worst_first() -> None:
    gpu = status.GPUStatus(
        index=0,
        temperatureCelsius=90,
        slowdownTemperatureCelsius=87,
        clockEventReasons=["HwThermalSlowdown"],
        remappedRows={"failure": True},
        retiredPages={"pending": True, "doubleBit": 0},
        xids=[{"code": 13, "count": 1, "lastSeen": "2026-11-22T01:00:00Z"}],
    )
    found = check.problems(gpu, xids.Catalogue.packaged())
    assert [(p.severity, p.condition) for p in found] == [
        (check.Severity.FATAL, Condition.ROW_REMAP_FAILURE),
        (check.Severity.WARNING, Condition.THERMAL_THROTTLED),
        (check.Severity.WARNING, Condition.MEMORY_DEGRADING),  # retirement pending, single-bit errors
        (check.Severity.INFO, None),  # XID 13: the application's fault
    ]


def test_run_without_a_usable_kubeconfig_exits_two(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(
        capsys,
        "run",
        "--node-name",
        "n1",
        "--backend",
        "sim",
        "--sim-scenario",
        str(EXAMPLES / "healthy.yaml"),
        "--kubeconfig",
        str(tmp_path / "missing"),
    )
    assert code == 2
    assert "no usable Kubernetes configuration" in err


def test_check_without_nvml_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_library(*_: object) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    code, out, err = run(capsys, "check")
    assert code == 3  # cannot read: not a GPU fault (was 1)
    assert out == ""
    assert "cannot use NVML: NVML Shared Library Not Found" in err


def test_a_heartbeat_beyond_the_schemas_maximum_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    scenario = str(EXAMPLES / "healthy.yaml")
    code, _, err = run(
        capsys, "--node-name", "n", "--backend", "sim", "--sim-scenario", scenario, "--heartbeat", "601"
    )
    assert code != 0
    assert "--heartbeat must be at most 600s" in err
