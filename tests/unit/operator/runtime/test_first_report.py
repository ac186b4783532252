"""A GPUNode the agent has just created is new, not stale: the operator waits for its first report."""

import datetime

import pytest

from gpuhealth_operator.runtime import reconciler
from gpuhealth_operator.state import cache

NOW = datetime.datetime(2026, 11, 22, 12, 0, tzinfo=datetime.UTC)


def gpunode(created_seconds_ago: float | None, agent: bool) -> cache.GPUNodeRecord:
    body: dict[str, object] = {"metadata": {"name": "n", "uid": "u", "resourceVersion": "1"}}
    if created_seconds_ago is not None:
        created = NOW - datetime.timedelta(seconds=created_seconds_ago)
        body["metadata"]["creationTimestamp"] = created.strftime("%Y-%m-%dT%H:%M:%SZ")  # type: ignore[index]
    if agent:
        body["status"] = {"agent": {"lastHeartbeatTime": "2026-11-22T12:00:00Z"}}
    return cache.gpunode_record(body)


@pytest.mark.parametrize(
    ("created_seconds_ago", "agent", "waiting"),
    [
        (1, False, True),  # just created by the agent, its first status write is on the way
        (179, False, True),
        (181, False, False),  # three default heartbeats without a report: judged, and stale
        (1, True, False),  # it has reported: judge it
        (None, False, False),  # no creation time known: judge (and call it stale) rather than wait forever
    ],
)
def test_a_new_gpunode_waits_for_its_first_report(
    created_seconds_ago: float | None, agent: bool, waiting: bool
) -> None:
    assert reconciler.awaiting_first_report(gpunode(created_seconds_ago, agent), NOW) is waiting
