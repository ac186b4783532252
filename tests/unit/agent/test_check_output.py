"""`gpu-health-agent check` for a script: the verdict in `-o json` and an exit code per kind of answer.

0 healthy (warnings included), 1 a fault, 2 a bad command line, 3 the GPUs could not be read
(NVML cannot start, no GPU visible, a dcgm-exporter given but unreadable). Was: the JSON had no
verdict, and "cannot read NVML" exited 1 like a GPU fault.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from gpuhealth_agent import check, cli

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "scenarios"
AGENT = [sys.executable, "-m", "gpuhealth_agent.cli"]


def agent(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AGENT, *argv], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)


def sim_check(example: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return agent("check", "--backend", "sim", "--sim-scenario", str(EXAMPLES / example), *argv)


def test_json_of_a_healthy_node_says_healthy_and_exits_zero() -> None:
    done = sim_check("healthy.yaml", "-o", "json")
    assert done.returncode == 0, done.stderr
    node = json.loads(done.stdout)
    assert node["verdict"]["health"] == "Healthy"
    assert node["verdict"]["exitCode"] == 0
    assert node["verdict"]["conditions"] == []
    assert [g["health"] for g in node["verdict"]["gpus"]] == ["Healthy"] * 8
    assert len(node["gpus"]) == 8  # the status the agent would report is still all there


def test_json_of_a_faulty_gpu_names_its_conditions_and_exits_one() -> None:
    done = sim_check("ecc-uncorrectable.yaml", "-o", "json")
    assert done.returncode == 1, done.stderr
    verdict = json.loads(done.stdout)["verdict"]
    assert verdict["health"] == "Unhealthy"
    assert verdict["exitCode"] == 1
    assert "EccUncorrectable" in verdict["conditions"]
    gpu3 = next(g for g in verdict["gpus"] if g["index"] == 3)
    assert gpu3["health"] == "Unhealthy"
    assert "EccUncorrectable" in gpu3["conditions"]
    assert any(p["severity"] == "fatal" and p["condition"] == "EccUncorrectable" for p in gpu3["problems"])
    assert all(g["health"] == "Healthy" for g in verdict["gpus"] if g["index"] != 3)


def test_a_warning_is_degraded_in_json_and_still_exits_zero() -> None:
    done = sim_check("thermal-throttle.yaml", "-o", "json", "--at", "60")
    assert done.returncode == 0, done.stderr
    verdict = json.loads(done.stdout)["verdict"]
    assert verdict["health"] == "Degraded"
    assert "ThermalThrottled" in verdict["conditions"]


def test_a_lost_gpu_is_a_node_level_fault_in_json() -> None:
    done = sim_check("missing-gpu.yaml", "-o", "json")
    assert done.returncode == 1
    verdict = json.loads(done.stdout)["verdict"]
    assert "GPULost" in verdict["conditions"]


def test_nvml_that_cannot_start_exits_three_not_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_library(*_: object) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    code = cli.main(["check"])
    captured = capsys.readouterr()
    assert code == check.CANNOT_READ_EXIT == 3
    assert captured.out == ""
    assert "cannot use NVML: NVML Shared Library Not Found" in captured.err


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_dcgm_exporter_that_cannot_be_read_exits_three_and_says_so() -> None:
    url = f"http://127.0.0.1:{_closed_port()}/metrics"
    done = sim_check("healthy.yaml", "--dcgm-exporter-url", url)
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert f"cannot read the dcgm-exporter at {url}" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_bad_command_line_exits_two() -> None:
    assert agent("check", "-o", "yaml").returncode == 2


def test_the_help_documents_the_exit_codes() -> None:
    done = agent("check", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    for said in ("0 healthy", "1 a fault", "2 usage", "3 cannot read"):
        assert said in text, text


def test_a_fatal_fault_is_still_exit_one_when_the_dcgm_exporter_cannot_be_read() -> None:
    url = f"http://127.0.0.1:{_closed_port()}/metrics"
    done = sim_check("ecc-uncorrectable.yaml", "--dcgm-exporter-url", url, "-o", "json")
    assert done.returncode == 1, done.stderr  # what NVML read is enough to say the GPU is broken
    verdict = json.loads(done.stdout)["verdict"]
    assert verdict["health"] == "Unhealthy" and url in verdict["cannotRead"]
    assert f"cannot read the dcgm-exporter at {url}" in done.stderr


def test_json_says_unknown_when_the_dcgm_exporter_cannot_be_read() -> None:
    url = f"http://127.0.0.1:{_closed_port()}/metrics"
    done = sim_check("healthy.yaml", "--dcgm-exporter-url", url, "-o", "json")
    assert done.returncode == 3
    verdict = json.loads(done.stdout)["verdict"]
    assert (verdict["health"], verdict["exitCode"]) == ("Unknown", 3)
