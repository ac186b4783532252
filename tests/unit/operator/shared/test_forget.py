"""A deleted node or policy leaves nothing behind in the operator's memory, and nothing of the others goes.

The test fills every per-node and per-policy map of `Context` (and of its
`Admission`) for two nodes and two policies, forgets one of each, and walks
every map for a mention. A map added to `Context` later without a filler here
fails `test_every_map_is_known`: add it to FILLERS and to `forget_node` /
`forget_policy`.
"""

import asyncio
import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

import operator_context
from gpuhealth_api import vocabulary
from gpuhealth_operator.client import drain, drains, kube
from gpuhealth_operator.decisions import breaker, isolation, model, repair
from gpuhealth_operator.ladder import memories
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import admission, breakers, cache, domain_states, judged, recent
from gpunode_facts import verdict

NOT_STATE = {
    "config",
    "client",
    "meters",
    "recorder",
    "cache",
    "agent_pods",
    "steps.drain.eviction_slots",
    "clock",
}
NOT_STATE |= {"steps.isolate.discovery"}  # what discovery says of DeviceTaintRules, cluster-wide
NOT_STATE |= {"steps.repair.templates"}  # the repair Job templates, cluster-wide
NOT_STATE |= {"status.marks", "status.gpus_marks"}  # what the policy status counted, snapshots
NOT_STATE |= {"judging.straggler_cohorts"}  # `cohorts`: follows the selections and policies at the next tick
NOT_STATE |= {"steps.check.in_flight"}  # a count of the last pass, no names
NOT_STATE |= {"steps.check.pods"}  # the GPU pods as watched: a view of the cluster (test_gpu_pods.py)
NOT_STATE |= {"judging.selection"}  # the last node's selection, one node's: its own test (test_selection.py)
NOT_STATE |= {"passes"}  # asked passes: each runs once and finds a forgotten node gone (no memory kept)
"""Context fields that hold no per-node or per-policy memory (the cache and the agent pods, views of
the cluster, are tested on their own)."""


def fill(ctx: context.Context, policy: str, node: str) -> None:
    ctx.node_locks[node]  # a defaultdict: looking a key up creates its lock
    ctx.admission.in_flight.add(node)
    ctx.steps.cordon.unknown[node] = "41"
    ctx.admission.notified.add((policy, node))
    draining = dataclasses.replace(verdict(node=node), wanted_action=vocabulary.Action.DRAIN)
    ctx.verdicts[(policy, node)] = draining
    ctx.judging.judged[(policy, node)] = (draining, (object(),))
    ctx.judging.stragglers[(policy, node)] = model.StragglerScore(
        score=1.0, z_score=-4.0, peers=8, flagged=True
    )
    ctx.judging.straggler_samples[(policy, node)].append(
        (datetime.datetime(2026, 1, 5, tzinfo=datetime.UTC), -4.0)
    )
    ctx.steps.drain.tasks[node] = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
    ctx.steps.drain.results[node] = drain.Result(completed=True, blocking=(), evicted=1, skipped=())
    ctx.steps.drain.checked[node] = 1.0
    ctx.steps.drain.unsaid[node] = "Node drained by policy p."
    ctx.steps.drain.policies[node] = policy
    ctx.steps.cordon.announced[node] = "2026-01-01T00:00:00Z"
    ctx.steps.repair.history[node] = [{"cycle": 1, "result": "Started"}]
    ctx.steps.repair.finished_seen[node] = ("gpuhealth-repair-job", datetime.datetime.now(datetime.UTC))
    ctx.steps.repair.waiting.add(node)
    ctx.steps.repair.tokens[node] = ("digest", "token")
    ctx.steps.new_nodes.in_service[node] = f"uid-{node}"
    ctx.steps.new_nodes.said[node] = f"uid-{node}"
    ctx.steps.repair.busy_said.add(node)
    ctx.steps.repair.validations.add(node)
    ctx.steps.repair.gone_nodes.add(node)
    ctx.steps.dry_run.said[(policy, node)] = f"Dry run: policy {policy} would cordon"
    ctx.steps.drill.said[(policy, node)] = f"Drill: policy {policy} would cordon"
    ctx.steps.drill.health[(policy, node)] = "Unhealthy"
    ctx.status.written[policy] = {"observedGeneration": 1}
    ctx.steps.repair.refused[policy] = repair.Refused(
        "jobs.batch is forbidden", datetime.datetime.now(datetime.UTC), True
    )
    ctx.steps.repair.permitted.add(policy)
    ctx.verdicts.turned_unhealthy[policy][node] = datetime.datetime.now(datetime.UTC)
    ctx.breakers.states[policy] = breaker.Breaker(state=breaker.State.HALF_OPEN, trial=node)
    ctx.breakers.announced[policy] = breaker.Breaker()
    ctx.breakers.resets[policy] = "now"
    ctx.breakers.acted[policy] = ("before", datetime.datetime.now(datetime.UTC))
    ctx.steps.isolate.support[policy] = isolation.Support(1, None, "not served")
    ctx.steps.isolate.isolations[(policy, node)] = isolation.NodeState()
    ctx.steps.isolate.locks[policy]  # a defaultdict: looking a key up creates its lock
    now = datetime.datetime.now(datetime.UTC)
    ctx.steps.isolate.rules_read.put((policy, "v1beta2"), [], now)
    ctx.steps.isolate.devices_read.put(node, {}, now)
    ctx.steps.domain.states[policy] = {}
    ctx.steps.domain.recorded[policy] = [{"key": "rack", "value": "r1"}]
    ctx.steps.domain.seen[(policy, node)] = ("Unhealthy", ("r1",))
    ctx.steps.check.history[node] = [{"name": "quick", "result": "Passed"}]
    ctx.steps.check.idle_since[node] = now
    ctx.steps.check.recorded[f"uid-{node}"] = node
    ctx.steps.check.dry_run_said[(policy, node)] = "quick"
    ctx.steps.check.refused[node] = "token"
    ctx.steps.check.yielded[f"uid-{node}"] = node
    ctx.steps.check.no_gpus[node] = now
    RECORDS[node] = cache.node_record({"metadata": {"name": node}})  # held: the rest refers to it weakly
    ctx.judging.resting[node] = judged.Rest(RECORDS[node].reading, 1, (), None)


RECORDS: dict[str, cache.NodeRecord] = {}


FILLED = {
    "node_locks",
    "steps.repair.history",
    "steps.repair.finished_seen",
    "steps.repair.waiting",
    "steps.repair.tokens",
    "steps.new_nodes.in_service",
    "steps.new_nodes.said",
    "steps.repair.busy_said",
    "steps.repair.validations",
    "steps.repair.gone_nodes",
    "steps.repair.refused",
    "steps.repair.permitted",
    "admission",
    "steps.cordon.unknown",
    "verdicts",
    "judging.judged",
    "judging.stragglers",
    "judging.straggler_samples",
    "steps.drain",
    "steps.cordon.announced",
    "steps.dry_run.said",
    "steps.drill.said",
    "steps.drill.health",
    "status.written",
    "breakers",
    "steps.isolate.support",
    "steps.isolate.isolations",
    "steps.isolate.rules_read",
    "steps.isolate.devices_read",
    "steps.isolate.locks",
    "steps.domain",
    "judging.resting",
    "steps.check.history",
    "steps.check.idle_since",
    "steps.check.recorded",
    "steps.check.dry_run_said",
    "steps.check.refused",
    "steps.check.yielded",
    "steps.check.no_gpus",
}
"""The Context fields `fill` puts a node and a policy into."""


def mentions(value: Any, name: str) -> bool:
    """Whether `name` appears as a key, element or tuple member anywhere in a collection."""
    if isinstance(value, str):
        return value == name
    if isinstance(value, breaker.Breaker):
        return value.trial == name
    if isinstance(value, tuple | list | set | frozenset):
        return any(mentions(v, name) for v in value)
    if isinstance(value, Mapping):
        return any(mentions(k, name) or mentions(v, name) for k, v in value.items())
    if isinstance(
        value,
        context.Verdicts
        | admission.Admission
        | breakers.Breakers
        | recent.Recent
        | domain_states.DomainStates
        | drains.Drains,
    ):
        return any(mentions(v, name) for v in vars(value).values())
    return False  # locks, tasks, results: leaves


def make() -> context.Context:
    client = kube.Kube(kube.Credentials("https://127.0.0.1:1", None, True, None, None, None))
    return operator_context.new_context(client)


def stores(holder: object, prefix: str = "") -> dict[str, Any]:
    """Every store of the context by its path (`steps.isolate.isolations`): the memories walked into."""
    found: dict[str, Any] = {}
    for field in dataclasses.fields(holder):  # type: ignore[arg-type]
        value = getattr(holder, field.name)
        if isinstance(value, MEMORIES):
            found.update(stores(value, f"{prefix}{field.name}."))
        else:
            found[prefix + field.name] = value
    return found


MEMORIES = (judged.JudgingMemory, memories.Memories, context.StatusMemory)
MEMORIES += tuple(
    type(value)
    for _, value in memories.Memories().each()
    if dataclasses.is_dataclass(value) and not isinstance(value, domain_states.DomainStates)
)
"""The memories `stores` walks into; the drains' and the domains' (one store each) `mentions` walks."""


def state(ctx: context.Context) -> dict[str, Any]:
    return {name: value for name, value in stores(ctx).items() if name not in NOT_STATE}


def test_every_map_is_known() -> None:
    assert set(stores(make())) - NOT_STATE == FILLED


def test_forget_node_empties_every_map_of_that_node_only() -> None:
    async def scenario() -> None:
        ctx = make()
        fill(ctx, "p", "gone")
        fill(ctx, "p", "kept")
        running = ctx.steps.drain.tasks["gone"]
        ctx.forget_node("gone")
        # a deleted node's validation Job is still to be deleted (new_nodes.sweep): it holds its place;
        # and its step Jobs are deleted on the next tick (orphan_jobs.sweep)
        assert {name for name, value in state(ctx).items() if mentions(value, "gone")} == {
            "steps.repair.validations",
            "steps.repair.gone_nodes",
        }
        assert {name for name, value in state(ctx).items() if not mentions(value, "kept")} == {
            "status.written",  # per policy only
            "steps.isolate.support",
            "steps.isolate.rules_read",
            "steps.isolate.locks",
            "steps.repair.refused",
            "steps.repair.permitted",
        }
        assert "gone" not in ctx.verdicts.wanting["p"]
        await asyncio.sleep(0)
        assert running.cancelled(), "the drain of a deleted node is cancelled"
        ctx.steps.drain.tasks["kept"].cancel()

    asyncio.run(scenario())


def test_forget_node_keeps_a_lock_a_reconcile_holds() -> None:
    async def scenario() -> None:
        ctx = make()
        async with ctx.node_locks["n"]:
            ctx.forget_node("n")
            assert "n" in ctx.node_locks

    asyncio.run(scenario())


def test_forget_policy_empties_every_map_of_that_policy_only() -> None:
    async def scenario() -> None:
        ctx = make()
        fill(ctx, "gone", "n")
        fill(ctx, "kept", "n")
        ctx.forget_policy("gone")
        assert [name for name, value in state(ctx).items() if mentions(value, "gone")] == []
        per_policy = {
            "admission",
            "verdicts",
            "judging.judged",
            "judging.stragglers",
            "judging.straggler_samples",
            "steps.dry_run.said",
            "steps.drill.said",
            "steps.drill.health",
            "status.written",
            "breakers",
            "steps.repair.refused",
            "steps.repair.permitted",
        }
        per_policy |= {
            "steps.isolate.support",
            "steps.isolate.isolations",
            "steps.isolate.rules_read",
            "steps.isolate.locks",
            "steps.domain",
        }
        per_policy.add("steps.drain")  # the node's drain is "kept"'s (the last filled)
        per_policy.add("steps.check.dry_run_said")  # its DryRun "would check" said
        assert {name for name, value in state(ctx).items() if mentions(value, "kept")} == per_policy
        ctx.steps.drain.tasks["n"].cancel()

    asyncio.run(scenario())


def test_forget_verdicts_keeps_the_nodes_own_memory() -> None:
    """A node no policy selects any more still exists: its drain runs on and its lock stays."""

    async def scenario() -> None:
        ctx = make()
        fill(ctx, "p", "n")
        ctx.forget_verdicts("n")
        assert {name for name, value in state(ctx).items() if mentions(value, "n")} == {
            "node_locks",
            "steps.drain",
            "steps.cordon.announced",
            "steps.repair.history",
            "steps.repair.finished_seen",
            "steps.repair.waiting",
            "steps.repair.tokens",
            "steps.new_nodes.in_service",
            "steps.new_nodes.said",
            "steps.repair.busy_said",
            "steps.check.history",  # its run history and idleness: the node still exists
            "steps.check.idle_since",
            "steps.check.recorded",
            "steps.check.refused",
            "steps.check.yielded",  # a check it made way with still ends Preempted
            "steps.check.no_gpus",
            "steps.repair.validations",
            "steps.repair.gone_nodes",
        }
        assert not ctx.steps.drain.tasks["n"].cancelled()
        ctx.steps.drain.tasks["n"].cancel()

    asyncio.run(scenario())
