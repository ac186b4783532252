"""Repair step kinds as rows: what each `spec.repair.steps[].action` targets, how long it may take by
default, how its effect is seen, what must let go of the GPUs first, and its words.

A new step kind is one row here, its Job template (`repair-templates.yaml`, the chart's ConfigMap) and
its docs (docs/repair.md); the repair cycle (`decisions.repair`, `ladder.repair.repairing`) reads the
row and branches on no action by name.
"""

from __future__ import annotations

import dataclasses
import enum
import types
from collections.abc import Mapping
from typing import Final

from gpuhealth_api import vocabulary

RepairAction = vocabulary.RepairAction
Recovery = vocabulary.RecoveryAction


class Targets(enum.Enum):
    """Which GPUs a step's Job is handed (`GPU_UUIDS` in its template)."""

    FAULTY_GPUS = "faulty"
    """The faulty GPUs only: the step does not apply while no faulty GPU's UUID is known."""
    ALL_GPUS = "all"
    """Every GPU the agent lists: the step acts on the node."""


class Effect(enum.Enum):
    """How the step's effect is seen in the agent's reports."""

    FAULT_CLEARED = "cleared"
    """The fault reads clean in a report seen after the Job finished."""
    NEW_BOOT = "boot"
    """The agent reports another `bootId`, and the fault is gone after the boot."""


@dataclasses.dataclass(frozen=True)
class StepKind:
    """One repair step kind (a row)."""

    action: RepairAction
    targets: Targets
    default_timeout_seconds: float
    effect: Effect
    gpus_free_first: bool
    """Nothing may hold the GPUs open when the Job starts: the GPU Operator's operands step aside and
    the agent lets go of NVML first (`ladder.repair.operands`, `ladder.repair.gpu_release`)."""
    cures: frozenset[str]
    """The GPUs' `recoveryAction`s that ask for this kind: a cycle starts at its first step."""
    rank: int
    """Which kind a cycle starts at when the GPUs ask for several (lowest first)."""
    doing: str
    """What it does, for the DryRun words: `{gpus}` is the faulty GPUs in words."""

    @property
    def template(self) -> str:
        """The Job template's key (`repair-templates.yaml`, the ConfigMap `--repair-templates`)."""
        return self.action.value


KINDS: Final[Mapping[RepairAction, StepKind]] = types.MappingProxyType(
    {
        RepairAction.RESET_GPU: StepKind(
            action=RepairAction.RESET_GPU,
            targets=Targets.FAULTY_GPUS,
            default_timeout_seconds=300.0,
            effect=Effect.FAULT_CLEARED,
            gpus_free_first=True,
            # the drain is done: a drained node is what DrainAndReset asks the reset to follow
            cures=frozenset(
                {Recovery.GPU_RESET.value, Recovery.BUS_RESET.value, Recovery.DRAIN_AND_RESET.value}
            ),
            rank=1,
            doing="reset {gpus}",
        ),
        RepairAction.REBOOT_NODE: StepKind(
            action=RepairAction.REBOOT_NODE,
            targets=Targets.ALL_GPUS,
            default_timeout_seconds=1800.0,
            effect=Effect.NEW_BOOT,
            gpus_free_first=False,
            # a reset first would be a step the driver said will not do
            cures=frozenset({Recovery.NODE_REBOOT.value, Recovery.SYSTEM_REBOOT.value}),
            rank=0,
            doing="reboot the node",
        ),
    }
)
"""Every repair step kind; `test_step_kinds` checks that each `RepairAction` has its row."""

BY_TEMPLATE: Final[Mapping[str, StepKind]] = types.MappingProxyType(
    {kind.template: kind for kind in KINDS.values()}
)


def of(action: RepairAction) -> StepKind:
    """The row of a step's action."""
    return KINDS[action]


def asked_for(recovery: set[str]) -> RepairAction | None:
    """The kind the GPUs' `recoveryAction`s ask a cycle to start at, if any (the lowest rank)."""
    asked = [kind for kind in KINDS.values() if recovery & kind.cures]
    return min(asked, key=lambda kind: kind.rank).action if asked else None
