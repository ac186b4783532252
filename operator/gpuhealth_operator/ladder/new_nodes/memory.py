"""New-node validation's memory: the nodes found already in service, the dry runs said.

`ctx.steps.new_nodes`; the validation Jobs' places of repair maxConcurrent are repair's
(`RepairMemory.validations`).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(eq=False)
class NewNodesMemory:
    in_service: dict[str, str] = dataclasses.field(default_factory=dict)
    """node → the Node UID it had when first seen new but already busy (`new_nodes`): in service, not new.
    Another UID under the name (a Node deleted and created again) is a node of its own."""

    said: dict[str, str] = dataclasses.field(default_factory=dict)
    """node → the Node UID whose dry-run "would validate new node" Event was posted (once per node life)."""

    def forget_verdicts(self, name: str) -> None:
        """A node no policy selects is still the node it was: still in service."""

    def forget_node(self, name: str) -> None:
        self.in_service.pop(name, None)
        self.said.pop(name, None)

    def forget_policy(self, name: str) -> None:
        """Kept per node, not per policy."""
