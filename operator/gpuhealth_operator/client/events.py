"""Kubernetes Events on Nodes, deduplicated: one object per (node, reason, message).

The Event's name is derived from what it says, so a repeat (even after an
operator restart) finds the existing object and bumps its `count` and
`lastTimestamp` instead of creating a new one. The reconciler emits only on
transitions; this module makes the rare repeat (kopf's at-least-once
delivery, a restart mid-transition) cheap and visible rather than spammy.

Lifecycle announcements (NodeCordoned, NodeDrained) are exactly-once instead
(`Recorder.announce`): named from the identity of what they announce (the
cordon), so a later term that announces again finds the Event and stops.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import logging

from gpuhealth_api import resources, timestamps
from gpuhealth_operator.client import kube
from gpuhealth_operator.decisions import text
from gpuhealth_operator.state import cache

COMPONENT = "gpu-health-operator"
NAMESPACE = "default"
"""Where Node Events live (cluster-scoped objects' Events go to `default`, as the kubelet's do)."""

MAX_REMEMBERED = 10_000
"""Events whose count this process remembers; beyond that it starts over (the API server keeps the truth)."""

NORMAL = "Normal"
WARNING = "Warning"

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Subject:
    """The Node an Event is about, and the GPUNode it relates to."""

    node: str
    node_uid: str | None = None
    gpunode_uid: str | None = None
    kind: str = "Node"
    """Node, or GPUHealthPolicy for an Event about a whole policy (`node` is then the policy's name)."""


def policy_subject(name: str) -> Subject:
    """A GPUHealthPolicy as an Event's subject (RemediationPaused)."""
    return Subject(node=name, kind=resources.POLICY_KIND)


def subject(nodes: cache.ClusterCache, name: str) -> Subject:
    """The Node `name` as an Event's subject, with the uids the cache knows (none once it is gone)."""
    record, gpunode = nodes.nodes.get(name), nodes.gpunodes.get(name)
    return Subject(
        node=name, node_uid=record.uid if record else None, gpunode_uid=gpunode.uid if gpunode else None
    )


def event_name(node: str, reason: str, message: str) -> str:
    digest = hashlib.sha256(f"{reason}\x00{message}".encode()).hexdigest()[:16]
    return f"{node}.gpuhealth.{digest}"


def announcement_name(node: str, reason: str, identity: str) -> str:
    """The name of the one Event that announces `identity` (a cordon, say): whatever its message says."""
    digest = hashlib.sha256(f"{reason}\x00announce\x00{identity}".encode()).hexdigest()[:16]
    return f"{node}.gpuhealth.{digest}"


def _now() -> str:
    return timestamps.render(datetime.datetime.now(datetime.UTC))


@dataclasses.dataclass
class Recorder:
    """Posts Events for one operator instance; remembers counts of what it posted."""

    client: kube.Client
    instance: str
    """reportingInstance: this replica's identity."""
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    """Event name → the count we last wrote; bounded (MAX_REMEMBERED), a forgotten one is re-read on 409."""

    async def emit(self, subject: Subject, reason: str, message: str, type_: str = NORMAL) -> None:
        """Post the Event, or bump the count of the identical one already posted. Never raises.

        The message is escaped and cut to EVENT_MESSAGE_MAX first: it may quote agent-supplied strings.
        """
        message = text.bounded(message, text.EVENT_MESSAGE_MAX)
        name = event_name(subject.node, reason, message)
        # Every decision is an Event; logging it too lets an incident be rebuilt from the logs alone.
        log = logger.warning if type_ != NORMAL else logger.info
        log("node %s: %s: %s", subject.node, reason, message)
        try:
            if name in self.counts:
                await self._bump(name, self.counts[name] + 1)
                return
            try:
                await self.client.create(
                    f"/api/v1/namespaces/{NAMESPACE}/events",
                    self._body(subject, name, reason, message, type_),
                )
                if len(self.counts) >= MAX_REMEMBERED:
                    self.counts.clear()
                self.counts[name] = 1
            except kube.ApiError as error:
                if not error.conflict:
                    raise
                existing = await self.client.get(f"/api/v1/namespaces/{NAMESPACE}/events/{name}")
                await self._bump(name, int(existing.get("count") or 1) + 1)
        except kube.ApiError as error:
            # An Event is a report, not a decision: losing one must not stop the action it reports.
            self.counts.pop(name, None)
            logger.warning("could not post Event %s on node %s: %s", reason, subject.node, error)

    async def announce(
        self, subject: Subject, reason: str, message: str, identity: str, type_: str = NORMAL
    ) -> bool:
        """Post the Event that announces `identity`, exactly once: one that exists already (409) was said.

        Named from (node, reason, identity), not from the message, so a later term (whose
        wording may differ) finds it. True once the Event exists; False when it could not
        be posted (the caller announces again later). Never raises.
        """
        message = text.bounded(message, text.EVENT_MESSAGE_MAX)
        name = announcement_name(subject.node, reason, identity)
        log = logger.warning if type_ != NORMAL else logger.info
        log("node %s: %s: %s", subject.node, reason, message)
        try:
            await self.client.create(
                f"/api/v1/namespaces/{NAMESPACE}/events", self._body(subject, name, reason, message, type_)
            )
        except kube.ApiError as error:
            if error.conflict:
                return True  # announced before (by this process or an earlier term): never twice
            logger.warning("could not post Event %s on node %s: %s", reason, subject.node, error)
            return False
        return True

    async def emit_on(
        self, nodes: cache.ClusterCache, name: str, reason: str, message: str, type_: str = NORMAL
    ) -> None:
        """`emit` about the Node `name` as the cache knows it (`subject`), in one call."""
        await self.emit(subject(nodes, name), reason, message, type_)

    async def announce_on(  # noqa: PLR0917 - `announce`'s arguments, the subject as the cache knows it
        self,
        nodes: cache.ClusterCache,
        name: str,
        reason: str,
        message: str,
        identity: str,
        type_: str = NORMAL,
    ) -> bool:
        """`announce` about the Node `name` as the cache knows it (`subject`), in one call."""
        return await self.announce(subject(nodes, name), reason, message, identity, type_)

    async def _bump(self, name: str, count: int) -> None:
        try:
            await self.client.patch(
                f"/api/v1/namespaces/{NAMESPACE}/events/{name}",
                {"count": count, "lastTimestamp": _now()},
            )
            self.counts[name] = count
        except kube.ApiError as error:
            if not error.not_found:
                raise
            # The Event expired (the API server's TTL): forget it, the next emit recreates it.
            self.counts.pop(name, None)

    def _body(self, subject: Subject, name: str, reason: str, message: str, type_: str) -> kube.JsonObject:
        now = _now()
        involved: kube.JsonObject = {"apiVersion": "v1", "kind": "Node", "name": subject.node}
        if subject.kind != "Node":
            involved = {"apiVersion": resources.API_VERSION, "kind": subject.kind, "name": subject.node}
        if subject.node_uid:
            involved["uid"] = subject.node_uid
        related: kube.JsonObject = {
            "apiVersion": resources.API_VERSION,
            "kind": resources.GPUNODE_KIND,
            "name": subject.node,
        }
        if subject.gpunode_uid:
            related["uid"] = subject.gpunode_uid
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "involvedObject": involved,
            **({"related": related} if subject.kind == "Node" else {}),
            "reason": reason,
            "message": message,
            "type": type_,
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance[:128],
        }
