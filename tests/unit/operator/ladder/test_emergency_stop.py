"""An emergency stop: no eviction request once the drain is told to stop, and the cordon keeps its slot."""

import asyncio
import dataclasses
import datetime
import time
from typing import Any

import drain_cluster
import operator_context
from gpuhealth_api import keys
from gpuhealth_operator.client import drain, kube
from gpuhealth_operator.decisions import policies
from gpuhealth_operator.ladder import stopping
from gpuhealth_operator.runtime import handlers
from gpuhealth_operator.shared import context, settings
from gpuhealth_operator.state import cache

NOW = datetime.datetime(2026, 11, 26, tzinfo=datetime.UTC)
OPTIONS = drain.Options(
    grace_period_seconds=None,
    delete_empty_dir_data=True,
    backoff_initial_seconds=0.01,
    backoff_max_seconds=0.01,
    force=True,  # the test pods have no controller
)


class RefusingCluster:
    """One pod on the node whose eviction a PodDisruptionBudget always refuses (429); counts the requests."""

    def __init__(self) -> None:
        self.evictions = 0

    async def list_all(self, path: str, query: Any = None) -> list[dict[str, Any]]:
        return [{"metadata": {"name": "guarded", "namespace": "ns"}, "spec": {}}]

    async def create(self, path: str, body: Any) -> dict[str, Any]:
        self.evictions += 1
        raise kube.ApiError(
            429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget."
        )


def test_no_eviction_request_after_the_stop_and_the_drain_says_stopped() -> None:
    cluster = RefusingCluster()
    stop_after = 3

    async def scenario() -> drain.Result:
        return await drain.drain(
            cluster,  # type: ignore[arg-type]
            "n",
            options=OPTIONS,
            deadline=datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=5),
            semaphore=asyncio.Semaphore(4),
            should_stop=lambda: cluster.evictions >= stop_after,
        )

    result = asyncio.run(scenario())
    assert result.stopped and not result.completed
    assert cluster.evictions == stop_after


def test_a_drain_told_to_stop_before_it_starts_sends_nothing() -> None:
    cluster = RefusingCluster()
    result = asyncio.run(
        drain.drain(
            cluster,  # type: ignore[arg-type]
            "n",
            options=OPTIONS,
            deadline=datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=5),
            semaphore=asyncio.Semaphore(4),
            should_stop=lambda: True,
        )
    )
    assert result.stopped
    assert cluster.evictions == 0


def node(name: str, labels: dict[str, str], *, cordoned_by: str | None = None) -> dict[str, Any]:
    annotations = {keys.CORDONED_BY_ANNOTATION: cordoned_by} if cordoned_by else {}
    return {
        "metadata": {"name": name, "resourceVersion": "1", "labels": labels, "annotations": annotations},
        "spec": {"unschedulable": cordoned_by is not None},
    }


POLICY = policies.parse_policy(
    "p",
    1,
    {
        "nodeSelector": {"matchLabels": {"pool": "gpu"}},
        "maxUnavailable": 1,
        "rules": [{"name": "e", "condition": "EccUncorrectable", "action": "Drain"}],
    },
)


def test_an_excluded_node_keeps_its_cordons_budget_slot() -> None:
    nodes = cache.ClusterCache()
    nodes.put_policy(POLICY)
    nodes.put_node(node("a", {"pool": "gpu", keys.EXCLUDE_LABEL: "true"}, cordoned_by="p"))
    nodes.put_node(node("b", {"pool": "gpu"}))
    nodes.put_node(node("c", {"pool": "gpu", keys.EXCLUDE_LABEL: "true"}))  # excluded, schedulable
    nodes.put_node(node("d", {"pool": "cpu", keys.EXCLUDE_LABEL: "true"}, cordoned_by="p"))  # not matched
    nodes.put_node(node("e", {"pool": "gpu", keys.EXCLUDE_LABEL: "true"}, cordoned_by="p"))  # no agent
    for name in "abcd":
        nodes.put_gpunode({"metadata": {"name": name, "resourceVersion": "1"}, "status": {}}, NOW)
    selection = nodes.selection(POLICY)
    assert selection.selected == {"b"}
    assert selection.unavailable == {"a"}
    # A human uncordons the excluded node: its capacity is back, so is the budget slot.
    uncordoned = node("a", {"pool": "gpu", keys.EXCLUDE_LABEL: "true"}, cordoned_by="p")
    uncordoned["metadata"]["resourceVersion"] = "2"
    uncordoned["spec"]["unschedulable"] = False
    nodes.put_node(uncordoned)
    assert selection.unavailable == set()


def make_context() -> context.Context:
    client = kube.Kube(kube.Credentials("https://127.0.0.1:1", None, True, None, None, None))
    return operator_context.new_context(client)


def test_why_stop_names_each_emergency_stop() -> None:
    ctx = make_context()
    ctx.cache.put_policy(POLICY)
    ctx.cache.put_node(node("n", {"pool": "gpu"}, cordoned_by="p"))
    assert stopping.why_stop(ctx, "p", "n") is None
    ctx.cache.put_policy(dataclasses.replace(POLICY, dry_run=True))
    assert "dry run" in (stopping.why_stop(ctx, "p", "n") or "")
    ctx.cache.remove_policy("p")
    assert "deleted" in (stopping.why_stop(ctx, "p", "n") or "")
    ctx.cache.put_policy(POLICY)
    excluded = node("n", {"pool": "gpu", keys.EXCLUDE_LABEL: "true"}, cordoned_by="p")
    excluded["metadata"]["resourceVersion"] = "2"
    ctx.cache.put_node(excluded)
    assert keys.EXCLUDE_LABEL in (stopping.why_stop(ctx, "p", "n") or "")
    ctx.cache.remove_node("n")
    assert stopping.why_stop(ctx, "p", "n") == "the node is gone"


class AdoptingCluster:
    """Answers the requests of an adoption: the old policy's GET, the Node's JSON patch, the Event."""

    def __init__(self, *, old_policy_exists: bool) -> None:
        self.old_policy_exists = old_policy_exists
        self.patches: list[Any] = []
        self.events: list[dict[str, Any]] = []

    async def get(self, path: str, query: Any = None) -> dict[str, Any]:
        if self.old_policy_exists:
            return {"metadata": {"name": path.rsplit("/", 1)[1]}}
        raise kube.ApiError(404, "NotFound", "gpuhealthpolicies not found")

    async def patch(self, path: str, body: Any, **_: Any) -> dict[str, Any]:
        self.patches.append(body)
        adopted = node("n", {"pool": "gpu"}, cordoned_by="p")
        adopted["metadata"]["resourceVersion"] = "2"
        return adopted

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.events.append(body)
        return body


def adopting_context(cluster: AdoptingCluster, owner: str) -> context.Context:
    ctx = make_context()
    ctx.client = cluster  # type: ignore[assignment]
    ctx.recorder.client = cluster  # type: ignore[assignment]
    ctx.cache.put_policy(POLICY)
    orphan = node("n", {"pool": "gpu"}, cordoned_by=owner)
    orphan["metadata"]["annotations"]["gpuhealth.io/drain-started"] = "2026-01-01T00:00:00Z"
    ctx.cache.put_node(orphan)
    return ctx


def test_a_cordon_of_a_deleted_policy_is_adopted_with_a_fresh_drain() -> None:
    cluster = AdoptingCluster(old_policy_exists=False)
    ctx = adopting_context(cluster, owner="old")
    asyncio.run(stopping.adopt(ctx, "p", "n"))
    (ops,) = cluster.patches
    assert {"op": "test", "path": "/metadata/annotations/gpuhealth.io~1cordoned-by", "value": "old"} in ops
    assert {"op": "replace", "path": "/metadata/annotations/gpuhealth.io~1cordoned-by", "value": "p"} in ops
    assert {"op": "remove", "path": "/metadata/annotations/gpuhealth.io~1drain-started"} in ops
    record = ctx.cache.node("n")
    assert record is not None and record.view.cordoned_by == "p"
    assert [e["reason"] for e in cluster.events] == ["NodeCordoned"]
    assert "adopts the cordon of deleted policy old" in cluster.events[0]["message"]


def test_a_cordon_is_not_adopted_while_its_policy_exists_even_if_the_cache_lags() -> None:
    cluster = AdoptingCluster(old_policy_exists=True)
    ctx = adopting_context(cluster, owner="old")
    asyncio.run(stopping.adopt(ctx, "p", "n"))
    assert cluster.patches == [] and cluster.events == []


def test_a_node_that_leaves_the_policys_selection_stops_its_drain_at_once() -> None:
    """Relabelled out of the policy's selector: no eviction request after the change (issue 24, item 4)."""

    async def scenario() -> None:
        cluster = drain_cluster.DrainCluster()
        ctx = await drain_cluster.start(
            cluster, {"p": drain_cluster.drain_spec("gpu")}, {"n": {"pool": "gpu"}}
        )
        cluster.add_pod("n", "guarded")
        cluster.guarded.add("work/guarded")
        await drain_cluster.report(cluster, ctx, "n", ecc=1)
        drain_task = ctx.steps.drain.tasks["n"]
        await drain_cluster.until(lambda: len(cluster.evictions) >= 3)
        await drain_cluster.node_changed(cluster, ctx, "n", pool="cpu")
        changed = time.monotonic()
        await asyncio.wait({drain_task}, timeout=2)
        assert drain_task.done(), "the drain goes on after the policy stopped selecting the node"
        after = [key for at, key in cluster.evictions if at > changed]
        assert after == [], f"{len(after)} eviction requests after the node left the selection"
        assert cluster.nodes["n"]["spec"]["unschedulable"] is True, "the cordon stays"
        (paused,) = [e for e in cluster.event_log if e["reason"] == "RemediationPaused"]
        assert "no longer selects the node" in paused["message"], paused["message"]

    asyncio.run(scenario())


def test_a_narrowed_selector_stops_the_drain_but_another_selecting_policy_may_drain() -> None:
    """Two policies select the node; one narrows its selector: its drain stops, the other's path is intact."""

    async def scenario() -> None:
        cluster = drain_cluster.DrainCluster()
        wide = drain_cluster.drain_spec("gpu", nodeSelector={"matchLabels": {"site": "a"}})
        ctx = await drain_cluster.start(
            cluster, {"p": drain_cluster.drain_spec("gpu"), "q": wide}, {"n": {"pool": "gpu", "site": "a"}}
        )
        cluster.add_pod("n", "guarded")
        cluster.guarded.add("work/guarded")
        await drain_cluster.report(cluster, ctx, "n", ecc=1)
        first = ctx.steps.drain.tasks["n"]
        stopped_policy = ctx.steps.drain.policies["n"]
        await drain_cluster.until(lambda: len(cluster.evictions) >= 2)
        body = drain_cluster.policy_body(stopped_policy, drain_cluster.drain_spec("elsewhere"))
        body["metadata"]["generation"] = 2
        await handlers.on_policy(drain_cluster.event("MODIFIED", body), memo=ctx)
        await asyncio.wait({first}, timeout=2)
        assert first.done(), f"policy {stopped_policy} no longer selects the node but its drain goes on"
        other = "q" if stopped_policy == "p" else "p"
        assert stopping.why_stop(ctx, other, "n") is None, "the other policy still selects the node"
        assert stopping.why_stop(ctx, stopped_policy, "n") is not None
        for task in ctx.steps.drain.tasks.values():
            task.cancel()

    asyncio.run(scenario())


def test_a_drained_node_drained_again_after_a_restart_stops_at_once_on_the_exclude_label() -> None:
    """A node drained before a restart gets a pod; the new process drains it again (Drained means
    empty), a PodDisruptionBudget holds the eviction back, and a human sets the exclude label: that
    drain stops at once and says so, as any other drain of ours (issue 24, item 4), not after its
    backoff (up to 30 s) runs out."""

    async def scenario() -> None:
        cluster = drain_cluster.DrainCluster()
        ctx = await drain_cluster.start(
            cluster, {"p": drain_cluster.drain_spec("gpu")}, {"n": {"pool": "gpu"}}
        )
        await drain_cluster.report(cluster, ctx, "n", ecc=1)
        await drain_cluster.until(lambda: "n" in ctx.steps.drain.results)
        await drain_cluster.report(cluster, ctx, "n", ecc=1)  # the next pass sees the drain ended
        assert cluster.gpunodes["n"]["status"]["action"] == "Drained"

        # A restart: a new process over the same cluster; a pod landed on the node meanwhile.
        cluster.add_pod("n", "late")
        cluster.guarded.add("work/late")
        config = settings.Settings(eviction_backoff_initial_seconds=30, eviction_backoff_max_seconds=30)
        restarted = operator_context.new_context(cluster, config=config, instance="t2")  # type: ignore[arg-type]
        policy = drain_cluster.policy_body("p", drain_cluster.drain_spec("gpu"))
        await handlers.on_policy(drain_cluster.event("ADDED", policy), memo=restarted)
        await drain_cluster.deliver(cluster, restarted, "n")
        await drain_cluster.report(cluster, restarted, "n", ecc=1)
        drain_task = restarted.steps.drain.tasks["n"]
        await drain_cluster.until(lambda: any(key == "work/late" for _, key in cluster.evictions))

        await drain_cluster.node_changed(cluster, restarted, "n", **{keys.EXCLUDE_LABEL: "true"})
        await asyncio.wait({drain_task}, timeout=1)
        assert drain_task.done(), "the drain after the restart goes on under the exclude label"
        assert cluster.nodes["n"]["spec"]["unschedulable"] is True, "the cordon stays"
        (paused,) = [e for e in cluster.event_log if e["reason"] == "RemediationPaused"]
        assert keys.EXCLUDE_LABEL in paused["message"], paused["message"]

    asyncio.run(scenario())
