"""The ladder steps' memories, one object per step, held by the term's `Context` as `ctx.steps`.

Each step's package owns its memory class (`ladder/<step>/memory.py`): what that step remembers
between passes, with `forget_verdicts` (no policy selects the node any more), `forget_node` (the
node is gone) and `forget_policy` (the policy is gone). `Memories` walks them all, so a memory
added here is forgotten with the others; `ladder/steps.py` registers the steps' timer sweeps.

A step that reads another step's memory reads it through one of the typed read-only views below
(`isolated`, `repairs`, `cordons_unknown`, `draining`), never through the other step's class.

Only memory modules are imported here: `shared.context` imports this module (the one exception to
the package layers, listed in pyproject.toml), and a memory module imports nothing above `verdict`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Iterator, Mapping
from typing import Any, Protocol

from gpuhealth_operator.decisions import isolation
from gpuhealth_operator.ladder.check.memory import CheckMemory
from gpuhealth_operator.ladder.cordon.memory import CordonMemory
from gpuhealth_operator.ladder.domain.memory import DomainMemory
from gpuhealth_operator.ladder.drain.memory import DrainMemory
from gpuhealth_operator.ladder.drill.memory import DrillMemory
from gpuhealth_operator.ladder.isolate.memory import IsolateMemory
from gpuhealth_operator.ladder.new_nodes.memory import NewNodesMemory
from gpuhealth_operator.ladder.repair.memory import RepairMemory
from gpuhealth_operator.state.judged import NODE, POLICY, drop


class Memory(Protocol):
    """What every step's memory answers."""

    def forget_verdicts(self, name: str) -> None: ...
    def forget_node(self, name: str) -> None: ...
    def forget_policy(self, name: str) -> None: ...


@dataclasses.dataclass(eq=False)
class DryRunMemory:
    """What a dry-run policy said it would do (`remediation`, for every step of the ladder)."""

    said: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    """(policy, node) → the last DryRun message, so it is said once per change."""

    def forget_verdicts(self, name: str) -> None:
        drop(self.said, name, NODE)

    def forget_node(self, name: str) -> None:
        self.forget_verdicts(name)

    def forget_policy(self, name: str) -> None:
        drop(self.said, name, POLICY)


@dataclasses.dataclass(eq=False)
class Memories:
    """One field per step that remembers: a new step's memory is one line here."""

    isolate: IsolateMemory = dataclasses.field(default_factory=IsolateMemory)
    dry_run: DryRunMemory = dataclasses.field(default_factory=DryRunMemory)
    repair: RepairMemory = dataclasses.field(default_factory=RepairMemory)
    cordon: CordonMemory = dataclasses.field(default_factory=CordonMemory)
    drain: DrainMemory = dataclasses.field(default_factory=DrainMemory)
    drill: DrillMemory = dataclasses.field(default_factory=DrillMemory)
    domain: DomainMemory = dataclasses.field(default_factory=DomainMemory)
    new_nodes: NewNodesMemory = dataclasses.field(default_factory=NewNodesMemory)
    check: CheckMemory = dataclasses.field(default_factory=CheckMemory)

    @classmethod
    def create(cls, eviction_concurrency: int) -> Memories:
        return cls(drain=DrainMemory(eviction_concurrency))

    def each(self) -> Iterator[tuple[str, Memory]]:
        """Every step's memory, by its field's name, in the order above."""
        for field in dataclasses.fields(self):
            yield field.name, getattr(self, field.name)

    def forget_verdicts(self, name: str) -> None:
        for _, memory in self.each():
            memory.forget_verdicts(name)

    def forget_node(self, name: str) -> None:
        for _, memory in self.each():
            memory.forget_node(name)

    def forget_policy(self, name: str) -> None:
        for _, memory in self.each():
            memory.forget_policy(name)

    def __post_init__(self) -> None:
        # The read-only views other steps and judging read (typed so that a reader cannot change them).
        # Bound once, not looked up per read (a pass reads them several times): every memory's
        # collections are changed in place, never replaced, so a view always shows the memory.
        self.isolated: Mapping[tuple[str, str], isolation.NodeState] = self.isolate.isolations
        """(policy, node) → its GPUs' isolation (`IsolateMemory.isolations`)."""
        self.repairs: Mapping[str, list[dict[str, Any]]] = self.repair.history
        """node → its repair history in memory (`RepairMemory.history`)."""
        self.cordons_unknown: Container[str] = self.cordon.unknown
        """The nodes whose cordon's answer was lost (`CordonMemory.unknown`)."""
        self.draining: Container[str] = self.drain.tasks
        """The nodes with a drain kept in this process (`name in DrainMemory`, its tasks' keys)."""
