"""What makes the operator write a GPUNode status, and what makes a reconcile run again.

Steady heartbeats of a healthy fleet must write nothing: the AgentStale message
holds no clock time, and straggler jitter below a step is not a change. A report
that the answer to our own status write already carries is judged again.
"""

from typing import Any

import pytest

from gpuhealth_operator.decisions import signals, times
from gpuhealth_operator.runtime import reconciler
from gpuhealth_operator.state import cache


def status(score: float = 0.99, z: float = -0.3, peers: int = 7) -> dict[str, Any]:
    return {
        "health": "Healthy",
        "issues": "",
        "action": "None",
        "conditions": [],
        "straggler": {"score": score, "zScore": z, "peers": peers},
    }


@pytest.mark.parametrize(
    ("desired", "differs"),
    [
        (status(), False),
        (status(score=0.985, z=0.4), False),  # sample-to-sample jitter
        (status(score=0.93, z=-2.1), False),  # GPU Boost: several percent of clock, sample to sample
        (status(peers=8), False),  # one peer more: its agent back from a restart
        (status(peers=6), False),
        (status(score=0.88), True),  # a tenth of the clock: the straggler scale
        (status(z=-3.3), True),
        (status(peers=9), True),  # a quarter of the cohort
        (status(peers=3), True),  # too few peers to judge anyone now
        ({**status(), "health": "Degraded"}, True),  # any other change writes the latest score too
    ],
)
def test_straggler_jitter_alone_writes_no_status(desired: dict[str, Any], differs: bool) -> None:
    assert reconciler._differs(status(), desired) is differs


def test_a_status_without_a_valid_written_score_is_rewritten() -> None:
    assert reconciler._differs({**status(), "straggler": {"score": "x", "zScore": 0, "peers": 7}}, status())
    assert reconciler._differs({**status(), "straggler": None}, status())
    no_peers = {"score": 0.99, "zScore": 0, "peers": True}
    assert reconciler._differs({**status(), "straggler": no_peers}, status())


def test_a_cohort_back_to_judging_size_is_written() -> None:
    assert reconciler._differs(status(peers=3), status(peers=4))
    assert not reconciler._differs(status(peers=0), status(peers=0))


def test_the_agent_stale_message_does_not_change_with_each_heartbeat() -> None:
    facts: Any = {"agent": {"lastHeartbeatTime": "2026-11-23T10:00:00Z", "heartbeatSeconds": 60}}
    later: Any = {"agent": {"lastHeartbeatTime": "2026-11-23T10:01:00Z", "heartbeatSeconds": 60}}
    now = times.parse("2026-11-23T10:01:05Z")
    assert now is not None
    first = signals.agent_stale(facts, 5.0, now)
    second = signals.agent_stale(later, 5.0, now)
    assert first.present is False
    assert first.message == second.message


def record(rv: str, gpus: list[dict[str, Any]], health: str = "Healthy") -> cache.GPUNodeRecord:
    body = {
        "metadata": {"name": "n", "uid": "u", "resourceVersion": rv},
        "status": {"agent": {"lastHeartbeatTime": "2026-11-23T10:00:00Z"}, "gpus": gpus, "health": health},
    }
    return cache.gpunode_record(body)


def test_a_new_report_under_our_own_write_is_judged_again() -> None:
    judged = record("1", [{"index": 0}])
    assert not reconciler.new_report(judged, judged)
    assert not reconciler.new_report(judged, record("2", [{"index": 0}], health="Degraded"))  # our write
    assert reconciler.new_report(judged, record("3", [{"index": 0, "ecc": {"uncorrectedVolatile": 1}}]))
