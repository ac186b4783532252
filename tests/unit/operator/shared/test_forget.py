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
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import admission, breakers, cache, check_memory, domain_states, recent
from gpunode_facts import verdict

NOT_STATE = {"config", "client", "meters", "recorder", "cache", "agent_pods", "eviction_slots", "clock"}
NOT_STATE |= {"isolation_discovery"}  # what discovery says of DeviceTaintRules, cluster-wide
NOT_STATE |= {"repair_templates"}  # the repair Job templates, cluster-wide
NOT_STATE |= {"status_marks", "gpus_counted_marks"}  # what the policy status counted, snapshots
NOT_STATE |= {"straggler_cohorts"}  # `cohorts`: follows the selections and policies at the next tick
NOT_STATE |= {"passes"}  # asked passes: each runs once and finds a forgotten node gone (no memory kept)
"""Context fields that hold no per-node or per-policy memory (the cache and the agent pods, views of
the cluster, are tested on their own)."""


def fill(ctx: context.Context, policy: str, node: str) -> None:
    ctx.node_locks[node]  # a defaultdict: looking a key up creates its lock
    ctx.admission.in_flight.add(node)
    ctx.cordons_unknown[node] = "41"
    ctx.admission.notified.add((policy, node))
    ctx.verdicts.remember(
        (policy, node),
        dataclasses.replace(verdict(node=node), wanted_action=vocabulary.Action.DRAIN),
        (object(),),
    )
    ctx.stragglers[(policy, node)] = model.StragglerScore(score=1.0, z_score=-4.0, peers=8, flagged=True)
    ctx.straggler_samples[(policy, node)].append((datetime.datetime(2026, 1, 5, tzinfo=datetime.UTC), -4.0))
    ctx.drains.tasks[node] = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
    ctx.drains.results[node] = drain.Result(completed=True, blocking=(), evicted=1, skipped=())
    ctx.drains.checked[node] = 1.0
    ctx.drains.unsaid[node] = "Node drained by policy p."
    ctx.drains.policies[node] = policy
    ctx.announced_cordons[node] = "2026-01-01T00:00:00Z"
    ctx.repair_history[node] = [{"cycle": 1, "result": "Started"}]
    ctx.repair_finished_seen[node] = ("gpuhealth-repair-job", datetime.datetime.now(datetime.UTC))
    ctx.repair_waiting.add(node)
    ctx.repair_tokens[node] = ("digest", "token")
    ctx.new_nodes_in_service[node] = f"uid-{node}"
    ctx.new_nodes_said[node] = f"uid-{node}"
    ctx.repair_busy_said.add(node)
    ctx.validations_running.add(node)
    ctx.gone_nodes.add(node)
    ctx.dry_run_said[(policy, node)] = f"Dry run: policy {policy} would cordon"
    ctx.drill_said[(policy, node)] = f"Drill: policy {policy} would cordon"
    ctx.drill_health[(policy, node)] = "Unhealthy"
    ctx.policy_status_written[policy] = {"observedGeneration": 1}
    ctx.repair_refused[policy] = repair.Refused(
        "jobs.batch is forbidden", datetime.datetime.now(datetime.UTC), True
    )
    ctx.repair_permitted.add(policy)
    ctx.verdicts.turned_unhealthy[policy][node] = datetime.datetime.now(datetime.UTC)
    ctx.breakers.states[policy] = breaker.Breaker(state=breaker.State.HALF_OPEN, trial=node)
    ctx.breakers.announced[policy] = breaker.Breaker()
    ctx.breakers.resets[policy] = "now"
    ctx.breakers.acted[policy] = ("before", datetime.datetime.now(datetime.UTC))
    ctx.isolation_support[policy] = isolation.Support(1, None, "not served")
    ctx.isolations[(policy, node)] = isolation.NodeState()
    ctx.isolation_locks[policy]  # a defaultdict: looking a key up creates its lock
    now = datetime.datetime.now(datetime.UTC)
    ctx.rules_read.put((policy, "v1beta2"), [], now)
    ctx.devices_read.put(node, {}, now)
    ctx.domains.states[policy] = {}
    ctx.domains.recorded[policy] = [{"key": "rack", "value": "r1"}]
    ctx.domains.seen[(policy, node)] = ("Unhealthy", ("r1",))
    ctx.checks.history[node] = [{"name": "quick", "result": "Passed"}]
    ctx.checks.idle_since[node] = now
    ctx.checks.recorded[f"uid-{node}"] = node
    ctx.checks.dry_run_said[(policy, node)] = "quick"
    ctx.checks.refused[node] = "token"
    RECORDS[node] = cache.node_record({"metadata": {"name": node}})  # held: the rest refers to it weakly
    ctx.resting[node] = context.Rest(RECORDS[node].reading, 1, (), None)


RECORDS: dict[str, cache.NodeRecord] = {}


FILLED = {
    "node_locks",
    "repair_history",
    "repair_finished_seen",
    "repair_waiting",
    "repair_tokens",
    "new_nodes_in_service",
    "new_nodes_said",
    "repair_busy_said",
    "validations_running",
    "gone_nodes",
    "repair_refused",
    "repair_permitted",
    "admission",
    "cordons_unknown",
    "verdicts",
    "stragglers",
    "straggler_samples",
    "drains",
    "announced_cordons",
    "dry_run_said",
    "drill_said",
    "drill_health",
    "policy_status_written",
    "breakers",
    "isolation_support",
    "isolations",
    "rules_read",
    "devices_read",
    "isolation_locks",
    "domains",
    "resting",
    "checks",
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
        | drains.Drains
        | check_memory.CheckMemory,
    ):
        return any(mentions(v, name) for v in vars(value).values())
    return False  # locks, tasks, results: leaves


def make() -> context.Context:
    client = kube.Kube(kube.Credentials("https://127.0.0.1:1", None, True, None, None, None))
    return operator_context.new_context(client)


def state(ctx: context.Context) -> dict[str, Any]:
    return {f.name: getattr(ctx, f.name) for f in dataclasses.fields(ctx) if f.name not in NOT_STATE}


def test_every_map_is_known() -> None:
    assert {f.name for f in dataclasses.fields(context.Context)} - NOT_STATE == FILLED


def test_forget_node_empties_every_map_of_that_node_only() -> None:
    async def scenario() -> None:
        ctx = make()
        fill(ctx, "p", "gone")
        fill(ctx, "p", "kept")
        running = ctx.drains.tasks["gone"]
        ctx.forget_node("gone")
        # a deleted node's validation Job is still to be deleted (new_nodes.sweep): it holds its place;
        # and its step Jobs are deleted on the next tick (orphan_jobs.sweep)
        assert [name for name, value in state(ctx).items() if mentions(value, "gone")] == [
            "validations_running",
            "gone_nodes",
        ]
        assert [name for name, value in state(ctx).items() if not mentions(value, "kept")] == [
            "policy_status_written",  # per policy only
            "isolation_support",
            "rules_read",
            "isolation_locks",
            "repair_refused",
            "repair_permitted",
        ]
        assert "gone" not in ctx.verdicts.wanting["p"]
        await asyncio.sleep(0)
        assert running.cancelled(), "the drain of a deleted node is cancelled"
        ctx.drains.tasks["kept"].cancel()

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
            "stragglers",
            "straggler_samples",
            "dry_run_said",
            "drill_said",
            "drill_health",
            "policy_status_written",
            "breakers",
            "repair_refused",
            "repair_permitted",
        }
        per_policy |= {"isolation_support", "isolations", "rules_read", "isolation_locks", "domains"}
        per_policy.add("drains")  # the node's drain is "kept"'s (the last filled)
        per_policy.add("checks")  # its DryRun "would check" said
        assert {name for name, value in state(ctx).items() if mentions(value, "kept")} == per_policy
        ctx.drains.tasks["n"].cancel()

    asyncio.run(scenario())


def test_forget_verdicts_keeps_the_nodes_own_memory() -> None:
    """A node no policy selects any more still exists: its drain runs on and its lock stays."""

    async def scenario() -> None:
        ctx = make()
        fill(ctx, "p", "n")
        ctx.forget_verdicts("n")
        assert {name for name, value in state(ctx).items() if mentions(value, "n")} == {
            "node_locks",
            "drains",
            "announced_cordons",
            "repair_history",
            "repair_finished_seen",
            "repair_waiting",
            "repair_tokens",
            "new_nodes_in_service",
            "new_nodes_said",
            "repair_busy_said",
            "checks",  # its run history and idleness: the node still exists
            "validations_running",
            "gone_nodes",
        }
        assert not ctx.drains.tasks["n"].cancelled()
        ctx.drains.tasks["n"].cancel()

    asyncio.run(scenario())
