"""GPUNode facts as the agent reports them, and verdicts, for tests and benchmarks.

Pure builders: a healthy GPU, an agent status with per-GPU overrides merged
in, a verdict on which no rule fired, and the ResourceSlice a DRA driver
publishes for those GPUs. Unit tests use them without a
cluster; `operator_harness` writes them to a real API server.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Mapping
from typing import Any

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions.model import NodeVerdict
from gpuhealth_sim.fleet import dra

MODEL = "NVIDIA H100 80GB HBM3"
DRIVER = "570.124.06"


def rfc3339(moment: datetime.datetime | None = None) -> str:
    moment = moment or datetime.datetime.now(datetime.UTC)
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def healthy_gpu(index: int, *, model: str = MODEL, observed: str | None = None) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": f"GPU-{index:08d}-0000-0000-0000-000000000000",
        "model": model,
        "pciBusId": f"00000000:{index + 0x10:02X}:00.0",
        "temperatureCelsius": 42,
        "slowdownTemperatureCelsius": 90,
        "powerWatts": 300.0,
        "smClockMHz": 1980,
        "maxSmClockMHz": 1980,
        "utilizationPercent": 95,
        "ecc": {
            "correctedVolatile": 0,
            "uncorrectedVolatile": 0,
            "correctedAggregate": 0,
            "uncorrectedAggregate": 0,
        },
        "retiredPages": {"doubleBit": 0, "pending": False},
        "remappedRows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
        "xids": [],
        "clockEventReasons": [],
        "recoveryAction": "None",
        "pcie": {"generation": 5, "maxGeneration": 5, "width": 16, "maxWidth": 16, "replayCounter": 0},
        "lost": False,
        "observedTime": observed or rfc3339(),
    }


def verdict(
    labels: Mapping[str, str | None] | None = None, taint: str | None = None, *, node: str = "n"
) -> NodeVerdict:
    """A verdict on which no rule fired: healthy, wanting only the given labels and taint."""
    return NodeVerdict(
        node=node,
        conditions={},
        health=vocabulary.Health.HEALTHY,
        issues=(),
        fired_rules=(),
        wanted_action=None,
        wanted_labels=dict(labels or {}),
        wanted_taint=taint,
        recovered=False,
        detected_at=None,
    )


def merge(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge `overrides` into a copy of `base` (nested dicts merge, anything else replaces)."""
    result = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), dict):
            result[key] = merge(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def agent_status(
    *,
    gpus: int = 8,
    model: str = MODEL,
    overrides: Mapping[int, Mapping[str, Any]] | None = None,
    heartbeat: str | None = None,
    heartbeat_seconds: int = 60,
    observed: str | None = None,
) -> dict[str, Any]:
    """The agent's part of a GPUNode status: healthy GPUs, with per-GPU `overrides` merged in."""
    now = rfc3339()
    items = [
        merge(healthy_gpu(i, model=model, observed=observed or now), (overrides or {}).get(i, {}))
        for i in range(gpus)
    ]
    return {
        "agent": {
            "version": "test",
            "backend": "sim",
            "driverVersion": DRIVER,
            "lastHeartbeatTime": heartbeat or now,
            "heartbeatSeconds": heartbeat_seconds,
            "expectedGpuCount": gpus,
        },
        "summary": {
            "gpuCount": gpus,
            "model": model,
            "maxTemperatureCelsius": max((g.get("temperatureCelsius", 0) for g in items), default=0),
        },
        "gpus": items,
    }


def resource_slice(node: str, gpus: int) -> dict[str, Any]:
    """The node's ResourceSlice as the NVIDIA DRA driver publishes it: one device per GPU, with the
    UUID `healthy_gpu` reports for it."""
    return {
        "apiVersion": f"{dra.GROUP}/{dra.VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": dra.slice_name(node)},
        "spec": {
            "driver": dra.DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": dra.device_name(i),
                    "attributes": {"uuid": {"string": healthy_gpu(i)["uuid"]}, "index": {"int": i}},
                }
                for i in range(gpus)
            ],
        },
    }
