"""The Node and GPUNode watches: list, then watch from the list's version; list again after 410 Gone;
events of one object in order, of different objects side by side.

A local HTTP server plays the API server's LIST and WATCH (the integration
tiers run them against a real one: every operator test there goes through them).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpuhealth_operator.client import kube
from gpuhealth_operator.runtime import watching
from watch_server import HANG, ApiServer, node

PATH = "/api/v1/nodes"


def run_watch(
    server: ApiServer,
    selector: str = "",
    quiet_seconds: float = watching.QUIET_SECONDS,
    since: str | None = None,
) -> tuple[list[tuple[object, str, str]], int]:
    """Run a Nodes watch against `server` until its last watch is open and every event is handled;
    the events handled (type, name, version) and how often it said it listed again."""
    seen: list[tuple[object, str, str]] = []
    relisted: list[int] = []

    async def handler(event: watching.Event) -> None:
        body = event["object"]
        assert isinstance(body, dict)
        seen.append((event["type"], body["metadata"]["name"], body["metadata"]["resourceVersion"]))

    async def scenario() -> None:
        async with server:
            client = kube.Kube(kube.Credentials(server.url, None, True, None, None, None))
            watch = watching.Watch(
                client,
                PATH,
                handler,
                label_selector=selector,
                relisted=lambda: relisted.append(1),
                quiet_seconds=quiet_seconds,
                since=since,
            )
            task = asyncio.create_task(watch.run())
            try:
                await asyncio.wait_for(server.open_watches.wait(), timeout=20)
                await asyncio.wait_for(watch.dispatcher.idle(), timeout=20)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await client.close()

    asyncio.run(scenario())
    return seen, len(relisted)


def test_lists_every_page_then_watches_from_the_lists_version_with_the_selector() -> None:
    server = ApiServer(
        [node("a", "3"), node("b", "4"), node("c", "5")],
        "7",
        [[{"type": "MODIFIED", "object": node("a", "8")}, {"type": "DELETED", "object": node("b", "9")}]],
    )
    seen, relisted = run_watch(server, selector="pool=a")
    assert sorted(seen[:3]) == [(None, "a", "3"), (None, "b", "4"), (None, "c", "5")]
    assert sorted(seen[3:]) == [("DELETED", "b", "9"), ("MODIFIED", "a", "8")]
    assert relisted == 0
    watches = [r for r in server.requests if r.get("watch") == "true"]
    assert [w["resourceVersion"] for w in watches] == ["7", "9"]  # resumed from the last event's version
    assert all(r.get("labelSelector") == "pool=a" for r in server.requests)
    assert all(w["allowWatchBookmarks"] == "true" for w in watches)


def test_bookmarks_move_the_version_and_reach_no_handler() -> None:
    server = ApiServer([node("a", "3")], "7", [[{"type": "BOOKMARK", "object": node("", "42")}]])
    seen, _ = run_watch(server)
    assert seen == [(None, "a", "3")]
    assert [r["resourceVersion"] for r in server.requests if r.get("watch") == "true"] == ["7", "42"]


def test_410_gone_lists_again_and_says_so_for_the_resync() -> None:
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}}
    server = ApiServer([node("a", "3")], "7", [[gone]])
    seen, relisted = run_watch(server)
    assert seen == [(None, "a", "3"), (None, "a", "3")]  # listed twice
    assert relisted == 1
    lists = [r for r in server.requests if r.get("watch") != "true"]
    assert len(lists) == 2


def test_a_watch_refused_with_410_lists_again_too() -> None:
    server = ApiServer([node("a", "3")], "7", [[{"kind": "Status", "status": 410, "code": 410}]])
    seen, relisted = run_watch(server)
    assert seen == [(None, "a", "3"), (None, "a", "3")]
    assert relisted == 1


def test_a_watch_started_from_primings_version_lists_nothing_and_watches_from_it() -> None:
    # The term's priming has just listed the kind into the cache: a second LIST would decode the whole
    # fleet again (10,000 objects at 5,000 nodes) to find nothing new.
    server = ApiServer([node("a", "3")], "7", [[{"type": "MODIFIED", "object": node("a", "8")}]])
    seen, relisted = run_watch(server, since="5")
    assert seen == [("MODIFIED", "a", "8")]
    assert relisted == 0
    assert [r.get("watch") for r in server.requests] == ["true", "true"]
    assert [r["resourceVersion"] for r in server.requests] == ["5", "8"]


@pytest.mark.parametrize(
    "gone",
    [
        [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}}],
        [{"kind": "Status", "status": 410, "code": 410}],
    ],
    ids=["410-event", "410-answer"],
)
def test_a_watch_whose_starting_version_is_gone_lists_and_says_so_for_the_resync(
    gone: list[dict[str, Any]],
) -> None:
    # Priming's version aged out before the watch began (a slow start-up at scale): what was deleted
    # since priming is in no list, so the resync must prune it, though this is the watch's first LIST.
    server = ApiServer([node("a", "3")], "7", [gone])
    seen, relisted = run_watch(server, since="5")
    assert seen == [(None, "a", "3")]
    assert relisted == 1


TOO_LARGE = {
    "type": "ERROR",
    "object": {
        "kind": "Status",
        "status": "Failure",
        "message": "Timeout: Too large resource version: 9, current: 8",
        "reason": "Timeout",
        "code": 504,
    },
}
"""What a watch gets when the API server's watch cache has not caught up with the version asked for (it
waited 3 s): a saturated API server's answer at scale, right after a LIST read from etcd."""


@pytest.mark.parametrize(
    ("script", "resumed_from"),
    [
        ([{"type": "MODIFIED", "object": node("a", "8")}, TOO_LARGE], "8"),
        ([{"kind": "Status", "status": 504, "code": 504}], "5"),
    ],
    ids=["504-event-after-an-event", "504-answer"],
)
def test_a_watch_cache_behind_is_waited_for_not_answered_with_a_list(
    script: list[dict[str, Any]], resumed_from: str
) -> None:
    # A LIST of the whole kind (and a resync after it) would add to the very load that keeps the cache
    # behind; the version is still good, so the watch asks again from where it got to.
    server = ApiServer([node("a", "3")], "7", [script])
    seen, relisted = run_watch(server, since="5")
    assert (None, "a", "3") not in seen
    assert relisted == 0
    assert [r.get("watch") for r in server.requests] == ["true", "true"]
    assert [r["resourceVersion"] for r in server.requests] == ["5", resumed_from]


def test_one_objects_events_are_handled_in_order_while_others_go_ahead() -> None:
    async def scenario() -> list[str]:
        order: list[str] = []
        first_may_finish = asyncio.Event()
        b_done = asyncio.Event()

        async def handler(event: watching.Event) -> None:
            label = str(event["type"])
            order.append(f"start {label}")
            if label == "a1":
                await first_may_finish.wait()
            order.append(f"end {label}")
            if label == "b1":
                b_done.set()

        dispatcher = watching.Dispatcher(handler, "nodes")
        dispatcher.put("a", {"type": "a1"})
        dispatcher.put("a", {"type": "a2"})  # waits for a1
        dispatcher.put("b", {"type": "b1"})  # does not
        await asyncio.wait_for(b_done.wait(), timeout=20)
        assert "start a2" not in order
        first_may_finish.set()
        await asyncio.wait_for(dispatcher.idle(), timeout=20)
        return order

    order = asyncio.run(scenario())
    assert order.index("end a1") < order.index("start a2")


def test_a_failing_handler_is_logged_and_the_objects_next_event_still_handled() -> None:
    async def scenario() -> list[str]:
        handled: list[str] = []

        async def handler(event: watching.Event) -> None:
            if event["type"] == "bad":
                raise RuntimeError("boom")
            handled.append(str(event["type"]))

        dispatcher = watching.Dispatcher(handler, "nodes")
        dispatcher.put("a", {"type": "bad"})
        dispatcher.put("a", {"type": "good"})
        await asyncio.wait_for(dispatcher.idle(), timeout=20)
        return handled

    assert asyncio.run(scenario()) == ["good"]


def test_a_watch_gone_silent_is_opened_again_from_its_last_version_without_listing() -> None:
    """A connection that died without closing (a load balancer failed over, a NAT entry expired) sends
    nothing, not even the bookmark the API server sends about every minute: after `quiet_seconds` the
    watch resumes from the last version it saw, and the events after it arrive."""
    server = ApiServer(
        [node("a", "3")],
        "7",
        [
            [{"type": "MODIFIED", "object": node("a", "8")}, HANG],
            [{"type": "MODIFIED", "object": node("a", "9")}],
        ],
    )
    seen, relisted = run_watch(server, quiet_seconds=0.5)
    assert seen == [(None, "a", "3"), ("MODIFIED", "a", "8"), ("MODIFIED", "a", "9")]
    assert relisted == 0
    assert len([r for r in server.requests if r.get("watch") != "true"]) == 1, "no second LIST"
    assert [r["resourceVersion"] for r in server.requests if r.get("watch") == "true"] == ["7", "8", "9"]
