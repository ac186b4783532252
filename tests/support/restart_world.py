"""A scripted story on the in-memory cluster, run by an operator that can be restarted between any two of
its events, and what a user sees at its end (tests/unit/operator/test_restart_anywhere.py).

"Restart" is a new process: every module-level store of the operator emptied as a fresh import has it
(`fresh_process`, checked complete by the test), a new `Context` (cache, locks, memos, Event counts, the
timer's full-pass schedule), primed from the cluster with the operator's own `priming.prime`, the
policies handed to `handlers.on_policy` as kopf's first listing does, then the timer's first pass (a full
one, as `ticker.run` starts). Between the story's events the world plays the watches: every Node,
GPUNode and policy whose resourceVersion moved since the operator last saw it (its own writes too)
arrives as its watch event, and the passes and drains those ask for run to the end.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import dataclasses
import datetime
import itertools
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import kopf

import gpunode_facts
import operator_context
from gpuhealth_api import faults, keys, resources
from gpuhealth_operator.client import kube
from gpuhealth_operator.decisions import policies, straggler_scores, times, trends, verdicts
from gpuhealth_operator.runtime import handlers, passes, priming, resync, ticker
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import breakers, compaction, records
from gpuhealth_sim.backtest import memcluster
from gpuhealth_sim.fleet import dra

T0 = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)
GPUS = 8
DRA_VERSION = "v1beta2"

# --- a new process ---------------------------------------------------------------------------------------

RESET: dict[str, Callable[[], object]] = {
    "gpuhealth_operator.decisions.verdicts._PLANS": verdicts._PLANS.clear,
    "gpuhealth_operator.decisions.policies._RULE_XIDS": policies._RULE_XIDS.clear,
    "gpuhealth_operator.decisions.trends._FIRST": trends._FIRST.clear,
    "gpuhealth_operator.decisions.trends._TRACKS": trends._TRACKS.table.clear,
    "gpuhealth_operator.decisions.straggler_scores._RATIOS": straggler_scores._RATIOS.table.clear,
    "gpuhealth_operator.decisions.times._parse": times._parse.cache_clear,
    "gpuhealth_operator.decisions.times.render": times.render.cache_clear,
    "gpuhealth_operator.state.breakers._limit": breakers._limit.cache_clear,
    "gpuhealth_operator.state.records._READINGS": lambda: setattr(records, "_READINGS", itertools.count(1)),
    "gpuhealth_operator.state.compaction.SHARED": compaction.SHARED.table.clear,
    "gpuhealth_api.faults._PATHS": faults._PATHS.clear,
    "gpuhealth_api.faults._MAPPING_TYPES": lambda: faults._MAPPING_TYPES.intersection_update({dict}),
}
"""Every module-level store the operator writes at run time, by its dotted name, and how a new process
has it. Test-only: the product keeps what survives a restart in the cluster, and these hold none of it
(test_restart_anywhere walks the modules and fails on a store missing here)."""


def fresh_process() -> None:
    for reset in RESET.values():
        reset()


# --- the cluster -----------------------------------------------------------------------------------------


class Cluster(memcluster.MemoryKube):
    """The in-memory cluster plus what priming and a restart need of an API server: LISTs of Nodes,
    GPUNodes and policies, and 409 for an Event whose name exists (the recorder then bumps its count)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        super().__init__(clock=clock)

    async def request(self, method: str, path: str, **options: Any) -> dict[str, Any]:
        body = options.get("body")
        lists = {
            resync.NODES_PATH: self.nodes,
            resync.GPUNODES_PATH: self.gpunodes,
            resync.POLICIES_PATH: self.policies,
        }
        if method == "GET" and path in lists:
            self.requests_total += 1
            items = [copy.deepcopy(v) for _, v in sorted(lists[path].items())]
            return {"items": items, "metadata": {"resourceVersion": str(self._version)}}
        if method == "POST" and path == memcluster.EVENTS:
            assert isinstance(body, dict)
            if body["metadata"]["name"] in self.events:
                self.requests_total += 1
                raise kube.ApiError(409, "AlreadyExists", f"events {body['metadata']['name']} already exists")
        return await super().request(method, path, **options)


# --- the world: cluster, clock, the operator process -------------------------------------------------------


@dataclasses.dataclass
class World:
    """One story's cluster and clock, and the operator process acting on it (`start_process`)."""

    now: datetime.datetime = T0
    cluster: Cluster = dataclasses.field(init=False)
    ctx: context.Context = dataclasses.field(init=False)
    seen: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    """(kind, name) → the resourceVersion the operator's watches last delivered."""
    _gone_bodies: dict[tuple[str, str], dict[str, Any]] = dataclasses.field(default_factory=dict)
    """(kind, name) → the last body of an object deleted, for its DELETED watch event."""
    last_full: datetime.datetime | None = None
    last_refresh: datetime.datetime | None = None
    boots: dict[str, int] = dataclasses.field(default_factory=dict)
    lives: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    restarts: int = 0

    def __post_init__(self) -> None:
        self.cluster = Cluster(lambda: self.now.timestamp())  # noqa: PLW0108 - the clock as it moves
        self.cluster.serve_device_taint_rules(DRA_VERSION)

    def clock(self) -> datetime.datetime:
        return self.now

    # The operator's side.
    async def start_process(self, *, new_term: bool = False) -> None:
        """A new operator process over the cluster (module docstring); `new_term`: the same process's
        next term instead (a leader that lost its Lease and won it again, `cli`): its cache and module
        stores kept, its running drains stopped, a new Context primed into the kept cache."""
        kept = None
        if new_term:
            self.ctx.steps.drain.cancel_all()
            kept = self.ctx.cache
        else:
            fresh_process()
        self.ctx = operator_context.new_context(self.cluster, instance=f"t{self.restarts}", cluster=kept)
        self.restarts += 1
        self.ctx.clock = self.clock
        await priming.prime(self.ctx)
        self.seen = self._versions()  # the watches start from the lists' versions
        for body in sorted(self.cluster.policies.values(), key=lambda b: b["metadata"]["name"]):
            await handlers.on_policy(_event(None, body), memo=self.ctx)  # kopf's first listing
        self.last_full = self.last_refresh = None
        await self.sync()
        await self.timer()  # ticker.run's first pass: a full one

    async def timer(self) -> None:
        """A timer pass as `ticker.run` makes it: full every `full_pass_seconds`, refresh every 10 s."""
        full = self.last_full is None or (self.now - self.last_full).total_seconds() >= (
            self.ctx.config.full_pass_seconds
        )
        if full:
            self.last_full = self.now
        refresh = (
            full
            or self.last_refresh is None
            or (self.now - self.last_refresh).total_seconds() >= (ticker.REFRESH_SECONDS)
        )
        if refresh:
            self.last_refresh = self.now
        await ticker.tick(self.ctx, full=full, refresh=refresh)
        await self.sync()

    def _versions(self) -> dict[tuple[str, str], str]:
        stores = {
            "node": self.cluster.nodes,
            "gpunode": self.cluster.gpunodes,
            "policy": self.cluster.policies,
        }
        return {
            (kind, name): str(body["metadata"].get("resourceVersion"))
            for kind, store in stores.items()
            for name, body in store.items()
        }

    async def sync(self) -> None:
        """Deliver the watch events of every object that moved (or went) since last delivered, and run the
        passes and drains they ask for; again until nothing moves."""
        handler_of: dict[str, Callable[..., Awaitable[None]]] = {
            "node": handlers.on_node,
            "gpunode": handlers.on_gpunode,
            "policy": handlers.on_policy,
        }
        stores = {
            "node": self.cluster.nodes,
            "gpunode": self.cluster.gpunodes,
            "policy": self.cluster.policies,
        }
        for _ in range(50):
            await self._quiesce()
            now = self._versions()
            moved = [k for k in now if self.seen.get(k) != now[k]]
            gone = [k for k in self.seen if k not in now]
            if not moved and not gone:
                return
            for kind, name in gone:
                body = self._gone_bodies.pop((kind, name), {"metadata": {"name": name}})
                await handler_of[kind](_event("DELETED", body), memo=self.ctx)
                del self.seen[(kind, name)]
            for kind, name in moved:
                body = copy.deepcopy(stores[kind][name])
                event_type = "MODIFIED" if (kind, name) in self.seen else "ADDED"
                self.seen[(kind, name)] = now[(kind, name)]
                await handler_of[kind](_event(event_type, body), memo=self.ctx)
        raise AssertionError("the cluster never settled: the operator keeps writing")

    async def _quiesce(self) -> None:
        for _ in range(100):
            await passes.settle(self.ctx)
            running = [t for t in self.ctx.steps.drain.tasks.values() if not t.done()]
            if not running and not self.ctx.passes.busy:
                return
            if running:
                await asyncio.wait(running, timeout=5)
        raise AssertionError("passes or drains never finished")

    # The cluster's side: what the story does.
    async def add_node(
        self, name: str, labels: Mapping[str, str] | None = None, *, report: bool = True
    ) -> None:
        """A Node joins (created now, a new uid per life) and its agent creates its GPUNode and reports."""
        self.lives[name] += 1
        uid = f"uid-{name}-{self.lives[name]}"
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "uid": uid,
                "creationTimestamp": times.render(self.now),
                "labels": {keys.GPU_COUNT_LABEL: str(GPUS), keys.GPU_PRESENT_LABEL: "true", **(labels or {})},
            },
            "spec": {},
            "status": {"capacity": {keys.GPU_RESOURCE: str(GPUS)}},
        }
        self.cluster.put_node(body)
        self.cluster.put_slice(gpunode_facts.resource_slice(name, GPUS))
        self.boots[name] = self.boots.get(name, 0) + 1
        if report:
            await self.report(name)
        else:
            await self.sync()

    async def report(
        self,
        name: str,
        overrides: Mapping[int, Mapping[str, Any]] | None = None,
        *,
        gpus: int = GPUS,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """The agent's report a second on (healthy but for `overrides`); `extra`: more of its status."""
        self.now += datetime.timedelta(seconds=1)
        stamp = gpunode_facts.rfc3339(self.now)
        facts = gpunode_facts.agent_status(gpus=gpus, overrides=overrides, heartbeat=stamp, observed=stamp)
        facts["agent"]["bootId"] = f"boot-{self.boots.get(name, 1)}"
        facts["agent"]["expectedGpuCount"] = GPUS
        facts.update(copy.deepcopy(dict(extra or {})))
        fresh = name not in self.cluster.gpunodes
        stored = self.cluster.put_gpunode(name, facts)
        if fresh:
            owner = {
                "apiVersion": "v1",
                "kind": "Node",
                "name": name,
                "uid": self.cluster.nodes[name]["metadata"]["uid"],
            }
            stored["metadata"]["ownerReferences"] = [owner]
        await self.sync()

    def reboot(self, name: str) -> None:
        """The node rebooted (its agent's next report carries a new bootId)."""
        self.boots[name] = self.boots.get(name, 1) + 1

    async def edit_node(self, name: str, edit: Callable[[dict[str, Any]], None]) -> None:
        """Someone else (a human, the GPU Operator) edits the Node."""
        node = copy.deepcopy(self.cluster.nodes[name])
        edit(node)
        self.cluster.put_node(node)
        await self.sync()

    async def delete_node(self, name: str) -> None:
        """The Node is deleted; the garbage collector deletes its GPUNode (owned by it)."""
        node = self.cluster.delete_node(name)
        gpunode = self.cluster.delete_gpunode(name)
        if node is not None:
            self._gone_bodies[("node", name)] = copy.deepcopy(node)
        if gpunode is not None:
            self._gone_bodies[("gpunode", name)] = copy.deepcopy(gpunode)
        self.cluster.delete_slice(dra.slice_name(name))
        await self.sync()

    async def policy(self, name: str, spec: Mapping[str, Any]) -> None:
        """A policy created now (or its spec changed: a new generation)."""
        current = self.cluster.policies.get(name)
        generation = int(current["metadata"]["generation"]) + 1 if current else 1
        body: dict[str, Any] = {
            "apiVersion": resources.API_VERSION,
            "kind": resources.POLICY_KIND,
            "metadata": {
                "name": name,
                "uid": f"uid-policy-{name}",
                "generation": generation,
                "creationTimestamp": times.render(self.now),
            },
            "spec": {
                "maxUnavailable": "100%",
                "breaker": {"maxNewUnhealthy": "100%"},
                **copy.deepcopy(dict(spec)),
            },
        }
        if current:
            body["metadata"]["creationTimestamp"] = current["metadata"]["creationTimestamp"]
            body["status"] = current.get("status", {})
        self.cluster.policies[name] = self.cluster.bump(body)
        await self.sync()

    async def end_job(self, node: str, action: str, *, ok: bool) -> None:
        """The node's live Job of `action` (ResetGPU, RebootNode, Validation) ends now."""
        (job,) = [
            j
            for j in self.cluster.jobs.values()
            if j["metadata"]["labels"].get(keys.NODE_LABEL) == node
            and j["metadata"]["labels"].get(keys.REPAIR_ACTION_LABEL) == action
            and not j.get("status", {}).get("conditions")
        ]
        self.cluster.end_job(job["metadata"]["name"], ok, self.now.timestamp())
        await self.sync()

    async def tick(self, seconds: float = 1.0, times_: int = 1) -> None:
        """`seconds` pass, then a timer pass; `times_` over."""
        for _ in range(times_):
            self.now += datetime.timedelta(seconds=seconds)
            await self.timer()


def _event(kind: str | None, body: dict[str, Any]) -> kopf.RawEvent:
    return {"type": kind, "object": copy.deepcopy(body)}  # type: ignore[typeddict-item]


# --- what a user sees ------------------------------------------------------------------------------------

_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?")
_TOKEN = re.compile(r"\b[0-9a-f]{64}\b")
"""A Job token's SHA-256 (repair state `jobToken`, `gpuhealth.io/validation-token`): random by design, and a
restarted process makes a new one before its Job, so only its presence is compared."""
_TIME_KEYS = frozenset({"lastTransitionTime", "lastHeartbeatTime", "lastUpdateTime", "time", "since"})


def _untimed(value: Any) -> Any:
    """`value` with every timestamp left out: a restarted process may act a pass earlier (its first timer
    pass is a full one), so a time may move; what was decided may not."""
    if isinstance(value, Mapping):
        return {k: _untimed(v) for k, v in sorted(value.items()) if k not in _TIME_KEYS}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    if isinstance(value, str):
        return _TOKEN.sub("<token>", _TIME.sub("<t>", value))
    return value


def seen_by_users(world: World) -> dict[str, Any]:
    """The story's end as a user sees it (the comparison of test_restart_anywhere)."""
    cluster = world.cluster
    nodes = {}
    for name, node in sorted(cluster.nodes.items()):
        meta = node["metadata"]
        nodes[name] = {
            "labels": {
                k: v for k, v in sorted((meta.get("labels") or {}).items()) if k.startswith(keys.PREFIX)
            },
            "annotations": _untimed(
                {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(keys.PREFIX)}
            ),
            "taints": sorted(
                (t.get("key"), t.get("value"), t.get("effect")) for t in node["spec"].get("taints") or []
            ),
            "unschedulable": bool(node["spec"].get("unschedulable")),
            "conditions": _untimed(
                [
                    c
                    for c in (node.get("status") or {}).get("conditions") or []
                    if c.get("type") == keys.NODE_CONDITION_TYPE
                ]
            ),
        }
    gpunodes = {
        name: _untimed(
            {k: v for k, v in body.get("status", {}).items() if k in memcluster.OPERATOR_STATUS_FIELDS}
        )
        for name, body in sorted(cluster.gpunodes.items())
    }
    created = collections.Counter(j["metadata"]["name"] for j in cluster.job_log)
    events: collections.Counter[tuple[str, str]] = collections.Counter()
    for event in cluster.events.values():
        events[(event["reason"], event["involvedObject"]["name"])] += int(event.get("count") or 1)
    rules_created = (
        collections.Counter(  # the support probe's rule left out: each term probes anew, by design
            r["metadata"]["name"]
            for what, r in cluster.rule_log
            if what == "created" and keys.NODE_LABEL in (r["metadata"].get("labels") or {})
        )
    )
    return {
        "nodes": nodes,
        "gpunodes": json.loads(json.dumps(gpunodes, default=str)),
        "jobs created": dict(sorted(created.items())),
        "jobs left": sorted(cluster.jobs),
        "rules created": dict(sorted(rules_created.items())),
        "rules left": sorted(
            n for n, r in cluster.rules.items() if keys.NODE_LABEL in r["metadata"].get("labels", {})
        ),
        "events": {f"{reason} {node}": n for (reason, node), n in sorted(events.items())},
    }


def orphans(world: World) -> list[str]:
    """Unfinished step Jobs whose Node is gone, or was created after the Job (another Node of the same name
    registered meanwhile): privileged Jobs that would run on a node nobody cordoned or drained."""
    found = []
    for key, job in sorted(world.cluster.jobs.items()):
        if (job.get("status") or {}).get("conditions"):
            continue  # finished: it runs nowhere
        node = world.cluster.nodes.get(str(job["metadata"]["labels"].get(keys.NODE_LABEL)))
        born = times.parse(node["metadata"].get("creationTimestamp")) if node is not None else None
        made = times.parse(job["metadata"].get("creationTimestamp"))
        if node is None or (born is not None and made is not None and made < born):
            found.append(key)
    return found


Step = Callable[[World], Awaitable[None]]
"""One event of a story: the world changes, the operator sees it."""


async def run(story: Sequence[Step], restart_after: int | None, *, new_term: bool = False) -> World:
    """Play `story` on a new world; restart the operator after its event `restart_after` (None: never),
    as a new process or (`new_term`) as the same process's next term."""
    world = World()
    await world.start_process()
    for index, step in enumerate(story):
        await step(world)
        if index == restart_after:
            await world.start_process(new_term=new_term)
    return world
