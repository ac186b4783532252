"""The chart's on-call role, proven by acting: a user bound only to it runs `kubectl gpuhealth`.

`helm install` of the chart with `rbac.oncall.subjects` naming one user; a
second user is bound only to the built-in `view` (which the chart's
aggregation extends to GPUNodes and policies). The administrator's kubeconfig
impersonates each (`--as`, as kubectl does), so every request the plugin makes
is authorized as that user: `status`, `why NODE`, `drill` and `status --watch`
work for on-call; with only `view`, what fails says which permission is
missing. The plugin runs as `kubectl gpuhealth`, found on PATH.
"""

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth_api import keys, resources
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpu-health"
BIN = Path(sys.executable).parent
TIMEOUT = 60.0
UNIQUE_LABEL = "e2e.gpuhealth.io/oncall"


class Oncall:
    def __init__(self, cp: local.ControlPlane, suffix: str) -> None:
        self.cp = cp
        self.suffix = suffix
        self.namespace = f"oncall-e2e-{suffix}"
        self.release = f"oncall-{suffix}"
        self.role = f"{self.release}-gpu-health-oncall"
        self.user = f"oncall-{suffix}"
        self.viewer = f"viewer-{suffix}"
        self.node = f"oncall-{suffix}-gpu-0"
        self.policy = f"oncall-{suffix}"

    def plugin(self, user: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """`kubectl gpuhealth --as USER ARGS`: kubectl finds the plugin on PATH and hands it the flags."""
        env = self.cp.env()
        env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
        return subprocess.run(
            [str(self.cp.binaries / "kubectl"), "gpuhealth", "--as", user, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def gpunode(self) -> dict[str, Any]:
        out = self.cp.kubectl("get", resources.GPUNODE_PLURAL, self.node, "-o", "json").stdout
        body: dict[str, Any] = json.loads(out)
        return body

    def set_health(self, health: str, issues: str, action: str) -> None:
        status = {
            "health": health,
            "issues": issues,
            "action": action,
            "agent": {"version": "0.1.0", "backend": "sim", "lastHeartbeatTime": "2026-12-01T00:00:00Z"},
        }
        body = {
            "apiVersion": resources.API_VERSION,
            "kind": resources.GPUNODE_KIND,
            "metadata": {"name": self.node},
        }
        self.cp.kubectl(
            "apply", "--server-side", "--force-conflicts", "--field-manager=e2e", "--subresource=status",
            "-f", "-", input=json.dumps({**body, "status": status}),
        )  # fmt: skip


@pytest.fixture(scope="module")
def oncall(control_plane: local.ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Oncall]:
    o = Oncall(control_plane, "r" + secrets.token_hex(3))
    cp = control_plane
    values = tmp_path_factory.mktemp("oncall") / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                # Land nowhere: this module tests RBAC; the workloads need not run.
                "operator": {"nodeSelector": {UNIQUE_LABEL: "nowhere"}},
                "agent": {"nodeSelector": {UNIQUE_LABEL: "nowhere"}},
                "defaultPolicy": {"enabled": False},
                "rbac": {
                    "oncall": {
                        "create": True,
                        "subjects": [
                            {"kind": "User", "name": o.user, "apiGroup": "rbac.authorization.k8s.io"}
                        ],
                    }
                },
            }
        )
    )
    cp.kubectl("create", "namespace", o.namespace)
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": o.node, "labels": {UNIQUE_LABEL: o.suffix}},
    }
    policy = {
        "apiVersion": resources.API_VERSION,
        "kind": resources.POLICY_KIND,
        "metadata": {"name": o.policy},
        "spec": {
            "nodeSelector": {"matchLabels": {UNIQUE_LABEL: o.suffix}},
            "dryRun": True,
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
        },
    }
    gpunode = {
        "apiVersion": resources.API_VERSION,
        "kind": resources.GPUNODE_KIND,
        "metadata": {"name": o.node},
    }
    try:
        cp.helm("install", o.release, str(CHART), "--namespace", o.namespace, "-f", str(values), timeout=180)
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([node, policy, gpunode]))
        o.set_health("Unhealthy", "EccUncorrectable,ThermalThrottled", "DryRun")
        cp.kubectl("create", "clusterrolebinding", o.viewer, "--clusterrole=view", f"--user={o.viewer}")
        # The chart's aggregation into `view` is folded in by the controller manager: wait for it.
        waiting.wait_until(
            lambda: (
                cp.kubectl(
                    "auth", "can-i", "list", resources.GPUNODE_PLURAL, "--as", o.viewer, check=False
                ).stdout.strip()
                == "yes"
            ),
            timeout_seconds=TIMEOUT,
            message="view aggregates gpunodes",
        )
        yield o
    finally:
        cp.kubectl("delete", "clusterrolebinding", o.viewer, "--ignore-not-found", check=False)
        cp.kubectl("delete", resources.POLICY_PLURAL, o.policy, "--ignore-not-found", check=False)
        cp.kubectl("delete", resources.GPUNODE_PLURAL, o.node, "--ignore-not-found", check=False)
        cp.kubectl("delete", "node", o.node, "--ignore-not-found", "--wait=false", check=False)
        cp.helm("uninstall", o.release, "--namespace", o.namespace, check=False, timeout=180)
        cp.kubectl("delete", "namespace", o.namespace, "--ignore-not-found", "--wait=false", check=False)


def test_oncall_role_runs_status_why_and_drill(oncall: Oncall) -> None:
    status = oncall.plugin(oncall.user, "status")
    assert status.returncode == 0, status.stderr
    assert any(
        line.startswith(oncall.policy + " ") and "dry-run" in line for line in status.stdout.splitlines()
    )
    assert any(line.startswith(oncall.node) and "Unhealthy" in line for line in status.stdout.splitlines())

    report = json.loads(oncall.plugin(oncall.user, "status", "-o", "json").stdout)
    (row,) = [n for n in report["nodes"] if n["node"] == oncall.node]
    assert row["issues"] == ["EccUncorrectable", "ThermalThrottled"]
    assert row["lastHeartbeatTime"] == "2026-12-01T00:00:00Z"

    why = oncall.plugin(oncall.user, "why", oncall.node)
    assert why.returncode == 0, why.stderr
    assert f"{oncall.node}: Unhealthy (EccUncorrectable,ThermalThrottled), action DryRun" in why.stdout

    drill = oncall.plugin(oncall.user, "drill", oncall.node, "EccUncorrectable", "--ttl", "5m")
    assert drill.returncode == 0, drill.stderr
    annotations = oncall.gpunode()["metadata"].get("annotations") or {}
    assert annotations.get(keys.DRILL_ANNOTATION) == "EccUncorrectable"
    stop = oncall.plugin(oncall.user, "drill", oncall.node, "--stop")
    assert stop.returncode == 0, stop.stderr
    assert keys.DRILL_ANNOTATION not in (oncall.gpunode()["metadata"].get("annotations") or {})

    # The role is read-and-drill: a policy change (resume: spec.dryRun=false) stays with `edit`.
    resume = oncall.plugin(oncall.user, "resume", oncall.policy)
    assert resume.returncode == 1 and "403" in resume.stderr, resume.stderr


def test_view_alone_reads_gpunodes_but_not_nodes_nor_drills(oncall: Oncall) -> None:
    status = oncall.plugin(oncall.viewer, "status")
    assert status.returncode == 1
    assert "403" in status.stderr and "nodes" in status.stderr, status.stderr
    why = oncall.plugin(oncall.viewer, "why", oncall.node)
    assert why.returncode == 1 and "403" in why.stderr and "nodes" in why.stderr, why.stderr
    drill = oncall.plugin(oncall.viewer, "drill", oncall.node, "EccUncorrectable")
    assert drill.returncode == 1 and "403" in drill.stderr and "patch" in drill.stderr, drill.stderr
    assert keys.DRILL_ANNOTATION not in (oncall.gpunode()["metadata"].get("annotations") or {})


def test_status_watch_redraws_on_a_change(oncall: Oncall, tmp_path: Path) -> None:
    """`--watch-count 2`: the first screen, then the next that differs (the node turns Healthy)."""
    env = oncall.cp.env()
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    command = [str(oncall.cp.binaries / "kubectl"), "gpuhealth", "--as", oncall.user, "status"]
    with (tmp_path / "stderr").open("w+") as stderr:
        watcher = subprocess.Popen(
            [*command, "--watch", "--interval", "0.2", "--watch-count", "2"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        # A deadline for the reads below: kill a watch that never ends (read() would wait forever).
        deadline = threading.Timer(TIMEOUT, watcher.kill)
        deadline.start()
        try:
            assert watcher.stdout is not None
            first = watcher.stdout.readline()  # the "--- time" header of the first screen: it has drawn
            assert first.startswith("--- "), first
            oncall.set_health("Healthy", "", "None")
            # read(), not communicate(): communicate reads the pipe itself, losing what readline buffered.
            out = watcher.stdout.read()
            watcher.wait(timeout=TIMEOUT)
        finally:
            deadline.cancel()
            watcher.kill()
            watcher.wait()
            if watcher.stdout is not None:
                watcher.stdout.close()
        stderr.seek(0)
        err = stderr.read()
    assert watcher.returncode == 0, err
    screens = (first + out).split("--- ")[1:]
    assert len(screens) == 2
    assert oncall.node in screens[0] and "Every GPU node is Healthy" in screens[1], first + out
    oncall.set_health("Unhealthy", "EccUncorrectable,ThermalThrottled", "DryRun")

    # Without a count it runs until Ctrl-C, which ends it quietly with exit 0.
    watcher = subprocess.Popen(
        [*command, "--watch", "--interval", "0.2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watcher.stdout is not None
        assert watcher.stdout.readline().startswith("--- ")
        watcher.send_signal(signal.SIGINT)
        _, err = watcher.communicate(timeout=TIMEOUT)
    finally:
        watcher.kill()
        watcher.wait()
    assert watcher.returncode == 0 and "Traceback" not in err, err
