"""Announcements are exactly-once: an Event already there (409) was said; it is never bumped."""

import asyncio
from typing import Any, cast

from gpuhealth_operator.client import events, kube


class FakeEvents:
    """Event writes as the API server answers them: a name is created once, then 409; or every write fails."""

    def __init__(self, failing: bool = False) -> None:
        self.stored: dict[str, dict[str, Any]] = {}
        self.patches: list[str] = []
        self.failing = failing

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.failing:
            raise kube.ApiError(503, "ServiceUnavailable", "the API server is restarting")
        name = body["metadata"]["name"]
        if name in self.stored:
            raise kube.ApiError(409, "AlreadyExists", f"events {name} already exists")
        self.stored[name] = body
        return body

    async def patch(self, path: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.patches.append(path)
        return body


def recorder(fake: FakeEvents) -> events.Recorder:
    return events.Recorder(client=cast(kube.Kube, fake), instance="test")


def test_an_announcement_made_by_an_earlier_term_is_not_made_again_nor_counted() -> None:
    fake = FakeEvents()
    subject = events.Subject(node="gpu-1")
    t = "2026-11-23T19:00:00Z"
    first = asyncio.run(
        recorder(fake).announce(subject, "NodeCordoned", f"cordoned: Xid (cordoned at {t}).", t)
    )
    # The next term says it again, with other issues in its words: the same cordon, so the same Event.
    again = asyncio.run(
        recorder(fake).announce(subject, "NodeCordoned", f"cordoned: Ecc (cordoned at {t}).", t)
    )
    assert first and again
    assert len(fake.stored) == 1
    assert [e["count"] for e in fake.stored.values()] == [1]
    assert fake.patches == []


def test_another_cordon_or_reason_is_another_announcement() -> None:
    fake = FakeEvents()
    one = recorder(fake)
    subject = events.Subject(node="gpu-1")
    asyncio.run(one.announce(subject, "NodeCordoned", "cordoned", "2026-11-23T19:00:00Z"))
    asyncio.run(one.announce(subject, "NodeDrained", "drained", "2026-11-23T19:00:00Z"))
    asyncio.run(one.announce(subject, "NodeCordoned", "cordoned", "2026-11-23T19:05:00Z"))
    assert sorted(e["reason"] for e in fake.stored.values()) == [
        "NodeCordoned",
        "NodeCordoned",
        "NodeDrained",
    ]


def test_an_announcement_that_could_not_be_posted_is_reported_unsaid_without_raising() -> None:
    subject = events.Subject(node="gpu-1")
    said = asyncio.run(recorder(FakeEvents(failing=True)).announce(subject, "NodeDrained", "drained", "t"))
    assert said is False
