"""How many physical GPUs a Node's `nvidia.com/gpu` capacity stands for.

The agent reports it as `expectedGpuCount` and the operator compares the GPUs
reported against it (GPULost), so both read the capacity the same way here.
Shared GPUs advertise one resource per replica (time-slicing, MPS: GPU
feature discovery's `nvidia.com/gpu.replicas` label), and in MIG mode
(`nvidia.com/mig.strategy`) the resource counts MIG devices: read as a GPU
count, every such node would have "lost" GPUs.
"""

from collections.abc import Mapping
from typing import Final

REPLICAS_LABEL: Final = "nvidia.com/gpu.replicas"
MIG_STRATEGY_LABEL: Final = "nvidia.com/mig.strategy"


def physical_gpus(capacity: object, labels: Mapping[str, str]) -> int | None:
    """The GPU count the capacity stands for; None when absent, malformed or MIG (it cannot tell)."""
    count = _int(capacity)
    if count is None or MIG_STRATEGY_LABEL in labels:
        return None
    replicas = _int(labels.get(REPLICAS_LABEL))
    if replicas is not None and replicas > 1:
        return count // replicas
    return count


def _int(value: object) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None
