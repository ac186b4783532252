"""`gpuhealth_operator_drain_failed_nodes`: nodes stuck cordoned after a drain that timed out.

GPUHealthDrainFailed reads it, so the alert fires as long as a node is stuck,
not for 30 minutes after the failure (the old `increase(...[30m])` resolved
while the node still waited for a human).
"""

import asyncio
import datetime
from typing import Any

import gpunode_facts
import operator_context
from gpuhealth_api import keys
from gpuhealth_operator.client import drain, kube, nodes
from gpuhealth_operator.decisions import policies
from gpuhealth_operator.runtime import ticker
from gpuhealth_operator.shared import context

NOW = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
FAILED = drain.Result(completed=False, blocking=("ns/db (PodDisruptionBudget)",), evicted=0, skipped=())
COMPLETED = drain.Result(completed=True, blocking=(), evicted=3, skipped=())


def node(name: str, *, cordoned_by: str | None = "p", drain_started: bool = True) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if cordoned_by:
        annotations[keys.CORDONED_BY_ANNOTATION] = cordoned_by
    if drain_started:
        annotations[nodes.DRAIN_STARTED_ANNOTATION] = "2026-01-01T11:00:00Z"
    return {
        "metadata": {
            "name": name,
            "resourceVersion": "1",
            "labels": {"pool": "gpu"},
            "annotations": annotations,
        },
        "spec": {"unschedulable": cordoned_by is not None},
    }


def fleet(*bodies: tuple[dict[str, Any], str]) -> context.Context:
    """Nodes with the GPUNode status.action each had; one drain policy `p` over them."""
    client = kube.Kube(kube.Credentials("https://127.0.0.1:1", None, True, None, None, None))
    ctx = operator_context.new_context(client)
    ctx.meters.set_leading(True)
    spec = {
        "nodeSelector": {"matchLabels": {"pool": "gpu"}},
        "rules": [{"name": "e", "condition": "EccUncorrectable", "action": "Drain"}],
    }
    ctx.cache.put_policy(policies.parse_policy("p", 1, spec))
    for body, action in bodies:
        name = body["metadata"]["name"]
        ctx.cache.put_node(body)
        status = {**gpunode_facts.agent_status(), "action": action}
        ctx.cache.put_gpunode({"metadata": {"name": name, "resourceVersion": "1"}, "status": status}, NOW)
    return ctx


def stuck(ctx: context.Context) -> float | None:
    ticker.policy_status(ctx, "p", NOW)
    for family in ctx.meters.registry.collect():
        for sample in family.samples:
            if sample.name == "gpuhealth_operator_drain_failed_nodes" and sample.labels["policy"] == "p":
                return sample.value
    return None


def test_a_node_whose_drain_timed_out_counts_while_it_stays_cordoned() -> None:
    ctx = fleet((node("a"), "Cordoned"), (node("b"), "Drained"), (node("c", drain_started=False), "Cordoned"))
    ctx.steps.drain.results["a"] = FAILED
    ctx.steps.drain.results["b"] = COMPLETED
    assert stuck(ctx) == 1
    assert stuck(ctx) == 1, "still stuck a pass later: the alert does not resolve on its own"


def test_a_running_drain_is_not_a_failed_one() -> None:
    async def scenario() -> float | None:
        ctx = fleet((node("a"), "Draining"))
        ctx.steps.drain.tasks["a"] = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
        try:
            return stuck(ctx)
        finally:
            ctx.steps.drain.tasks["a"].cancel()

    assert asyncio.run(scenario()) == 0


def test_after_a_restart_a_drain_that_failed_before_still_counts() -> None:
    # No result in memory: the node carries drain-started and the last term wrote Cordoned, as
    # draining.advance then keeps it (deadline passed, a human takes over).
    ctx = fleet((node("a"), "Cordoned"), (node("b"), "Drained"))
    assert stuck(ctx) == 1


def test_after_a_restart_a_drain_whose_deadline_has_not_come_is_not_counted() -> None:
    """Begun a minute before the restart, the status write of Draining lost (it still says Cordoned): the
    drain resumes (`draining.NodeDrain.decide`), so it is not a failed one, and GPUHealthDrainFailed,
    which pages at once, stays quiet."""
    began = node("a")
    began["metadata"]["annotations"][nodes.DRAIN_STARTED_ANNOTATION] = "2026-01-01T11:59:00Z"
    ctx = fleet((began, "Cordoned"))
    assert stuck(ctx) == 0


def test_the_gauge_falls_to_zero_once_a_human_moves_the_node_on() -> None:
    ctx = fleet((node("a"), "Cordoned"))
    ctx.steps.drain.results["a"] = FAILED
    assert stuck(ctx) == 1
    ctx.cache.put_node(node("a", cordoned_by=None, drain_started=False))  # uncordoned by a human
    ctx.steps.drain.results.pop("a")  # as overrides.py does on the override
    assert stuck(ctx) == 0


def test_a_node_another_policy_cordoned_is_not_this_policys_failed_drain() -> None:
    ctx = fleet((node("a", cordoned_by="other"), "Cordoned"))
    ctx.steps.drain.results["a"] = FAILED
    assert stuck(ctx) == 0
