"""Fire drills' memory: what each drill said, and the health it judged (the `drill_nodes` gauge).

`ctx.steps.drill`; `Context.count_drills` sets the gauge from it after a node is forgotten.
"""

from __future__ import annotations

import collections
import dataclasses

from gpuhealth_api import vocabulary
from gpuhealth_operator.state.judged import NODE, POLICY, drop


@dataclasses.dataclass(eq=False)
class DrillMemory:
    said: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    """(policy, node) → the last Drill message (policy "": the drill's start, end), said once per change."""

    health: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    """(policy, node) → the health a running fire drill judged; the `drill_nodes` gauge counts these."""

    def counts(self, policies: collections.abc.Iterable[str]) -> dict[tuple[str, str], int]:
        """(policy, health) → drilled nodes, for every policy drilled or named in `policies`."""
        counted = collections.Counter((policy, health) for (policy, _), health in self.health.items())
        return {
            (policy, health.value): counted[(policy, health.value)]
            for policy in {p for p, _ in self.health} | set(policies)
            for health in vocabulary.Health
        }

    def forget_verdicts(self, name: str) -> None:
        drop(self.said, name, NODE)
        drop(self.health, name, NODE)

    def forget_node(self, name: str) -> None:
        self.forget_verdicts(name)

    def forget_policy(self, name: str) -> None:
        drop(self.said, name, POLICY)
        drop(self.health, name, POLICY)
