"""Which GPU Operator operands step aside for a reset, and which come back (issue 48, Deliver 2). Pure.

The GPU Operator runs its operands as DaemonSets selecting `nvidia.com/gpu.deploy.<operand>=true` on
each node, and leaves a value already on the node as it is. Setting one to "false" makes its pod leave
the node; setting it back to "true" brings it back. The operator turns off only the operand labels that
are "true" (`to_pause`), records exactly those (`render`, the Node annotation), and restores only those
still "false" (`to_restore`): a label a human changed meanwhile (back to "true", another value, removed)
is the human's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuhealth_api import keys

ON = "true"
OFF = "false"


def to_pause(labels: Mapping[str, str]) -> tuple[str, ...]:
    """The operand labels to turn off: those that are "true" (none: a node the GPU Operator does not
    manage, or whose operands are off already)."""
    return tuple(k for k in keys.GPU_OPERATOR_OPERAND_LABELS if labels.get(k) == ON)


def render(paused: Sequence[str]) -> str:
    return ",".join(paused)


def parse(text: str | None) -> tuple[str, ...]:
    """The recorded labels; anything that is not an operand label is ignored (a hand edit)."""
    known = set(keys.GPU_OPERATOR_OPERAND_LABELS)
    return tuple(k for k in (p.strip() for p in (text or "").split(",")) if k in known)


def to_restore(labels: Mapping[str, str], paused: Iterable[str]) -> dict[str, str]:
    """The labels to set back to "true": those we paused that are still "false"."""
    return {k: ON for k in paused if labels.get(k) == OFF}


def holders(pods: Iterable[Mapping[str, Any]], paused: Sequence[str]) -> list[str]:
    """ "namespace/name" of the node's pods that an operand label we paused selects (nodeSelector
    `<label>: "true"`) and that have not finished: the reset waits until none is left."""
    found: list[str] = []
    for pod in pods:
        selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            continue
        if any(selector.get(k) == ON for k in paused):
            meta = pod.get("metadata") or {}
            found.append(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
    return sorted(found)
