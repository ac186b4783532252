"""After a watch gap the operator forgets what was deleted unseen, and only that.

`resync.gone` is the pure diff; `resync.resync` is driven here with a stub
LIST answer, to show that a pruned cordoned node gives its budget place back
and its memory (drain task, result, lock) goes.
"""

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

import operator_context
from gpuhealth_api import keys
from gpuhealth_operator.client import drain, kube
from gpuhealth_operator.runtime import handlers, resync
from gpuhealth_operator.shared import settings


def test_gone_is_what_was_cached_and_is_not_listed() -> None:
    cached = {"a": "5", "b": "6", "c": "7"}
    assert resync.gone({"a", "b", "c"}, cached, {"b"}, "10") == ["a", "c"]


def test_gone_keeps_what_was_cached_after_the_list_was_sent() -> None:
    # "new" was created while we listed: the watch put it in the cache, the list did not see it.
    assert resync.gone({"old"}, {"old": "5", "new": "11"}, set(), "10") == ["old"]


def test_gone_keeps_an_object_cached_from_a_version_newer_than_the_list() -> None:
    # Deleted and created again under the same name while we listed.
    assert resync.gone({"n"}, {"n": "12"}, set(), "10") == []


def test_gone_prunes_when_the_cache_does_not_know_the_version() -> None:
    assert resync.gone({"p"}, {"p": None}, set(), "10") == ["p"]


def test_gone_keeps_what_it_cannot_compare() -> None:
    assert resync.gone({"n"}, {"n": "abc"}, set(), "10") == []


def test_nothing_is_gone_when_everything_is_listed() -> None:
    assert resync.gone({"a"}, {"a": "5"}, {"a", "z"}, "10") == []


class Listed(kube.Kube):
    """A client whose LISTs answer with fixed names (two pages for Nodes), and which writes nothing."""

    def __init__(self, names: Mapping[str, list[str]]) -> None:
        super().__init__(kube.Credentials("https://127.0.0.1:1", None, True, None, None, None))
        self.names = names

    async def get(self, path: str, query: Mapping[str, str] | None = None) -> Any:
        items = [{"metadata": {"name": n}} for n in self.names[path]]
        if path == resync.NODES_PATH and not (query or {}).get("continue"):
            return {"metadata": {"resourceVersion": "100", "continue": "more"}, "items": items[:1]}
        if path == resync.NODES_PATH:
            return {"metadata": {"resourceVersion": "100"}, "items": items[1:]}
        return {"metadata": {"resourceVersion": "100"}, "items": items}

    list_names = get  # names are all a resync reads


def node(name: str, cordoned: bool) -> dict[str, Any]:
    annotations = {keys.CORDONED_BY_ANNOTATION: "p"} if cordoned else {}
    return {
        "metadata": {
            "name": name,
            "resourceVersion": "50",
            "labels": {"pool": "gpu"},
            "annotations": annotations,
        },
        "spec": {"unschedulable": cordoned},
    }


def test_resync_frees_the_budget_place_and_memory_of_a_node_deleted_unseen() -> None:
    async def scenario() -> None:
        client = Listed(
            {
                resync.NODES_PATH: ["kept", "other"],
                resync.GPUNODES_PATH: ["kept", "other"],
                resync.POLICIES_PATH: [],
            }
        )
        ctx = operator_context.new_context(client)
        for name, cordoned in (("kept", False), ("other", False), ("deleted", True)):
            ctx.cache.put_node(node(name, cordoned))
            ctx.cache.put_gpunode({"metadata": {"name": name, "resourceVersion": "50"}}, ctx.clock())
        handlers.store_policy(
            ctx,
            {
                "metadata": {"name": "p", "generation": 1},
                "spec": {
                    "nodeSelector": {"matchLabels": {"pool": "gpu"}},
                    "maxUnavailable": 1,
                    "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}],
                },
            },
        )
        policy = ctx.cache.policies["p"]
        assert ctx.cache.selection(policy).unavailable == {"deleted"}
        ctx.node_locks["deleted"]
        ctx.steps.drain.tasks["deleted"] = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
        ctx.steps.drain.results["deleted"] = drain.Result(completed=True, blocking=(), evicted=1, skipped=())
        ctx.admission.notified.add(("p", "other"))

        pruned = await resync.resync(ctx)

        assert pruned == {"nodes": ["deleted"], "gpunodes": ["deleted"], "policies": ["p"]}
        assert set(ctx.cache.nodes) == {"kept", "other"}
        assert set(ctx.cache.gpunodes) == {"kept", "other"}
        assert "deleted" not in ctx.node_locks
        assert "deleted" not in ctx.steps.drain
        assert "deleted" not in ctx.steps.drain.results
        assert ctx.cache.policies == {}
        assert not ctx.admission.notified

    asyncio.run(scenario())


def test_resync_keeps_a_policy_that_is_listed_and_frees_its_place() -> None:
    async def scenario() -> None:
        client = Listed(
            {resync.NODES_PATH: ["kept", "x"], resync.GPUNODES_PATH: ["kept"], resync.POLICIES_PATH: ["p"]}
        )
        ctx = operator_context.new_context(client)
        for name, cordoned in (("kept", False), ("deleted", True)):
            ctx.cache.put_node(node(name, cordoned))
            ctx.cache.put_gpunode({"metadata": {"name": name, "resourceVersion": "50"}}, ctx.clock())
        handlers.store_policy(
            ctx,
            {
                "metadata": {"name": "p", "generation": 1},
                "spec": {
                    "nodeSelector": {"matchLabels": {"pool": "gpu"}},
                    "maxUnavailable": 1,
                    "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}],
                },
            },
        )
        selection = ctx.cache.selection(ctx.cache.policies["p"])
        assert selection.unavailable == {"deleted"}
        await resync.resync(ctx)
        assert set(ctx.cache.policies) == {"p"}
        assert selection.selected == {"kept"}
        assert selection.unavailable == set()

    asyncio.run(scenario())


def test_an_object_listed_again_asks_for_a_resync_and_the_terms_first_listing_does_not() -> None:
    async def scenario() -> None:
        relists = resync.Relists()
        body = {"kind": "Node", "metadata": {"name": "n", "uid": "u1"}}
        other = {"kind": "GPUNode", "metadata": {"name": "n", "uid": "u2"}}
        await relists.on_event({"type": None, "object": body})
        await relists.on_event({"type": None, "object": other})
        await relists.on_event({"type": "MODIFIED", "object": body})
        assert not relists.wanted.is_set(), "kopf's first listing: the term's priming just listed"
        await relists.on_event({"type": None, "object": body})
        assert relists.wanted.is_set()

    asyncio.run(scenario())


def test_an_object_a_watch_showed_then_listed_asks_for_a_resync() -> None:
    async def scenario() -> None:
        relists = resync.Relists()
        created = {"kind": "Node", "metadata": {"name": "new", "uid": "u3"}}
        await relists.on_event({"type": "ADDED", "object": created})
        assert not relists.wanted.is_set()
        await relists.on_event({"type": None, "object": created})  # kopf listed again after a 410
        assert relists.wanted.is_set()

    asyncio.run(scenario())


def test_the_periodic_resync_prunes_without_any_relist() -> None:
    async def scenario() -> None:
        client = Listed({resync.NODES_PATH: ["kept"], resync.GPUNODES_PATH: [], resync.POLICIES_PATH: []})
        config = settings.Settings(resync_seconds=0.05)
        ctx = operator_context.new_context(client, config=config)
        ctx.cache.put_node(node("kept", False))
        ctx.cache.put_node(node("deleted", True))
        task = asyncio.create_task(resync.run(ctx, resync.Relists()))
        try:
            for _ in range(100):
                if "deleted" not in ctx.cache.nodes:
                    break
                await asyncio.sleep(0.02)
        finally:
            task.cancel()
        assert set(ctx.cache.nodes) == {"kept"}

    asyncio.run(scenario())


def test_a_relist_resyncs_long_before_the_period(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resync, "SETTLE_SECONDS", 0.0)

    async def scenario() -> None:
        client = Listed({resync.NODES_PATH: ["kept"], resync.GPUNODES_PATH: [], resync.POLICIES_PATH: []})
        ctx = operator_context.new_context(client)
        ctx.cache.put_node(node("kept", False))
        ctx.cache.put_node(node("deleted", True))
        relists = resync.Relists()
        task = asyncio.create_task(resync.run(ctx, relists))
        try:
            await asyncio.sleep(0.1)
            assert "deleted" in ctx.cache.nodes, "no resync before a relist (the period is 300 s)"
            for _ in range(2):  # listed at the term's start, then again after a watch gap
                await relists.on_event({"type": None, "object": {"metadata": {"name": "kept"}}})
            for _ in range(100):
                if "deleted" not in ctx.cache.nodes:
                    break
                await asyncio.sleep(0.02)
        finally:
            task.cancel()
        assert set(ctx.cache.nodes) == {"kept"}

    asyncio.run(scenario())
