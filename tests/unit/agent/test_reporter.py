"""When the agent writes its GPUNode status, and how it rides out API outages (no cluster: a fake client)."""

import copy
import itertools
import random
from typing import Any

import pytest
from kubernetes.client import exceptions as k8s_exceptions

from gpuhealth_agent import backoff, changes, reporter
from gpuhealth_api import status


class FakeCluster:
    def __init__(self) -> None:
        self.node_reads = 0
        self.ensured: list[str] = []
        self.writes: list[status.GPUNodeStatus] = []
        self.down = False
        self.missing_gpunode = False

    def read_node(self) -> tuple[str, int | None]:
        if self.down:
            raise ConnectionRefusedError("connection refused")
        self.node_reads += 1
        return "uid-1", 8

    def read_status(self) -> status.GPUNodeStatus | None:
        if self.missing_gpunode or not self.writes:
            return None
        return copy.deepcopy(self.writes[-1])

    def ensure_gpunode(self, node_uid: str) -> None:
        self.ensured.append(node_uid)
        self.missing_gpunode = False

    def apply_status(self, node_status: status.GPUNodeStatus) -> None:
        if self.down:
            raise ConnectionRefusedError("connection refused")
        if self.missing_gpunode:
            raise k8s_exceptions.ApiException(status=404, reason="Not Found")
        self.writes.append(copy.deepcopy(node_status))


def node_status(
    temperature: int = 40, ecc: int = 0, reasons: list[str] | None = None
) -> status.GPUNodeStatus:
    gpu = status.GPUStatus(
        index=0,
        uuid="GPU-1",
        temperatureCelsius=temperature,
        slowdownTemperatureCelsius=87,
        powerWatts=300.0 + temperature,
        utilizationPercent=temperature % 100,
        ecc={"uncorrectedVolatile": ecc},
        clockEventReasons=reasons or [],
    )
    return status.GPUNodeStatus(
        agent=status.AgentInfo(version="0.1.0", backend="sim", heartbeatSeconds=60),
        summary=changes.summarize([gpu]),
        gpus=[gpu],
    )


def make(heartbeat: float = 60) -> tuple[reporter.Reporter, FakeCluster]:
    cluster = FakeCluster()
    retry = backoff.Backoff(base_seconds=1, cap_seconds=30, rng=random.Random(7))
    return reporter.Reporter(cluster, heartbeat_seconds=heartbeat, retry=retry), cluster


def test_first_report_creates_the_gpunode_then_writes() -> None:
    rep, cluster = make()
    outcome = rep.report(100, node_status())
    assert outcome == reporter.Outcome(changes.WriteReason.FIRST, written=True)
    assert cluster.ensured == ["uid-1"]
    assert rep.expected_gpus == 8
    assert cluster.writes[0]["agent"]["lastHeartbeatTime"] == "1970-01-01T00:01:40.000000Z"


def test_steady_state_writes_only_on_the_heartbeat() -> None:
    rep, cluster = make(heartbeat=60)
    for second in range(0, 181, 5):
        # Temperature, power and utilisation wiggle below the slowdown threshold: noise, not news.
        rep.report(float(second), node_status(temperature=40 + second % 7))
    reasons = [w["agent"]["lastHeartbeatTime"] for w in cluster.writes]
    assert len(cluster.writes) == 4, reasons  # first + heartbeats at 60, 120, 180
    assert cluster.node_reads == 1


@pytest.mark.parametrize(
    "changed",
    [
        node_status(ecc=1),
        node_status(temperature=90),  # crossed the slowdown threshold
        node_status(reasons=["HwThermalSlowdown"]),
    ],
    ids=["counter", "threshold", "throttle"],
)
def test_a_significant_change_is_written_at_once(changed: status.GPUNodeStatus) -> None:
    rep, cluster = make()
    rep.report(0, node_status())
    outcome = rep.report(1, changed)
    assert outcome.reason is changes.WriteReason.CHANGE
    assert outcome.written
    assert len(cluster.writes) == 2


def test_idle_reason_toggling_is_not_a_change() -> None:
    rep, _ = make()
    rep.report(0, node_status())
    assert rep.report(1, node_status(reasons=["GpuIdle"])).reason is None


def test_outage_backs_off_keeps_going_and_sends_the_latest_state_when_the_api_returns() -> None:
    rep, cluster = make()
    rep.report(0, node_status())
    cluster.down = True
    failed = rep.report(1, node_status(ecc=1))
    assert failed.error is not None and "ConnectionRefusedError" in failed.error
    assert failed.retry_in_seconds is not None and 0.5 <= failed.retry_in_seconds <= 1
    attempts_at = []
    for second in range(2, 40):
        outcome = rep.report(float(second), node_status(ecc=min(second, 5)))
        if outcome.error is not None:
            attempts_at.append(second)
    gaps = [b - a for a, b in itertools.pairwise(attempts_at)]
    assert gaps == sorted(gaps), f"backoff should grow: attempts at {attempts_at}"
    assert len(attempts_at) < 10, "backoff must not retry every turn"
    cluster.down = False
    # The retry comes as soon as the backoff allows, with the newest facts, though nothing changed since.
    for second in range(40, 80):
        outcome = rep.report(float(second), node_status(ecc=5))
        if outcome.written:
            break
    assert outcome.written and outcome.reason in {changes.WriteReason.RETRY, changes.WriteReason.CHANGE}
    assert cluster.writes[-1]["gpus"][0]["ecc"]["uncorrectedVolatile"] == 5
    assert second - 40 <= 30, "the cap bounds how long the latest state waits"
    assert rep.retry.failures == 0


def test_backoff_is_capped_and_jittered() -> None:
    retry = backoff.Backoff(base_seconds=1, cap_seconds=30, rng=random.Random(1))
    delays = [retry.failed(0) for _ in range(12)]
    assert all(0.5 <= d <= 30 for d in delays)
    assert max(delays[-4:]) <= 30 and min(delays[-4:]) >= 15
    assert len({round(d, 6) for d in delays[-4:]}) > 1, "jitter spreads agents that failed together"


def test_a_deleted_gpunode_is_recreated() -> None:
    rep, cluster = make()
    rep.report(0, node_status())
    cluster.missing_gpunode = True
    assert rep.report(1, node_status(ecc=1)).error == "HTTP 404 Not Found"
    for second in range(2, 10):
        if rep.report(float(second), node_status(ecc=1)).written:
            break
    assert cluster.ensured == ["uid-1", "uid-1"]
    assert cluster.writes[-1]["gpus"][0]["ecc"]["uncorrectedVolatile"] == 1


def test_a_missing_node_is_retried_not_fatal() -> None:
    rep, cluster = make()

    def no_node() -> Any:
        raise reporter.NodeMissingError("Node gpu-1 not found")

    cluster.read_node = no_node  # type: ignore[method-assign]
    outcome = rep.report(0, node_status())
    assert outcome.error == "NodeMissingError: Node gpu-1 not found"
    assert not cluster.writes


def test_write_reason_rules() -> None:
    state = changes.WriteState()
    assert changes.write_reason(state, "a", 0, 60) is changes.WriteReason.FIRST
    written = changes.WriteState("a", 0)
    assert changes.write_reason(written, "a", 59, 60) is None
    assert changes.write_reason(written, "a", 60, 60) is changes.WriteReason.HEARTBEAT
    assert changes.write_reason(written, "b", 1, 60) is changes.WriteReason.CHANGE
    pending = changes.WriteState("a", 0, pending=True)
    assert changes.write_reason(pending, "a", 1, 60) is changes.WriteReason.RETRY


def test_fingerprint_ignores_noise_and_heartbeat_time() -> None:
    a, b = node_status(temperature=41), node_status(temperature=45)
    b["agent"]["lastHeartbeatTime"] = "2030-01-01T00:00:00Z"
    b["gpus"][0]["observedTime"] = "2030-01-01T00:00:00Z"
    assert changes.fingerprint(a) == changes.fingerprint(b)
    lost = node_status()
    lost["gpus"][0]["lost"] = True
    assert changes.fingerprint(lost) != changes.fingerprint(a)


def test_summary() -> None:
    gpus = [
        status.GPUStatus(index=0, model="H100", temperatureCelsius=50),
        status.GPUStatus(index=1, model="H100", temperatureCelsius=71),
        status.GPUStatus(index=2, lost=True),
    ]
    assert changes.summarize(gpus) == {"gpuCount": 2, "model": "H100", "maxTemperatureCelsius": 71}
    assert changes.summarize([]) == {"gpuCount": 0}


@pytest.mark.parametrize(
    ("labels", "capacity", "expected"),
    [
        ({}, "8", None),  # the bare capacity tells nothing: time-slicing multiplies it
        ({}, "128", None),
        ({"nvidia.com/gpu.count": "8"}, "32", 8),
        ({"nvidia.com/gpu.replicas": "4"}, "32", 8),
        ({"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.count": "56"}, "56", None),
        ({"nvidia.com/gpu.replicas": "4"}, "lots", None),
    ],
)
def test_the_node_tells_its_physical_gpus_by_its_labels(
    labels: dict[str, str], capacity: str, expected: int | None
) -> None:
    node = {"metadata": {"labels": labels}, "status": {"capacity": {"nvidia.com/gpu": capacity}}}
    assert reporter.physical_gpus(node) == expected


def heartbeat_times(seed: int, heartbeat: float = 300, until: int = 3600) -> list[float]:
    cluster = FakeCluster()
    rep = reporter.Reporter(cluster, heartbeat_seconds=heartbeat, rng=random.Random(seed))
    written = []
    for second in range(until):
        if rep.report(float(second), node_status()).written:
            written.append(float(second))
    return written


def test_agents_started_together_spread_their_heartbeats_and_none_is_late() -> None:
    """A rollout (or an API outage every agent rode out) starts a fleet's agents within seconds:
    with one fixed period their heartbeats would hit the API server together for good."""
    fleet = [heartbeat_times(seed) for seed in range(20)]
    for written in fleet:
        gaps = [b - a for a, b in itertools.pairwise(written)]
        assert gaps and all((1 - reporter.HEARTBEAT_JITTER) * 300 - 1 <= gap <= 300 for gap in gaps), (
            gaps
        )  # never later than the heartbeat the operator times staleness by
    assert len({written[4] for written in fleet}) >= 10, "the fifth heartbeats still coincide"
