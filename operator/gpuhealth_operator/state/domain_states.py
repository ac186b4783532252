"""The policies' degraded topology domains at run time, kept between judgements.

`decisions.domains` decides; this module keeps each policy's degraded
domains between passes (their `since` and recovery clocks), and what each
selected node looked like to them when last judged (`changed`), so a
node's watch event asks for a judgement of the domains only when something
a domain counts changed: its health class under the policy, or its domain
label values. An agent's every report of a healthy node costs one tuple
comparison, not a pass over the policy's nodes.

What must survive a restart is in the cluster: the degraded domains with
their clocks are the policy's `status.topology.degraded[]`, read back when
the policy is first seen (`note_status`), so the recovery hold goes on
where it stood and a domain that stayed degraded is not announced twice.
The marks themselves are on the Nodes.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import Any

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import domains, model

STATUS_FIELD = "topology"
"""Policy status: {degraded: [...], atBudget: [...]}."""

Seen = tuple[str, tuple[str | None, ...]]
"""What a domain counts of one node under one policy: its health class and its domain label values."""


@dataclasses.dataclass
class DomainStates:
    """Each policy's degraded domains; every collection is changed in place (kopf shares the memo)."""

    states: dict[str, dict[domains.DomainKey, domains.DomainState]] = dataclasses.field(default_factory=dict)
    """policy → its degraded domains as last judged."""

    recorded: dict[str, object] = dataclasses.field(default_factory=dict)
    """policy → `status.topology.degraded` as the cluster held it when the policy was first seen, until
    its first judgement takes it up."""

    seen: dict[tuple[str, str], Seen] = dataclasses.field(default_factory=dict)
    """(policy, node) → what its domains last counted of the node (`changed`)."""

    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    """One judgement (and its writes) at a time: each transition is said once, each mark written once."""

    def note_status(self, policy: str, body: Mapping[str, Any]) -> None:
        """Read a policy's recorded degraded domains, once per process (before its first judgement)."""
        if policy in self.states or policy in self.recorded:
            return
        topology = (body.get("status") or {}).get(STATUS_FIELD)
        if isinstance(topology, Mapping) and topology.get("degraded"):
            self.recorded[policy] = topology["degraded"]

    def previous(self, policy: model.Policy) -> dict[domains.DomainKey, domains.DomainState]:
        """The policy's degraded domains as last judged, or as its status recorded them."""
        known = self.states.get(policy.name)
        if known is not None:
            return known
        return domains.from_status(self.recorded.pop(policy.name, None), policy.topology.domains)

    def changed(
        self, policy: model.Policy, node: str, health: vocabulary.Health | None, labels: Mapping[str, str]
    ) -> bool:
        """Whether what the policy's domains count of `node` changed since last asked (and remember it).

        `health` None: the policy does not select the node (any more).
        """
        key = (policy.name, node)
        if health is None:
            return self.seen.pop(key, None) is not None
        now: Seen = (
            _health_class(health),
            tuple(domains.domain_of(labels, d.key) for d in policy.topology.domains),
        )
        if self.seen.get(key) == now:
            return False
        self.seen[key] = now
        return True

    def status(self, policy: str, limit: int) -> list[dict[str, object]]:
        return domains.to_status(self.states.get(policy, {}), limit)

    def forget_node(self, name: str) -> None:
        for key in [k for k in self.seen if k[1] == name]:
            del self.seen[key]

    def forget_policy(self, name: str) -> None:
        self.states.pop(name, None)
        self.recorded.pop(name, None)
        for key in [k for k in self.seen if k[0] == name]:
            del self.seen[key]


def _health_class(health: vocabulary.Health) -> str:
    """What a domain tells apart: Unhealthy, Unknown, and everything else."""
    if health in (vocabulary.Health.UNHEALTHY, vocabulary.Health.UNKNOWN):
        return health.value
    return "Other"
