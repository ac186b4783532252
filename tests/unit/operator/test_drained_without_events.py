"""`Drained` is state, an Event a report: a refused Event never keeps a node Draining (issue 24, item 11)."""

import asyncio

import drain_cluster
from gpuhealth_operator import reconciler


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
        await asyncio.wait({ctx.drains.tasks["n"]}, timeout=5)
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
        ctx.drains.checked.clear()  # as if the recheck period passed
        for _ in range(3):
            await reconciler.reconcile_node(ctx, "n", "timer")
        drained = [e for e in cluster.event_log if e["reason"] == "NodeDrained"]
        assert len(drained) == 1, drained
        assert action(cluster, "n") == "Drained"

    asyncio.run(scenario())
