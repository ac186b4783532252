"""GPU and driver profiles (native/simnvml/profiles.yaml) and `gpu-health-agent check` on the library.

Each profile runs the real `gpu-health-agent check -o json` (`--backend nvml`, real pynvml) in a process
of its own whose LD_LIBRARY_PATH points at the profile's build of libnvidia-ml.so.1, as on a node:
the loader keeps one library per soname and process, and an old driver is a different library.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import simnvml_build
from gpuhealth_agent import check, nvml

ROOT = Path(__file__).resolve().parents[3]
PROFILES: dict[str, dict[str, Any]] = yaml.safe_load(
    (ROOT / "native" / "simnvml" / "profiles.yaml").read_text()
)


def run_check(
    tmp_path: Path, plan: dict[str, Any], library: str, *args: str
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(plan))
    command = [sys.executable, "-m", "gpuhealth_agent.simnvml", "--scenario", str(path), "--node-name", "n"]
    return subprocess.run(
        [*command, "--", "check", *args],
        env=simnvml_build.environment(library),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def assert_subset(expected: Any, got: Any, where: str = "gpus[0]") -> None:
    if isinstance(expected, dict):
        assert isinstance(got, dict), f"{where}: {got!r} is not a mapping"
        for key, value in expected.items():
            assert key in got, f"{where}.{key} is missing: {sorted(got)}"
            assert_subset(value, got[key], f"{where}.{key}")
    else:
        assert got == expected, f"{where}: {got!r} != {expected!r}"


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_each_profile_reports_what_its_gpu_and_driver_answer(tmp_path: Path, name: str) -> None:
    profile = PROFILES[name]
    done = run_check(tmp_path, profile["scenario"], profile["library"], "-o", "json")
    assert done.returncode == check.HEALTHY_EXIT, done.stderr
    report = json.loads(done.stdout)
    assert report["agent"]["backend"] == "nvml"
    assert report["agent"]["driverVersion"] == profile["scenario"]["driverVersion"]
    assert len(report["gpus"]) == profile["scenario"]["gpus"]
    gpu = report["gpus"][0]
    expect, absent = dict(profile["expect"]), list(profile.get("absent", []))
    if not _fabric_readable():  # nvidia-ml-py 12.535 declares R535's struct: fabric is not read
        expect.pop("fabric", None)
        absent.append("fabric")
    assert_subset(expect, gpu)
    for field in absent:
        assert field not in gpu, f"{field} reported: {gpu[field]!r}"
    assert "unreadable" not in gpu


def _fabric_readable() -> bool:
    try:
        nvml.fabric_info()
    except nvml.FunctionNotFound:
        return False
    return True


def test_the_old_driver_lacks_the_functions_and_the_full_one_has_them(tmp_path: Path) -> None:
    """The old-driver build has no nvmlDeviceGetTemperatureV: pynvml raises FunctionNotFound for it."""
    probe = (
        "import pynvml\n"
        "pynvml.nvmlInit()\n"
        "try:\n"  # pynvml's own symbol lookup (every binding has it; not every binding wraps the call)
        "    pynvml._nvmlGetFunctionPointer('nvmlDeviceGetTemperatureV')\n"
        "    print('found')\n"
        "except pynvml.NVMLError_FunctionNotFound:\n"
        "    print('FunctionNotFound')\n"
    )
    (tmp_path / "probe.py").write_text(probe)
    (tmp_path / "plan.yaml").write_text("gpus: 1\n")
    answers = {}
    for library in ("full", "old-driver"):
        done = subprocess.run(
            [sys.executable, "-c", _driven(tmp_path / "plan.yaml", tmp_path / "probe.py")],
            env=simnvml_build.environment(library),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        answers[library] = done.stdout.strip()
    assert answers == {"full": "found", "old-driver": "FunctionNotFound"}


def _driven(plan: Path, script: Path) -> str:
    return (
        "from gpuhealth_agent import scenario, simnvml\n"
        f"driver = simnvml.Driver(scenario.load({str(plan)!r}))\n"
        f"exec(open({str(script)!r}).read())\n"
    )


def test_check_over_the_library_finds_a_fault(tmp_path: Path) -> None:
    """`gpu-health-agent check` (table and JSON) on the production path: a double-bit ECC error exits 1."""
    plan = {"gpus": 8, "timeline": [{"after": "0s", "gpu": 3, "set": {"eccUncorrectedVolatile": 1}}]}
    table = run_check(tmp_path, plan, "full")
    assert table.returncode == check.FATAL_EXIT, table.stderr
    assert "backend nvml" in table.stdout and "8 GPU(s) answering" in table.stdout
    report = json.loads(run_check(tmp_path, plan, "full", "-o", "json").stdout)
    assert report["gpus"][3]["ecc"]["uncorrectedVolatile"] == 1
    assert report["gpus"][2]["ecc"]["uncorrectedVolatile"] == 0
