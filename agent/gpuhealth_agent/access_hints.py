"""What most likely hides the GPUs from an agent, and the chart value that fixes it.

Pure: from how the chart says the agent reaches the GPUs (`agent.gpuAccess.mode`) and the RuntimeClass
its pod runs in, both passed as environment variables, to one sentence for the NoGPUsVisible message.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

MODE_ENV = "GPUHEALTH_GPU_ACCESS_MODE"
RUNTIME_CLASS_ENV = "GPUHEALTH_RUNTIME_CLASS"


@dataclasses.dataclass(frozen=True)
class GpuAccess:
    mode: str
    """The chart's `agent.gpuAccess.mode` (envvar, volumeMounts, cdi, hostDriver, privileged)."""
    runtime_class: str
    """The pod's runtimeClassName; empty: the node's default runtime."""


def from_environment(environ: Mapping[str, str] = os.environ) -> GpuAccess | None:
    """The access the chart rendered, or None outside the chart (no such variables)."""
    mode = environ.get(MODE_ENV)
    if not mode:
        return None
    return GpuAccess(mode=mode, runtime_class=environ.get(RUNTIME_CLASS_ENV, ""))


def hint(access: GpuAccess | None) -> str:
    """The likely cause and the value to change, for the pod this agent runs in."""
    if access is None:
        return (
            "check the agent pod's runtimeClassName, NVIDIA_VISIBLE_DEVICES and device mounts "
            "(chart values agent.runtimeClassName, agent.gpuAccess.mode)"
        )
    if access.mode in ("envvar", "privileged") and not access.runtime_class:
        # The commonest day-one case: GPU Operator >= 25.10 injects GPUs through CDI for pods that request
        # them, and only its `nvidia` RuntimeClass still honours NVIDIA_VISIBLE_DEVICES.
        return (
            "the pod runs in the node's default runtime, which ignores NVIDIA_VISIBLE_DEVICES where the "
            "GPU Operator >= 25.10 uses CDI (its default): set agent.runtimeClassName=nvidia; without the "
            "GPU Operator and without an NVIDIA runtime (e.g. GKE), set agent.gpuAccess.mode=hostDriver"
        )
    if access.mode == "envvar":
        # The runtime is NVIDIA's, so the toolkit itself refused the variable for an unprivileged pod
        # (accept-nvidia-visible-devices-envvar-when-unprivileged=false: Bottlerocket, hardened toolkits).
        return (
            f"the {access.runtime_class!r} runtime ignores NVIDIA_VISIBLE_DEVICES from unprivileged pods: "
            "set agent.gpuAccess.mode=volumeMounts"
        )
    if access.mode in ("volumeMounts", "cdi"):
        runtime = "the node's default runtime"
        if access.runtime_class:
            runtime = f"the {access.runtime_class!r} runtime"
        return (
            f"{runtime} did not inject the GPUs for agent.gpuAccess.mode={access.mode}: where the node "
            "has an NVIDIA runtime as a RuntimeClass set agent.runtimeClassName to it; where it has "
            "no NVIDIA runtime at all (e.g. GKE), set agent.gpuAccess.mode=hostDriver"
        )
    if access.mode == "hostDriver":
        return (
            "no libnvidia-ml.so.1 under agent.gpuAccess.hostDriverPath, or no /dev/nvidia* device: "
            "check that path"
        )
    return "check the agent pod's runtimeClassName and agent.gpuAccess.mode"
