"""`agent.gpuTelemetryMetrics: false`: the agent is told to leave GPU telemetry series to dcgm-exporter."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.e2e

CHART = Path(__file__).resolve().parents[2] / "charts" / "gpu-health"


def agent_args(cp: local.ControlPlane, *values: str) -> list[str]:
    out = cp.helm("template", "t", str(CHART), "--kube-version", "1.36.0", *values).stdout
    (daemonset,) = [
        d
        for d in yaml.safe_load_all(out)
        if d and d["kind"] == "DaemonSet" and "agent" in d["metadata"]["name"]
    ]
    container: dict[str, Any] = daemonset["spec"]["template"]["spec"]["containers"][0]
    return list(container["args"])


def test_the_default_exports_telemetry_and_false_turns_it_off(control_plane: local.ControlPlane) -> None:
    assert not any(a.startswith("--gpu-telemetry-metrics") for a in agent_args(control_plane))
    off = agent_args(control_plane, "--set", "agent.gpuTelemetryMetrics=false")
    assert "--gpu-telemetry-metrics=off" in off
