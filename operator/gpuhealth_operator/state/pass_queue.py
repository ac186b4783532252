"""The passes over nodes that watch events asked for and that have not run yet.

A watch event only observes: it updates the cache and asks for a pass over its
node (`request`). `passes` runs them off the event path. An ask made while one
is waiting, or while that node's pass runs, folds into one more pass: a pass
reads the cache as it is when it starts, and that holds every event so far.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools


@dataclasses.dataclass(frozen=True, slots=True)
class Ask:
    """What a node's next pass must do (the watch handler's work, in `passes.run_one`'s order)."""

    handler: str
    """Who asked first ("node", "gpunode"): the label of the reconcile-error counter."""
    judge: bool = True
    """Judge the node and act on the verdicts (`reconciler.reconcile_node`), then its topology domain."""
    stop_drains: bool = False
    """First stop the drains that must stop (an exclude label on a node being drained)."""
    wake: bool = False
    """Last let the nodes waiting for a budget place ask again (the node may have freed one)."""
    received: float | None = None
    """When the first event folded in was received (`latency.now()`): the operator's own latency counts
    from there to the pass's first write (`latency`)."""

    def merged(self, later: Ask) -> Ask:
        """One ask doing what both do: the steps are idempotent, and a pass reads the newest cache."""
        return Ask(
            self.handler,
            judge=self.judge or later.judge,
            stop_drains=self.stop_drains or later.stop_drains,
            wake=self.wake or later.wake,
            received=self.received if self.received is not None else later.received,  # the first event's
        )


class PassQueue:
    """Node name → its waiting ask, in the order first asked; at most one pass running per node."""

    def __init__(self) -> None:
        self._asked: dict[str, Ask] = {}
        self._running: set[str] = set()
        self._ready = asyncio.Event()
        """Set while an ask waits whose node has no pass running."""

    def request(self, name: str, ask: Ask) -> None:
        held = self._asked.get(name)
        self._asked[name] = ask if held is None else held.merged(ask)
        if name not in self._running:
            self._ready.set()

    def take(self, limit: int | None = None) -> list[tuple[str, Ask]]:
        """The waiting asks (the first `limit`) whose node has no pass running, in the order asked; each
        node now counts as running until `finished`."""
        waiting = ((name, ask) for name, ask in self._asked.items() if name not in self._running)
        taken = list(itertools.islice(waiting, limit))
        for name, _ in taken:
            del self._asked[name]
            self._running.add(name)
        if limit is None or not taken:
            self._ready.clear()
        return taken

    def finished(self, name: str) -> None:
        """The node's pass ended (done, failed or cancelled); an ask made meanwhile can be taken now."""
        self._running.discard(name)
        if name in self._asked:
            self._ready.set()

    async def ready(self) -> None:
        """Until an ask can be taken."""
        await self._ready.wait()

    @property
    def busy(self) -> bool:
        """Whether a pass waits or runs."""
        return bool(self._asked or self._running)

    def __len__(self) -> int:
        """Asks waiting (a gauge of how far the passes are behind the events)."""
        return len(self._asked)
