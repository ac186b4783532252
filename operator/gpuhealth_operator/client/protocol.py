"""The action protocol (#25 item 2): what an action that runs over time on a node offers its caller.

decide → start → observe progress → done → undo. `decide` says whether it may start now (its
safety checks: the breaker, an evictable pod); `start` sends the request that begins it
(idempotent: started twice, it adopts the first);
`observe` reads how far it got; the caller, not the action, turns an observation into the next
transition (`decisions`), which keeps every transition testable without a cluster; `undo` stops
and removes what `start` began (a cancel).

Repair steps implement it (`job_step.JobStep`: a step's Kubernetes Job), and so do the node
ladder's drain (`draining.NodeDrain`) and one GPU's isolation (`gpu_rules.GPURule`: its
DeviceTaintRule; which GPUs, within which GPU budget, is the node pass's, as which node is the cordon's).
The cordon (`cordoning`: its budget admission must check and hold a place in one step) and the labels
and taint (`marking`: level-triggered, nothing runs) are modules of their own without it.
"""

from __future__ import annotations

import datetime
from typing import Protocol, TypeVar

Observation_co = TypeVar("Observation_co", covariant=True)


class Action(Protocol[Observation_co]):
    """One action on one node."""

    @property
    def name(self) -> str:
        """What it is, in words (`step reset (ResetGPU)`), for Events and logs."""
        ...

    async def decide(self, now: datetime.datetime) -> str | None:
        """Why it may not start now (None: it may); may read the cluster (the pods on the node)."""
        ...

    async def start(self, now: datetime.datetime) -> bool:
        """Begin it; True when this call began it, False when it had begun already (adopted)."""
        ...

    async def observe(self) -> Observation_co:
        """How far it got, as a plain value the decisions read."""
        ...

    async def undo(self) -> bool:
        """Stop it and remove what `start` made; False when there was nothing left to remove."""
        ...
