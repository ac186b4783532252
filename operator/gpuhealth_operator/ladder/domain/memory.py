"""The domain step's memory: each policy's degraded topology domains (`state.domain_states`).

`ctx.steps.domain`.
"""

from __future__ import annotations

from gpuhealth_operator.state import domain_states


class DomainMemory(domain_states.DomainStates):
    """The domains' states, forgotten with a node's verdicts: what they counted of it goes."""

    def forget_verdicts(self, name: str) -> None:
        self.forget_node(name)
