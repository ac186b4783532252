"""IsolateGPU's memory: what the cluster supports, each node's GPUs' isolation, what was last listed.

`ctx.steps.isolate`; judging and the cordon read the isolations through `Memories.isolated`.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses

from gpuhealth_operator.client import kube
from gpuhealth_operator.decisions import device_taints, isolation
from gpuhealth_operator.state import recent
from gpuhealth_operator.state.judged import NODE, POLICY, drop


@dataclasses.dataclass(eq=False)
class IsolateMemory:
    support: dict[str, isolation.Support] = dataclasses.field(default_factory=dict)
    """policy → whether the cluster acts on DeviceTaintRules, probed for its generation (`isolating`)."""

    isolations: dict[tuple[str, str], isolation.NodeState] = dataclasses.field(default_factory=dict)
    """(policy, node) → its GPUs' isolation: the last decision, the rules in place, the overrides."""

    rules_read: recent.Recent[tuple[str, str], list[kube.JsonObject]] = dataclasses.field(
        default_factory=recent.Recent
    )
    """(policy, DeviceTaintRule API version) → the policy's rules of nodes, as last listed (`isolating`)."""

    devices_read: recent.Recent[str, dict[str, device_taints.Device]] = dataclasses.field(
        default_factory=recent.Recent
    )
    """node → its DRA devices by GPU UUID, from its ResourceSlices as last listed (`isolating`)."""

    discovery: recent.Recent[str, isolation.Support] = dataclasses.field(
        default_factory=lambda: recent.Recent(300.0)
    )
    """What discovery alone says of DeviceTaintRules (a served version changes only with an API server
    restart), for dry runs, drills and deleted policies' rules: never a probe's answer (`isolating`).
    Cluster-wide: no node's or policy's."""

    locks: collections.defaultdict[str, asyncio.Lock] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(asyncio.Lock)
    )
    """policy → one isolating node at a time, so the GPU budget is counted before it is spent."""

    def forget_verdicts(self, name: str) -> None:
        drop(self.isolations, name, NODE)
        self.devices_read.drop(name)

    def forget_node(self, name: str) -> None:
        self.forget_verdicts(name)

    def forget_policy(self, name: str) -> None:
        drop(self.isolations, name, POLICY)
        self.support.pop(name, None)
        self.rules_read.drop_where(lambda key: key[0] == name)
        lock = self.locks.get(name)
        if lock is not None and not lock.locked():
            del self.locks[name]
