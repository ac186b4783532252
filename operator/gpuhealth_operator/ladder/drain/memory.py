"""The drain step's memory: the drains running in this process (their one owner, `client.drains`)
and the evictions in flight across them.

`ctx.steps.drain`; judging asks whether a node drains through `Memories.draining`.
"""

from __future__ import annotations

import asyncio

from gpuhealth_operator.client import drains


class DrainMemory(drains.Drains):
    """The drains' owner, with the semaphore every drain's evictions share."""

    def __init__(self, eviction_concurrency: int = 16) -> None:
        super().__init__()
        self.eviction_slots = asyncio.Semaphore(eviction_concurrency)
        """Evictions in flight across all drains (sized from settings by `Context.create`)."""

    def forget_verdicts(self, name: str) -> None:
        """A node no policy selects any more still drains: the drain runs on."""
