"""`gpu-health-agent check --probe`: read-only, per field supported / not supported / error, and cost.

Run over the simulated NVML library through real pynvml (the path a real node takes), in this process
and as the real command in a process of its own for the old-driver build.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import simnvml_build
from gpuhealth_agent import check, cli, nvml, probe, scenario, simnvml


class Clock:
    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds

    def sleep(self, seconds: float) -> None:
        self.seconds += seconds


class Spy:
    """A Library that records the name of every function asked for."""

    def __init__(self, lib: nvml.Library) -> None:
        self.lib = lib
        self.asked: list[str] = []

    def __getattr__(self, name: str) -> Any:
        self.asked.append(name)
        return getattr(self.lib, name)


@pytest.fixture
def library() -> ctypes.CDLL:
    return simnvml_build.preload()


def probed(library: ctypes.CDLL, text: str, seconds: float = 10.0) -> tuple[probe.Report, Spy]:
    clock = Clock()
    driver = simnvml.Driver(scenario.parse(text), clock=clock, start=0.0, lib=library)
    spy = Spy(nvml.real())
    try:
        report = probe.run(spy, seconds=seconds, interval=5.0, clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    finally:
        driver.close()
    return report, spy


def by_field(report: probe.Report) -> dict[str, probe.Answer]:
    return {a.field: a for a in report.answers}


def test_each_field_supported_not_supported_or_error(library: ctypes.CDLL) -> None:
    report, _ = probed(
        library,
        "gpus: 4\nmodel: NVIDIA H100 PCIe\ndefaults: {notSupported: [ecc]}\ntimeline:\n"
        "- {after: 0s, gpu: 2, fail: {function: nvmlDeviceGetPowerUsage, error: Unknown}}\n"
        "- {after: 0s, gpu: 1, notSupported: [pcieReplayCounter]}\n",
    )
    fields = by_field(report)
    assert report.gpus == 4 and report.models == ["NVIDIA H100 PCIe"]
    assert report.driver_version == "570.124.06"
    assert fields["temperatureCelsius"].result == "supported"
    assert fields["ecc.uncorrectedVolatile"].result == "not supported"
    assert fields["ecc.uncorrectedVolatile"].detail == "NotSupported on 4 GPU(s)"
    assert (fields["powerWatts"].result, fields["powerWatts"].detail) == ("error", "Unknown on 1 GPU(s)")
    assert fields["pcie.replayCounter"].result == "supported"
    assert fields["pcie.replayCounter"].detail == "not on every GPU: NotSupported on 1 GPU(s)"
    assert fields["nvlink"].result == "not supported"  # a PCIe card
    assert fields["fabric"].result == "not supported"
    assert fields["events (XID, double-bit ECC)"].result == "supported"


def test_calls_per_gpu_per_second_and_cpu(library: ctypes.CDLL) -> None:
    report, _ = probed(library, "gpus: 8\n", seconds=10.0)
    assert report.samples == 3  # at 0, 5 and 10 s: the agent's default interval
    assert report.seconds == 10.0
    assert report.first_sample_calls > 0
    assert report.calls_per_gpu_per_second is not None
    total_after_first = sum(report.calls.values()) - report.first_sample_calls
    assert report.calls_per_gpu_per_second == pytest.approx(total_after_first / 8 / 10.0)
    assert report.calls["nvmlDeviceGetPowerUsage"] == 8 * 3
    assert report.cpu_seconds >= 0 and report.millicpu >= 0
    document = json.loads(probe.render(report, "json"))
    assert document["sampling"]["samples"] == 3
    assert document["sampling"]["callsByFunction"]["nvmlDeviceGetPowerUsage"] == 24
    assert {f["field"] for f in document["fields"]} >= {"ecc.uncorrectedVolatile", "nvlink", "fabric"}
    text = probe.render(report)
    assert "read-only probe" in text and "per GPU per second" in text and "mCPU" in text


def test_the_probe_only_ever_asks_for_read_only_functions(library: ctypes.CDLL) -> None:
    """Never a reset, a clock, power, ECC or MIG mode change: every function it asked for only reads."""
    _, spy = probed(library, "gpus: 2\ndefaults: {fabricState: Completed}\n")
    assert spy.asked
    assert [name for name in spy.asked if not probe.read_only(name)] == []


@pytest.mark.parametrize(
    "function",
    [
        "nvmlDeviceResetGpuLockedClocks",
        "nvmlDeviceSetGpuLockedClocks",
        "nvmlDeviceSetPowerManagementLimit",
        "nvmlDeviceSetEccMode",
        "nvmlDeviceClearEccErrorCounts",
        "nvmlDeviceSetMigMode",
        "nvmlDeviceSetPersistenceMode",
    ],
)
def test_a_function_that_changes_the_gpu_is_refused_before_the_driver(function: str) -> None:
    spy = Spy(nvml.real())
    with pytest.raises(probe.NotReadOnly):
        getattr(probe.ReadOnly(spy), function)  # type: ignore[arg-type]
    assert spy.asked == []  # refused before it was even looked up


def test_check_probe_on_an_old_driver_names_the_fallbacks(tmp_path: Path) -> None:
    (tmp_path / "plan.yaml").write_text("gpus: 2\nmodel: NVIDIA A100-SXM4-80GB\n")
    command = [
        sys.executable,
        "-m",
        "gpuhealth_agent.simnvml",
        "--scenario",
        str(tmp_path / "plan.yaml"),
        "--",
    ]
    done = subprocess.run(
        [*command, "check", "--probe", "--probe-seconds", "1", "--probe-interval", "1", "-o", "json"],
        env=simnvml_build.environment("old-driver"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == check.HEALTHY_EXIT, done.stderr
    fields = {f["field"]: f for f in json.loads(done.stdout)["fields"]}
    assert fields["temperatureCelsius"]["result"] == "supported"
    assert "nvmlDeviceGetTemperature:" in fields["temperatureCelsius"]["detail"]
    assert fields["fabric"] == {
        "field": "fabric",
        "function": "nvmlDeviceGetGpuFabricInfo",
        "result": "not supported",
        "detail": "FunctionNotFound on 2 GPU(s)",
    }
    assert fields["recoveryAction"]["result"] == "not supported"
    assert fields["nvlink"]["result"] == "supported"  # link by link: the state field is unknown here


def test_check_probe_on_the_python_backend(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "plan.yaml").write_text("gpus: 1\n")
    code = cli.main(
        [
            "check",
            "--backend",
            "sim",
            "--sim-scenario",
            str(tmp_path / "plan.yaml"),
            "--probe",
            "--probe-seconds",
            "0",
        ]
    )
    assert code == check.HEALTHY_EXIT
    out = capsys.readouterr().out
    assert out.startswith("1 GPU(s), NVIDIA H100 80GB HBM3, driver") and "one sample only" in out
