"""Event handlers: thin adapters from watch events to the cache and the reconciler.

Nodes and GPUNodes, nearly all the events, come from our own watches
(`watches`, `watching.py`). Their handlers only observe: they update the
cache and ask for a pass over the node (`pass_queue`), which `passes` runs
off the event path. Policies and agent pods, a few events a minute, run their
passes in the handler. Those come from kopf, where only
`kopf.on.event` is used: it keeps no state on the objects (no finalizers, no
progress or last-handled annotations), and our own state lives in GPUNode
status and our Node annotations anyway. kopf's persistence settings are
nevertheless pointed at our CRDs (see `configure`) so nothing ever lands on
an object by accident.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import kopf

from gpuhealth_api import resources
from gpuhealth_operator.client import kube, latency
from gpuhealth_operator.decisions import model, policies
from gpuhealth_operator.ladder import stopping
from gpuhealth_operator.ladder.domain import domain_actions
from gpuhealth_operator.ladder.isolate import isolation_support
from gpuhealth_operator.ladder.repair import repair_permission
from gpuhealth_operator.runtime import reconciler, resync, watching
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import agent_pods, pass_queue

logger = logging.getLogger(__name__)

DELETED = "DELETED"


async def on_node(event: kopf.RawEvent, memo: context.Context, **_: Any) -> None:
    """A Node changed: cached, and a pass over it asked for (`passes`) where something we judge moved."""
    received = latency.now()
    memo.meters.events.labels("node").inc()
    body = event["object"]
    name = body.get("metadata", {}).get("name", "")
    if event["type"] == DELETED:  # also a Node that left this operator's pool (`--node-selector`)
        gone = memo.cache.node(name)
        memo.cache.remove_node(name)
        if memo.config.node_selector:
            memo.cache.remove_gpunode(name)
        memo.agent_pods.forget_node(name)
        if not memo.config.node_selector:
            # Its pods go (their deletions follow). A Node that only left the pool keeps its GPU pods
            # known: back in the pool, it must not look idle while they still run.
            memo.steps.check.pods.forget_node(name)
        memo.forget_node(name)
        memo.steps.repair.gone_nodes.add(name)  # its step Jobs go on the next tick (`orphan_jobs`)
        if gone is not None and gone.view.unschedulable:
            memo.passes.request(name, pass_queue.Ask("node", judge=False, wake=True))  # its place is free
        return
    before = memo.cache.node(name)
    after = memo.cache.put_node(body)
    release(body)
    if before is None and memo.config.node_selector and memo.cache.gpunode(name) is None:
        await fetch_gpunode(memo, name)  # its events were dropped while the Node was not in our pool
    # Kubelet (or kwok) heartbeats change the Node every few seconds; only what we judge matters.
    moved = before is None or before.view != after.view
    draining = name in memo.steps.drain  # an exclude label stops a running drain at once
    if moved or draining:
        ask = pass_queue.Ask(
            "node",
            judge=moved,
            stop_drains=draining,
            wake=before is not None and moved and frees_a_place(memo, before.view, after.view),
            received=received,
        )
        memo.passes.request(name, ask)


def frees_a_place(memo: context.Context, before: model.NodeView, after: model.NodeView) -> bool:
    """Whether a Node's change may free a budget place: it turned schedulable, or, unschedulable, it moved
    to another domain of a topology budget (the place in its old domain is free)."""
    if before.unschedulable and not after.unschedulable:
        return True
    if not (before.unschedulable and after.unschedulable) or before.labels == after.labels:
        return False
    domain_keys = {b.key for p in memo.cache.policies.values() for b in p.topology.budgets}
    return any(before.labels.get(k) != after.labels.get(k) for k in domain_keys)


def release(body: Mapping[str, Any]) -> None:
    """Drop what the cache has taken from an event's body (its status and managedFields), in place.

    kopf holds an event until its handler returns, and the handler then waits for the API
    server: in a start-up flood thousands of handlers wait at once, each holding its whole
    decoded body (~40 KB of objects for a GPUNode with managedFields). That was the
    operator's peak memory, and the heap keeps its peak (issue 14). What stays is what kopf
    and the other handlers read (kind, name, uid, labels, annotations).
    """
    if not isinstance(body, dict):
        return  # not a decoded watch event: nothing held to release
    body.pop("status", None)
    metadata = body.get("metadata")
    if isinstance(metadata, dict):
        metadata.pop("managedFields", None)


def in_pool(memo: context.Context, name: str) -> bool:
    """Whether a GPUNode is this operator's: its Node is cached (with `--node-selector`, only the pool's)."""
    return not memo.config.node_selector or memo.cache.node(name) is not None


async def fetch_gpunode(memo: context.Context, name: str) -> None:
    """Read the GPUNode of a Node that just joined the pool into the cache (none yet: nothing to do)."""
    try:
        body = await memo.client.get(f"{resync.GPUNODES_PATH}/{name}")
    except kube.ApiError as error:
        if not error.not_found:
            logger.warning("could not read GPUNode %s (its next report brings it): %s", name, error)
        return
    if memo.cache.node(name) is not None:
        memo.cache.put_gpunode(body, memo.clock())


async def on_gpunode(event: kopf.RawEvent, memo: context.Context, **_: Any) -> None:
    received = latency.now()
    memo.meters.events.labels("gpunode").inc()
    body = event["object"]
    name = body.get("metadata", {}).get("name", "")
    if not in_pool(memo, name):
        return  # another pool's: its operator judges it
    if event["type"] == DELETED:
        memo.cache.remove_gpunode(name)
        memo.forget_node(name)
        return
    before = memo.cache.gpunode(name)
    after = memo.cache.put_gpunode(body, memo.clock())
    release(body)
    if before is None or before.resource_version != after.resource_version:
        memo.passes.request(name, pass_queue.Ask("gpunode", received=received))


async def on_agent_pod(event: kopf.RawEvent, memo: context.Context, **_: Any) -> None:
    """An agent pod changed: a node whose agent turned Ready or NotReady is judged again.

    The selector matched its labels; only the agent DaemonSet's pods count (`agent_pods.is_agent`).

    Turning NotReady changes no verdict at once (`decisions.liveness` gives a grace); the timer
    judges such a node every tick until then.
    """
    now = memo.clock()
    body = event["object"]
    if not agent_pods.is_agent(body, memo.config.agent_pod_namespace):
        return  # the agent's labels on a pod of someone else's (issue 24): not our agent
    if event["type"] == DELETED:
        node = memo.agent_pods.deleted(body, now)
    else:
        node = memo.agent_pods.observe(body, now)
    if node is not None and memo.cache.gpunode(node) is not None:
        await reconciler.reconcile_node(memo, node, "agent-pod")


def store_policy(memo: context.Context, body: Mapping[str, Any]) -> model.Policy | None:
    """Parse and cache a policy; the policy if it is new or changed, else None."""
    meta = body.get("metadata", {})
    name = meta.get("name", "")
    generation = int(str(meta.get("generation") or 0))
    memo.breakers.note_reset(name, body)
    repair_permission.observe(memo, name, body)  # a refusal said by a process before us
    memo.steps.domain.note_status(name, body)
    try:
        policy = policies.parse_policy(name, generation, body.get("spec") or {})
        policy = dataclasses.replace(policy, created=str(meta.get("creationTimestamp") or ""))
    except ValueError as error:
        logger.warning("policy %s is invalid and is not applied: %s", name, error)
        memo.cache.reject_policy(name, generation, str(error))
        return None
    return policy if memo.cache.put_policy(policy) else None


async def on_policy(event: kopf.RawEvent, memo: context.Context, **_: Any) -> None:
    body = event["object"]
    name = body.get("metadata", {}).get("name", "")
    if event["type"] == DELETED:
        await reconciler.policy_deleted(memo, name)
        await domain_actions.evaluate(memo, memo.clock())  # the marks only it wanted go
        return
    policy = store_policy(memo, body)
    await stopping.stop_drains(memo)  # dry run (or an invalid spec) stops the policy's drains at once
    current = memo.cache.policies.get(name)
    if current is not None:  # each term's start (kopf lists it), a change, an answer not yet known
        await isolation_support.prepare(memo, current)  # does the cluster act on DeviceTaintRules?
    if policy is None:
        if name in memo.steps.domain.states and name not in memo.cache.policies:
            await domain_actions.evaluate(memo, memo.clock())  # invalid now: its marks go
        return
    for node in [r.view.name for r in memo.cache.nodes.values() if policies.selects(policy, r.view)]:
        await reconciler.reconcile_node(memo, node, "policy")
    await domain_actions.evaluate(memo, memo.clock())


async def login(memo: context.Context, **_: Any) -> kopf.ConnectionInfo:
    """kopf's watches use the same credentials as our own client."""
    assert isinstance(memo.client, kube.Kube), "kopf logs in only where the operator talks HTTP"
    credentials = memo.client.credentials
    return kopf.ConnectionInfo(
        server=credentials.server,
        ca_path=credentials.ca_path,
        insecure=credentials.insecure,
        certificate_path=credentials.certificate_path,
        private_key_path=credentials.private_key_path,
        token=credentials.token,
        scheme="Bearer" if credentials.token else None,
    )


def register(registry: kopf.OperatorRegistry, agent_pod_selector: str = "") -> None:
    """Our kopf handlers: policies, and agent pods only with a selector (see `configure`). Nodes and
    GPUNodes are watched by `watches`."""
    kopf.on.login(registry=registry)(login)
    kopf.on.event(resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, registry=registry)(on_policy)
    if agent_pod_selector:
        kopf.on.event("", "v1", "pods", registry=registry)(on_agent_pod)


def watches(
    memo: context.Context, relisted: Callable[[], None], since: Mapping[str, str] | None = None
) -> list[watching.Watch]:
    """The Node and GPUNode watches (`watching`: most of the operator's events, kept out of kopf);
    `relisted` is told when one lists its kind again after a gap. Each starts from its kind's version in
    `since` (the term's priming listed it into the cache just now), or with a LIST of its own."""
    since = since or {}
    client = memo.client
    assert isinstance(client, kube.Kube), "the watches run where the operator talks HTTP"

    async def node_event(event: watching.Event) -> None:
        await on_node(cast(kopf.RawEvent, event), memo)

    async def gpunode_event(event: watching.Event) -> None:
        await on_gpunode(cast(kopf.RawEvent, event), memo)

    return [
        # The API server filters: a Node that stops matching arrives as DELETED (see `on_node`).
        watching.Watch(
            client,
            resync.NODES_PATH,
            node_event,
            label_selector=memo.config.node_selector,
            relisted=relisted,
            since=since.get(resync.NODES_PATH),
        ),
        watching.Watch(
            client,
            resync.GPUNODES_PATH,
            gpunode_event,
            relisted=relisted,
            since=since.get(resync.GPUNODES_PATH),
        ),
    ]


class EventsOnlyDiffBase(kopf.DiffBaseStorage):
    """kopf's diff base for an operator with event handlers only: nothing to build, nothing to read.

    kopf fetches, builds and diffs the "essence" of every object on every watch
    event, and uses it only for changing handlers (create/update/delete/resume)
    and daemons, which this operator does not register (`register`, and a test
    holds the registry to that). The essence was a copy of each body's spec,
    labels and annotations at every Node heartbeat: ~5 % of the operator's CPU
    at rest over 5,000 nodes. Should a stateful handler ever be added, this
    storage must go with it (it stores nothing either, so nothing lands on a Node).
    """

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[kopf.FieldSpec] | None = None
    ) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


QUEUE_IDLE_SECONDS = 0.1


def configure(settings: kopf.OperatorSettings, agent_pod_selector: str = "") -> None:
    """kopf settings for an operator that leaves no trace on objects it does not own."""
    if agent_pod_selector:
        # Filtered by the API server: the operator hears of agent pods only, never of the workloads
        # (and of pods that copy their labels: `on_agent_pod` ignores those).
        settings.watching.label_selectors["", "v1", "pods"] = agent_pod_selector
    # Leader election is ours (a Lease); kopf's peering would need its own CRDs and RBAC.
    settings.peering.standalone = True
    # Event handlers persist nothing; should a stateful handler ever be added, its progress goes to the
    # status of our own CRDs, never into annotations (Nodes are watched, and they are not ours).
    settings.persistence.progress_storage = kopf.StatusProgressStorage(field="status.kopf.progress")
    settings.persistence.diffbase_storage = EventsOnlyDiffBase()
    # Our Events are deliberate and deduplicated; kopf's per-handler log Events would be noise.
    settings.posting.enabled = False
    settings.watching.server_timeout = 300
    # kopf lists each kind at start (and after a 410 Gone) in one response unless told to page: at
    # 5,000 GPUNodes that is ~65 MB of JSON decoded at once, most of the operator's peak memory.
    settings.watching.chunk_size = kube.LIST_PAGE_SIZE
    # kopf's worker for an object keeps that object's last event (the whole body) until it has been
    # idle this long: at the default 5 s, a cold start over 1,000 nodes holds ~38 MiB of bodies at once.
    settings.queueing.idle_timeout = QUEUE_IDLE_SECONDS
    settings.scanning.disabled = True
