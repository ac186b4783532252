"""`Drained` is state, an Event a report: a refused Event never keeps a node Draining (issue 24, item 11)."""

import asyncio
import time
from typing import Any

import drain_cluster
from gpuhealth_operator.client import kube
from gpuhealth_operator.runtime import handlers, reconciler
from gpuhealth_operator.shared import context


def action(cluster: drain_cluster.DrainCluster, name: str) -> str | None:
    return cluster.gpunodes[name]["status"].get("action")


def test_a_drain_completes_while_events_are_refused_and_the_event_follows_when_accepted() -> None:
    async def scenario() -> None:
        cluster = drain_cluster.DrainCluster()
        ctx = await drain_cluster.start(
            cluster, {"p": drain_cluster.drain_spec("gpu")}, {"n": {"pool": "gpu"}}
        )
        cluster.add_pod("n", "job")
        cluster.refuse_events = True  # an Event quota, or an admission webhook, says no to every Event
        await drain_cluster.report(cluster, ctx, "n", ecc=1)
        await asyncio.wait({ctx.steps.drain.tasks["n"]}, timeout=5)
        assert cluster.pods == {}, "the pod was evicted"
        lists = cluster.pod_lists
        for _ in range(5):  # the timer's passes
            await reconciler.reconcile_node(ctx, "n", "timer")
        assert action(cluster, "n") == "Drained", "the node stays Draining while its Event is refused"
        assert cluster.pod_lists - lists <= 1, (
            "a Drained node's pods are looked at now and then, not every pass"
        )
        assert not [e for e in cluster.event_log if e["reason"] == "NodeDrained"]

        cluster.refuse_events = False  # the quota frees up: the Event is said, once
        ctx.steps.drain.checked.clear()  # as if the recheck period passed
        for _ in range(3):
            await reconciler.reconcile_node(ctx, "n", "timer")
        drained = [e for e in cluster.event_log if e["reason"] == "NodeDrained"]
        assert len(drained) == 1, drained
        assert action(cluster, "n") == "Drained"

    asyncio.run(scenario())


def said(cluster: drain_cluster.DrainCluster, reason: str) -> list[int]:
    """Where in the Event log each Event of `reason` was said."""
    return [i for i, e in enumerate(cluster.event_log) if e["reason"] == reason]


RECOVERING = drain_cluster.drain_spec("gpu", recovery={"uncordon": True, "healthyForSeconds": 1})


async def _drained_unsaid(cluster: drain_cluster.DrainCluster) -> context.Context:
    """Node `n` cordoned and emptied by policy `p`'s drain while every Event was refused."""
    ctx = await drain_cluster.start(cluster, {"p": RECOVERING}, {"n": {"pool": "gpu"}})
    cluster.add_pod("n", "job")
    cluster.refuse_events = True
    await drain_cluster.report(cluster, ctx, "n", ecc=1)
    await asyncio.wait({ctx.steps.drain.tasks["n"]}, timeout=5)
    assert cluster.pods == {}, "the pod was evicted"
    return ctx


async def _uncordoned(cluster: drain_cluster.DrainCluster, ctx: context.Context) -> None:
    """The GPU repaired (a human reset it): the timer's passes until the policy uncordons the node."""
    await drain_cluster.report(cluster, ctx, "n", ecc=0)
    deadline = time.monotonic() + 10
    while cluster.nodes["n"]["spec"].get("unschedulable"):
        assert time.monotonic() < deadline, "not uncordoned after healthyForSeconds"
        await reconciler.reconcile_node(ctx, "n", "timer")
        await asyncio.sleep(0.05)


def test_a_drained_node_repaired_before_its_event_was_accepted_says_drained_before_its_uncordon() -> None:
    """The drain emptied the node while Events were refused; the GPU is repaired before the next look
    at the Drained node: NodeDrained is said once, before NodeUncordoned, not dropped with the cordon."""

    async def scenario() -> None:
        cluster = drain_cluster.DrainCluster()
        ctx = await _drained_unsaid(cluster)
        cluster.refuse_events = False
        await _uncordoned(cluster, ctx)
        drained, uncordoned = said(cluster, "NodeDrained"), said(cluster, "NodeUncordoned")
        assert len(drained) == 1 and len(uncordoned) == 1, cluster.event_log
        assert drained[0] < uncordoned[0]

    asyncio.run(scenario())


def test_a_drain_a_dead_term_finished_unsaid_is_said_by_the_next_term_before_the_uncordon() -> None:
    """The chaos test's seed 3441685228: the operator evicted the last pod and was killed before its
    NodeDrained Event (here: refused, then the term gone); the GPU was repaired before any term looked
    at the node again. The next term finds it cordoned by the policy, its drain started and the node
    empty: it says NodeDrained once, then uncordons. A node its drain did not empty is not said drained."""

    async def scenario(emptied: bool) -> None:
        cluster = drain_cluster.DrainCluster()
        await _drained_unsaid(cluster)
        cluster.refuse_events = False
        if not emptied:
            cluster.add_pod("n", "stayed")  # the drain stopped before it was done, say
        ctx = drain_cluster.make_context(cluster)  # the next term: nothing of the last one in memory
        await handlers.on_policy(
            drain_cluster.event("ADDED", drain_cluster.policy_body("p", RECOVERING)), memo=ctx
        )
        await drain_cluster.deliver(cluster, ctx, "n")
        await _uncordoned(cluster, ctx)
        drained, uncordoned = said(cluster, "NodeDrained"), said(cluster, "NodeUncordoned")
        assert len(uncordoned) == 1, cluster.event_log
        if emptied:
            assert len(drained) == 1 and drained[0] < uncordoned[0], cluster.event_log
            assert "Node drained by policy p" in cluster.event_log[drained[0]]["message"]
        else:
            assert drained == [], cluster.event_log

    asyncio.run(scenario(emptied=True))
    asyncio.run(scenario(emptied=False))


class OutageCluster(drain_cluster.DrainCluster):
    """The API server answers 503 to the next `outages` pod lists."""

    outages = 0

    async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        if method == "GET" and path == drain_cluster.PODS and self.outages:
            self.outages -= 1
            raise kube.ApiError(503, "ServiceUnavailable", "the API server is restarting")
        return await super().request(method, path, **kwargs)


def test_an_api_outage_while_the_next_term_looks_at_the_pods_keeps_the_cordon_until_it_answers() -> None:
    """The look at the pods before the uncordon fails: nothing is said and the cordon stays (no Drained
    said on missing data, no uncordon before it); the next pass, answered, says Drained then uncordons."""

    async def scenario() -> None:
        cluster = OutageCluster()
        await _drained_unsaid(cluster)
        cluster.refuse_events = False
        ctx = drain_cluster.make_context(cluster)
        await handlers.on_policy(
            drain_cluster.event("ADDED", drain_cluster.policy_body("p", RECOVERING)), memo=ctx
        )
        await drain_cluster.deliver(cluster, ctx, "n")
        await drain_cluster.report(cluster, ctx, "n", ecc=0)
        cluster.outages = 1_000
        deadline = time.monotonic() + 10
        while cluster.outages == 1_000:  # until healthyForSeconds passed and the uncordon looked
            assert time.monotonic() < deadline, "the uncordon never looked at the pods"
            await reconciler.reconcile_node(ctx, "n", "timer")  # a failed pass is logged, retried
            await asyncio.sleep(0.05)
        await reconciler.reconcile_node(ctx, "n", "timer")
        assert cluster.outages == 998, "each pass looks again"
        assert cluster.nodes["n"]["spec"].get("unschedulable"), "uncordoned without looking at the pods"
        assert said(cluster, "NodeDrained") == [] and said(cluster, "NodeUncordoned") == []
        cluster.outages = 0  # the API server answers again
        await _uncordoned(cluster, ctx)
        drained, uncordoned = said(cluster, "NodeDrained"), said(cluster, "NodeUncordoned")
        assert len(drained) == 1 and len(uncordoned) == 1 and drained[0] < uncordoned[0], cluster.event_log

    asyncio.run(scenario())
