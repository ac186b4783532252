"""Repair's memory: the repair history not yet written, Jobs seen finished, tokens, what was said.

`ctx.steps.repair`; the verdict reads the history through `Memories.repairs`, new-node validation
(above repair) holds its places of maxConcurrent in `validations`.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from gpuhealth_operator.decisions import repair
from gpuhealth_operator.state import recent


@dataclasses.dataclass(eq=False)
class RepairMemory:
    history: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    """node → its GPUNode `status.repairs[]` as this process last made it (`repairing`), written with
    the node's next status; absent: the status as stored is the history."""

    finished_seen: dict[str, tuple[str, datetime.datetime]] = dataclasses.field(default_factory=dict)
    """node → (its repair Job, when this process first saw that Job finished, its own clock): a step's
    effect is judged from reports first seen after it (`repair.observe_step`), never from the Job's
    completionTime (another machine's clock). Lost on a restart: the new process's sighting counts."""

    validations: set[str] = dataclasses.field(default_factory=set)
    """Nodes whose new-node validation Job this process created or saw (`new_nodes`): they hold places
    of repair maxConcurrent with the repairs (`reading.holders`). Kept when a Node is forgotten: a
    deleted node's Job is still to be deleted."""

    tokens: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    """node → (SHA-256, token) of the repair Job token this process made last (`repairing`): the Node holds
    only the hash; a restarted process makes a new token before it creates a Job."""

    busy_said: set[str] = dataclasses.field(default_factory=set)
    """Nodes whose repair waits for workload pods to go and said so (`outcomes.say_busy`, once per wait)."""

    waiting: set[str] = dataclasses.field(default_factory=set)
    """Nodes whose repair waits for maxConcurrent and said so (once per wait; only the policy that
    cordoned a node repairs it, so one wait per node). A wait said by an earlier process is read from
    the node's stored status (`reading.say_waiting`)."""

    refused: dict[str, repair.Refused] = dataclasses.field(default_factory=dict)
    """policy → its last repair Job create the Job API refused (`repair_permission`)."""

    permitted: set[str] = dataclasses.field(default_factory=set)
    """Policies whose repair Job was created since this process began (`repair_permission`)."""

    gone_nodes: set[str] = dataclasses.field(default_factory=set)
    """Nodes deleted since the timer's last tick: their step Jobs are deleted on it (`orphan_jobs`).
    Kept when a Node is forgotten: that is when it is added."""

    templates: recent.Recent[str, dict[str, dict[str, Any]]] = dataclasses.field(
        default_factory=lambda: recent.Recent(30.0)
    )
    """The repair Job templates as last read (one key: the ConfigMap, or the packaged file).
    Cluster-wide: no node's or policy's."""

    def forget_verdicts(self, name: str) -> None:
        """A node no policy selects keeps its repair memory: a cycle of it may still run."""

    def forget_node(self, name: str) -> None:
        self.history.pop(name, None)
        self.finished_seen.pop(name, None)
        self.waiting.discard(name)
        self.tokens.pop(name, None)
        self.busy_said.discard(name)

    def forget_policy(self, name: str) -> None:
        self.refused.pop(name, None)
        self.permitted.discard(name)
