"""A cordon whose answer was lost (504, timeout) keeps its budget place until the cluster says (issue 24,
item 5).

The cordon may have landed or not; until a version of the Node newer than the
one the cordon was computed from is seen (its resourceVersion precondition
means it can no longer land after that), the node counts as cordoned in every
selecting policy's budget, so a second node is never cordoned past
maxUnavailable on a guess.
"""

import asyncio
import datetime

import pytest

import drain_cluster
import gpunode_facts
from gpuhealth_operator.runtime import reconciler

NODES = {"a": {"pool": "gpu"}, "b": {"pool": "gpu"}}
SPEC = drain_cluster.drain_spec("gpu", breaker={"maxNewUnhealthy": 10})
EARLIER = gpunode_facts.rfc3339(datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=1))
"""When `b`'s fault was seen: before `a`'s, so `b` is first in the budget's queue once `a` holds nothing."""


def unschedulable(cluster: drain_cluster.DrainCluster) -> list[str]:
    return sorted(n for n, body in cluster.nodes.items() if body["spec"].get("unschedulable"))


@pytest.mark.parametrize("how", ["landed", "lost"])
def test_a_cordon_with_a_lost_answer_holds_its_budget_place(how: str) -> None:
    async def scenario() -> None:
        cluster = drain_cluster.DrainCluster()
        ctx = await drain_cluster.start(cluster, {"p": SPEC}, NODES)
        cluster.lose_cordon = how
        await drain_cluster.report(cluster, ctx, "a", ecc=1)  # its cordon's answer is a 504
        assert unschedulable(cluster) == (["a"] if how == "landed" else [])
        await drain_cluster.report(cluster, ctx, "b", ecc=1, observed=EARLIER)
        assert unschedulable(cluster) == (["a"] if how == "landed" else []), "maxUnavailable=1 exceeded"
        assert cluster.gpunodes["b"]["status"]["action"] == "Pending"

        # The next pass over `a` (its watch event, or the timer) settles it; `b` still waits its turn.
        if how == "landed":
            await drain_cluster.deliver(cluster, ctx, "a")
        else:
            await reconciler.reconcile_node(ctx, "a", "timer")
        await reconciler.reconcile_node(ctx, "b", "timer")
        assert unschedulable(cluster) == ["a"]
        assert cluster.gpunodes["b"]["status"]["action"] == "Pending"
        assert "a" not in ctx.steps.cordon.unknown
        for task in ctx.steps.drain.tasks.values():
            task.cancel()

    asyncio.run(scenario())


def test_a_lost_cordon_of_a_node_that_recovered_frees_the_place_once_a_newer_version_is_seen() -> None:
    async def scenario() -> None:
        cluster = drain_cluster.DrainCluster()
        ctx = await drain_cluster.start(cluster, {"p": SPEC}, NODES)
        cluster.lose_cordon = "lost"
        await drain_cluster.report(cluster, ctx, "a", ecc=1)
        await drain_cluster.report(cluster, ctx, "b", ecc=1, observed=EARLIER)
        assert unschedulable(cluster) == []
        await drain_cluster.report(
            cluster, ctx, "a", ecc=0
        )  # the GPU was reset before the cordon was retried
        await drain_cluster.report(cluster, ctx, "b", ecc=1, observed=EARLIER)
        assert unschedulable(cluster) == [], "nothing newer of `a` seen yet: its cordon may still land"
        cluster.put_node(cluster.nodes["a"])  # the kubelet's next status update: a newer, schedulable version
        await drain_cluster.deliver(cluster, ctx, "a")
        await drain_cluster.report(cluster, ctx, "b", ecc=1, observed=EARLIER)
        assert unschedulable(cluster) == ["b"], "a newer version of `a` says its cordon did not land"
        assert ctx.steps.cordon.unknown == {} and ctx.admission.in_flight == set()
        for task in ctx.steps.drain.tasks.values():
            task.cancel()

    asyncio.run(scenario())
