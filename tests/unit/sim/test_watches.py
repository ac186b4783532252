"""A follower's bookkeeping across a fresh list: what was deleted while no watch was open."""

import json
from typing import Any

from gpuhealth_sim import watches


class Listed:
    """A list response as the client hands it over unparsed (`_preload_content=False`)."""

    def __init__(self, *names: str) -> None:
        items = [{"metadata": {"name": n, "resourceVersion": "1"}} for n in names]
        self.data = json.dumps({"items": items, "metadata": {"resourceVersion": "9"}}).encode()

    def release_conn(self) -> None:
        pass


def test_an_object_deleted_between_two_lists_is_handed_over_as_deleted() -> None:
    answers = [Listed("a", "b", "c"), Listed("b")]
    seen: list[tuple[str, str]] = []

    def handler(kind: str, obj: dict[str, Any], _at: float) -> None:
        seen.append((kind, obj["metadata"]["name"]))

    follower = watches.Follower("nodes", lambda **_: answers.pop(0), handler)
    assert follower._list() == "9"
    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c")]
    seen.clear()
    follower._list()  # a 410 Gone: the watch could not resume
    assert seen == [("DELETED", "a"), ("DELETED", "c"), ("ADDED", "b")]
