"""Day-2 flags of `gpu-health-sim`: --version, --log-format json, a bad kubeconfig for `run` and `record`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuhealth_api import __version__

ROOT = Path(__file__).resolve().parents[3]
SIM = [sys.executable, "-m", "gpuhealth_sim.cli"]
FLEET = ROOT / "examples" / "fleets"


def sim(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SIM, *argv], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)


def test_version_prints_and_exits_zero() -> None:
    done = sim("--version")
    assert (done.returncode, done.stdout) == (0, f"gpu-health-sim {__version__}\n")


def test_run_takes_log_format() -> None:
    done = sim("run", "--help")
    assert "--log-format {text,json}" in done.stdout


CASES = [
    (None, None, "no such file"),
    ("apiVersion: v1\nclusters: [\n  - bad\n", None, "not valid YAML (line 3, column 3"),
    (
        "apiVersion: v1\nkind: Config\n"
        'clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]\n'
        "users: [{name: u, user: {token: x}}]\n"
        "contexts: [{name: a, context: {cluster: c, user: u}}]\n"
        "current-context: a\n",
        "nope",
        "no context named 'nope'",
    ),
]


@pytest.mark.parametrize(("content", "context", "problem"), CASES, ids=["missing", "malformed", "context"])
@pytest.mark.parametrize("command", ["record", "run"])
def test_a_bad_kubeconfig_exits_two_with_one_line(
    tmp_path: Path, command: str, content: str | None, context: str | None, problem: str
) -> None:
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content)
    argv = [command, "--kubeconfig", str(path), *(["--context", context] if context else [])]
    if command == "record":
        argv += ["--out", str(tmp_path / "trace.jsonl"), "--quiet"]
    else:
        argv += ["--fleet", str(_fleet())]
    done = sim(*argv)
    assert "Traceback" not in done.stderr
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert str(path) in lines[0] and problem in lines[0]


def _fleet() -> Path:
    return FLEET / "demo.yaml"
