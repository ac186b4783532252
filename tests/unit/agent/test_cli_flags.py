"""Day-2 flags of `gpu-health-agent`: --version, --log-format json, build_info, a bad kubeconfig."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import prometheus_client
import pytest

from gpuhealth_agent import health, metrics
from gpuhealth_api import __version__

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "scenarios"
AGENT = [sys.executable, "-m", "gpuhealth_agent.cli"]


def agent(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AGENT, *argv], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)


def test_the_version_has_one_source_of_truth() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in pyproject["project"]["dynamic"]  # read from gpuhealth_api.__version__ at build time
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "gpuhealth_api.__version__"}
    done = agent("--version")
    assert (done.returncode, done.stdout) == (0, f"gpu-health-agent {__version__}\n")


def test_build_info_is_on_metrics() -> None:
    registry = prometheus_client.CollectorRegistry()
    metrics.AgentMetrics(registry)
    liveness = health.Liveness(interval_seconds=5.0)
    liveness.completed(time.time())
    server = health.HealthServer(0, liveness, registry, host="127.0.0.1").start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as response:
            text = response.read().decode()
    finally:
        server.stop()
    line = f'gpuhealth_agent_build_info{{python="{platform.python_version()}",version="{__version__}"}} 1.0'
    assert line in text.splitlines()


def test_log_format_json_writes_one_object_per_line(tmp_path: Path) -> None:
    # An unreadable dcgm-exporter logs a warning: the line must be JSON, with the fields a pipeline needs.
    done = agent(
        "check", "--backend", "sim", "--sim-scenario", str(EXAMPLES / "healthy.yaml"),
        "--dcgm-exporter-url", "http://127.0.0.1:1/metrics", "--log-level", "WARNING", "--log-format", "json",
    )  # fmt: skip
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert lines, done.stderr
    for line in lines:
        assert {"time", "level", "logger", "message"} <= set(line)
        assert line["time"].endswith("Z")
    assert any(line["level"] == "WARNING" and "dcgm-exporter" in line["message"] for line in lines)


def test_log_format_text_stays_the_default() -> None:
    done = agent("check", "--help")
    assert "--log-format {text,json}" in done.stdout


@pytest.fixture
def bad_kubeconfigs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    malformed = tmp_path / "malformed.yaml"
    malformed.write_text("apiVersion: v1\nclusters: [\n  - bad\n")
    context = tmp_path / "context.yaml"
    context.write_text(
        "apiVersion: v1\nkind: Config\n"
        'clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]\n'
        "users: [{name: u, user: {token: x}}]\n"
        "contexts: [{name: a, context: {cluster: c, user: u}}]\n"
        "current-context: nope\n"
    )
    return {
        "missing": (tmp_path / "missing.yaml", "no such file"),
        "malformed": (malformed, "not valid YAML (line 3, column 3"),
        "context": (context, "no context named 'nope'"),
    }


@pytest.mark.parametrize("case", ["missing", "malformed", "context"])
def test_a_bad_kubeconfig_is_one_line_naming_the_file_and_exit_two(
    bad_kubeconfigs: dict[str, tuple[Path, str]], case: str
) -> None:
    path, problem = bad_kubeconfigs[case]
    done = agent(
        "run", "--node-name", "n1", "--backend", "sim", "--sim-scenario", str(EXAMPLES / "healthy.yaml"),
        "--metrics-port", "0", "--kubeconfig", str(path),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert str(path) in lines[0] and problem in lines[0]
