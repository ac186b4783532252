"""Judging's memory: the straggler scores and their windows, and what a pass at rest judged from.

Held by the term's `Context` as `ctx.judging`; emptied of a node or a policy by its `forget_*`,
which `Context.forget_verdicts` / `forget_node` / `forget_policy` call. Nothing here survives a
restart, and nothing needs to: a new term scores the cohorts and judges every node afresh.

Plain data of the state package, not of `verdict/`: the context that carries it sits below judging,
and a memory it holds from a layer above would be an import pointing up (issue 46).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import MutableMapping
from typing import Any

from gpuhealth_operator.decisions import model, stragglers
from gpuhealth_operator.state import cohorts

Key = tuple[str, str]
"""(policy, node)."""

Samples = stragglers.Samples


@dataclasses.dataclass(frozen=True, slots=True)
class Rest:
    """What a pass that ended at rest judged a node from (`resting`)."""

    node: int
    """The Node version's `reading` (`cache.NodeRecord.reads_like`: a kubelet's heartbeat keeps it)."""
    reading: int
    """The GPUNode version's `reading` (`cache.GPUNodeRecord.reads_like`)."""
    judged: tuple[tuple[model.Policy, object, object], ...]
    """Each selecting policy, in name order, with the node's straggler score under it and its agent pod."""
    repairs: object
    """The node's repair history in memory (`repair_history`: replaced, never changed in place)."""
    links: tuple[int | None, ...] = ()
    """The links up its GPUs' cohorts expected (`trends.Trends.expectations`): other nodes move them."""


@dataclasses.dataclass(frozen=True, slots=True)
class Selection:
    """The policies that selected a Node version, as `judging.selecting_policies` last worked them out."""

    view: model.NodeView
    """The Node version's view, matched against the policies (the same object: the same labels)."""
    every: tuple[model.Policy, ...]
    """Every policy of the cache then, in name order (the same objects: the same selectors)."""
    selecting: tuple[model.Policy, ...]
    """Those of them that select it."""


def drop(mapping: MutableMapping[Key, Any], name: str, position: int) -> None:
    """Delete, in place, every (policy, node) key whose part at `position` is `name`."""
    for key in [k for k in mapping if k[position] == name]:
        del mapping[key]


POLICY, NODE = 0, 1
"""Positions in a (policy, node) key."""


@dataclasses.dataclass(eq=False)
class JudgingMemory:
    stragglers: dict[Key, model.StragglerScore] = dataclasses.field(default_factory=dict)
    """(policy, node) → straggler score from the latest cohort pass."""

    straggler_samples: collections.defaultdict[Key, Samples] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(stragglers.Samples)
    )
    """(policy, node) → its recent z-scores, the window a sustained Straggler is judged on."""

    straggler_cohorts: cohorts.Cohorts = dataclasses.field(default_factory=cohorts.Cohorts)
    """The straggler cohorts as the last tick left them: a tick works on the members that changed."""

    resting: dict[str, Rest] = dataclasses.field(default_factory=dict)
    """node → what the last pass over it judged it from, if that pass left it at rest (`resting`)."""

    judged: dict[Key, tuple[model.NodeVerdict, tuple[object, ...]]] = dataclasses.field(default_factory=dict)
    """(policy, node) → its latest verdict (`ctx.verdicts`) with what it was judged from, weakly held where
    it can be (`judging`): the same inputs again, the same verdict, not judged twice. Judging's own memo,
    read and written by judging alone, so its check is no call into the context (issue 46)."""

    selection: Selection | None = None
    """The last node's selection (`Selection`): one node's, so a pass asks its policies' selectors once
    however often it judges again, and memory holds no more than one node's."""

    def forget_verdicts(self, name: str) -> None:
        if self.selection is not None and self.selection.view.name == name:
            self.selection = None
        self.resting.pop(name, None)
        drop(self.judged, name, NODE)
        drop(self.stragglers, name, NODE)
        drop(self.straggler_samples, name, NODE)

    def forget_node(self, name: str) -> None:
        self.forget_verdicts(name)

    def forget_policy(self, name: str) -> None:
        self.selection = None
        self.resting.clear()  # what passes judged under it: every node it selected is judged again
        drop(self.judged, name, POLICY)
        drop(self.stragglers, name, POLICY)
        drop(self.straggler_samples, name, POLICY)
