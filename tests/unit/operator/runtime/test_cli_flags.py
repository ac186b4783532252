"""Day-2 flags of `gpu-health-operator`: --version, --log-format json, build_info, a bad kubeconfig.

Run as a process: what a human sees is the output and the exit code.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpuhealth_api import __version__
from gpuhealth_operator.shared import metrics
from gpuhealth_sim.waiting import wait_until

ROOT = Path(__file__).resolve().parents[4]
OPERATOR = [sys.executable, "-m", "gpuhealth_operator.runtime.cli"]
NO_PORTS = ["--metrics-port", "0", "--health-port", "0"]


def operator(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*OPERATOR, *argv], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False
    )


def test_version_prints_and_exits_zero() -> None:
    done = operator("--version")
    assert (done.returncode, done.stdout) == (0, f"gpu-health-operator {__version__}\n")


def test_build_info_gauge() -> None:
    meters = metrics.Metrics.create()
    labels = {"version": __version__, "python": platform.python_version()}
    assert meters.registry.get_sample_value("gpuhealth_operator_build_info", labels) == 1


def _unreachable_kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        'clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]\n'
        "users: [{name: u, user: {token: x}}]\n"
        "contexts: [{name: a, context: {cluster: c, user: u}}]\n"
        "current-context: a\n"
    )
    return path


def test_log_format_json_emits_parseable_json_lines(tmp_path: Path) -> None:
    # An API server that refuses connections: the operator logs its failed Lease attempts.
    lines: list[str] = []
    with subprocess.Popen(
        [*OPERATOR, *NO_PORTS, "--kubeconfig", str(_unreachable_kubeconfig(tmp_path)),
         "--lease-retry-seconds", "0.2", "--log-format", "json"],
        stderr=subprocess.PIPE, text=True, cwd=ROOT,
    ) as process:  # fmt: skip

        def read() -> None:
            assert process.stderr is not None
            for line in process.stderr:  # appended one by one: the wait below sees the first
                lines.append(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            wait_until(lambda: len(lines) >= 1, timeout_seconds=30, message="no log line")
        finally:
            process.terminate()
            process.wait(timeout=30)
            reader.join(timeout=10)
    assert lines
    for line in lines:
        record = json.loads(line)  # every line, not only the first
        assert {"time", "level", "logger", "message"} <= set(record), record
        assert record["time"].endswith("Z")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "no such file"),
        ("apiVersion: v1\nclusters: [\n  - bad\n", "not valid YAML (line 3, column 3"),
        (
            "apiVersion: v1\nkind: Config\n"
            'clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]\n'
            "users: [{name: u, user: {token: x}}]\n"
            "contexts: [{name: a, context: {cluster: c, user: u}}]\n"
            "current-context: nope\n",
            "no context named 'nope'",
        ),
    ],
    ids=["missing", "malformed", "unknown-context"],
)
def test_a_bad_kubeconfig_exits_two_with_one_line(tmp_path: Path, content: str | None, problem: str) -> None:
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content)
    done = operator(*NO_PORTS, "--kubeconfig", str(path))
    assert "Traceback" not in done.stderr
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert str(path) in lines[0] and problem in lines[0]
