"""`gpu-health-sim record` as a user (or the chart's recorder pod) runs it, against the real API server.

While it records it says how far it got on stderr, every few seconds (records
written, time covered, of `--max-seconds`), and `--quiet` silences that;
`{start}` in `--out` becomes the recording's UTC start time, so the chart's
recorder writes a new file each time it starts. Without a kubeconfig and
outside a pod it says so (exit 2), as before.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

from gpuhealth_sim.backtest import traces
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

SIM: Final = str(Path(sys.executable).parent / "gpu-health-sim")
PROGRESS: Final = re.compile(r"^(\d+) records, 00:00:\d\d of 00:00:07 covered$", re.MULTILINE)


def record(kubeconfig: Path, out: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SIM, "record", "--kubeconfig", str(kubeconfig), "--out", str(out), "--max-seconds", "7", *more],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def test_record_says_how_far_it_got_and_names_its_file_after_its_start(
    crds: local.ControlPlane, tmp_path: Path
) -> None:
    done = record(crds.kubeconfig, tmp_path / "trace-{start}.jsonl")
    assert done.returncode == 0, done.stderr
    lines = PROGRESS.findall(done.stderr)
    assert len(lines) >= 1, done.stderr  # at least one in 7 s, at most one per 5 s
    assert len(lines) <= 2, done.stderr
    (written,) = tmp_path.glob("trace-*.jsonl")
    assert re.fullmatch(r"trace-\d{8}T\d{6}Z\.jsonl", written.name), written.name
    with traces.open_trace(written) as (header, _):
        assert header["generator"]["tool"] == "gpu-health-sim record"
    assert "records (max-seconds)" in done.stdout

    quiet = record(crds.kubeconfig, tmp_path / "quiet.jsonl", "--quiet")
    assert quiet.returncode == 0, quiet.stderr
    assert not PROGRESS.search(quiet.stderr), quiet.stderr


def test_without_a_kubeconfig_outside_a_pod_record_says_so(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    # A pod's address but not its service-account token: not in a pod after all.
    env |= {"HOME": str(tmp_path), "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "1"}
    done = subprocess.run(
        [SIM, "record", "--out", str(tmp_path / "t.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "cannot load the kubeconfig" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "t.jsonl").exists()
