"""The cordon step's memory: cordons whose answer was lost, and the cordons announced.

`ctx.steps.cordon`; judging asks of a lost cordon through `Memories.cordons_unknown`.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(eq=False)
class CordonMemory:
    unknown: dict[str, str] = dataclasses.field(default_factory=dict)
    """node → the resourceVersion its cordon was computed from, while that cordon's answer was lost
    (a 504, a timeout): it may have landed, so the node stays in flight in the budget (`admission`)
    until the cache holds a newer version (`remediation`)."""

    announced: dict[str, str] = dataclasses.field(default_factory=dict)
    """node → the identity (`cordoned-at`) of its cordon this process saw announced: said once
    (`announcements`)."""

    def forget_verdicts(self, name: str) -> None:
        self.unknown.pop(name, None)  # its in-flight place went with `admission.forget_node`

    def forget_node(self, name: str) -> None:
        self.forget_verdicts(name)
        self.announced.pop(name, None)

    def forget_policy(self, name: str) -> None:
        """Kept per node, not per policy."""
