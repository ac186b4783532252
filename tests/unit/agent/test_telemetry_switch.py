"""`--gpu-telemetry-metrics off`: leave temperature, power and clock series to dcgm-exporter.

Where dcgm-exporter runs, the agent's copies of its telemetry double the
series for nothing. Off, the agent's /metrics has no temperature, power or SM
clock series; every fault series (ECC, XIDs, remaps, throttle reasons, lost
GPUs) stays, and so do the facts on the GPUNode (the operator judges those).
"""

from __future__ import annotations

import types
from collections import Counter

import prometheus_client
import pytest

from gpuhealth_agent import cli, metrics

GPU = {
    "index": 0,
    "uuid": "GPU-0",
    "temperatureCelsius": 93,
    "powerWatts": 610.0,
    "smClockMHz": 1400,
    "maxSmClockMHz": 1980,
    "utilizationPercent": 97,
    "ecc": {"uncorrectedVolatile": 1, "correctedVolatile": 0},
    "clockEventReasons": ["HwThermalSlowdown"],
    "recoveryAction": "None",
}
TELEMETRY = (
    "gpuhealth_agent_gpu_temperature_celsius",
    "gpuhealth_agent_gpu_power_watts",
    "gpuhealth_agent_gpu_sm_clock_mhz",
)


def scrape(*, telemetry: bool) -> str:
    registry = prometheus_client.CollectorRegistry()
    sample = types.SimpleNamespace(
        time=0.0,
        gpus=[GPU],
        nics=None,
        expected_gpus=1,
        errors=Counter(),
        duration_seconds=0.01,
        driver_version=None,
    )
    metrics.AgentMetrics(registry, gpu_telemetry=telemetry).observe(sample)  # type: ignore[arg-type]
    return prometheus_client.generate_latest(registry).decode()


def test_off_drops_temperature_power_and_clock_series_and_keeps_every_fault_series() -> None:
    on, off = scrape(telemetry=True), scrape(telemetry=False)
    for name in TELEMETRY:
        assert f"{name}{{" in on
        assert name not in off
    for kept in (
        'gpuhealth_agent_gpu_ecc_errors{gpu="0",kind="uncorrected",scope="volatile",uuid="GPU-0"} 1.0',
        'gpuhealth_agent_gpu_clock_event_reason_active{gpu="0",reason="HwThermalSlowdown",uuid="GPU-0"} 1.0',
        'gpuhealth_agent_gpu_max_sm_clock_mhz{gpu="0",uuid="GPU-0"} 1980.0',
        'gpuhealth_agent_gpu_utilization_percent{gpu="0",uuid="GPU-0"} 97.0',
    ):
        assert kept in on.splitlines() and kept in off.splitlines(), kept


@pytest.mark.parametrize(("flag", "expected"), [([], True), (["--gpu-telemetry-metrics", "off"], False)])
def test_the_flag(flag: list[str], expected: bool) -> None:
    assert cli.parser().parse_args(["run", *flag]).gpu_telemetry_metrics == ("on" if expected else "off")
