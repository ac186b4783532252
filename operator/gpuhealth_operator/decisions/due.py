"""Which nodes the timer must look at: the ones that changed, the ones still due, the ones time makes due.

The timer's question per node (`ticker.is_due`: may time alone change its
verdict now?) is cheap, but asked of every node on every tick it made the
operator's cost at rest follow the fleet (300 mCPU at 5,000 nodes, issue 29).
Its answer can only turn from no to yes in three ways, and this index keeps
the nodes each way names:

- the node's records changed (a watch event or our own write: `touch`), a
  verdict of it was forgotten (`touch`), or a policy changed (`touch_all`);
- time passed its deadline: the instant its agent's report turns stale soon
  (`expect`, from the report; `ticker.is_due` wakes `lead` seconds early);
- it was due on the last pass and nothing has made it rest since (`keep`).

Everything else is a set the caller already holds (running drains, nodes
waiting for the budget, agents whose pod is not Ready) and passes in. So the
candidates are a superset of the due nodes, and `is_due` still decides: a
node the old scan of every node would have judged is never missed (the
property tests in tests/unit/operator/runtime/test_due_index.py hold the two equal).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable


class DueIndex:
    """The candidates for the timer's next pass; `take` hands them over and starts collecting anew."""

    __slots__ = ("_deadlines", "_everything", "_heap", "_kept", "_touched")

    def __init__(self) -> None:
        self._touched: set[str] = set()
        self._kept: set[str] = set()
        self._everything = True  # a new index knows nothing: the first pass looks at every node
        self._deadlines: dict[str, float] = {}
        """node → epoch seconds at which time alone makes it due (its report stale), while not passed."""
        self._heap: list[tuple[float, str]] = []
        """(deadline, node); an entry whose node's deadline moved is pushed again or dropped when popped."""

    def touch(self, name: str) -> None:
        """The node's records or verdicts changed: look at it on the next pass."""
        self._touched.add(name)

    def touch_all(self) -> None:
        """Something every node's answer reads changed (a policy): the next pass looks at every node."""
        self._everything = True

    def expect(self, name: str, deadline: float | None) -> None:
        """From `deadline` (epoch seconds) on, time alone may make the node due; None: never (or gone)."""
        if deadline is None:
            self._deadlines.pop(name, None)
            return
        known = self._deadlines.get(name)
        self._deadlines[name] = deadline
        if known is None or deadline < known:
            heapq.heappush(self._heap, (deadline, name))

    def changed(self, name: str, deadline: float | None) -> None:
        """`touch`, then `expect` the deadline, in one call: what each stored version of a node's
        GPUNode tells the index."""
        self.touch(name)
        self.expect(name, deadline)

    def keep(self, due: Iterable[str]) -> None:
        """The nodes found due on this pass: candidates again on the next, until one is found at rest."""
        self._kept = set(due)

    def take(self, now: float, lead: float) -> set[str] | None:
        """The candidates for a pass at `now` (epoch seconds), deadlines `lead` seconds early; None:
        every node. Nodes whose deadline came stay out of the heap until `expect` gives a new one."""
        everything, self._everything = self._everything, False
        candidates = self._touched | self._kept
        self._touched = set()
        heap = self._heap
        while heap and heap[0][0] - lead <= now:
            at, name = heapq.heappop(heap)
            current = self._deadlines.get(name)
            if current is None or current != at:
                if current is not None and current > at:
                    heapq.heappush(heap, (current, name))  # the deadline moved later: wait for it
                continue
            del self._deadlines[name]
            candidates.add(name)
        return None if everything else candidates

    def __len__(self) -> int:
        """Entries held (for the benchmark's memory per node): deadlines, heap, pending candidates."""
        return len(self._deadlines) + len(self._heap) + len(self._touched) + len(self._kept)
