"""The agent loop with the simulated backend: events, metrics, reports, liveness."""

import copy
import itertools
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import prometheus_client
import pytest

from gpuhealth_agent import cli, health, metrics, reporter, runner, scenario, simulated, xids
from gpuhealth_api import faults, status

START = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.seconds = 0.0

    def scenario(self) -> float:
        return self.seconds

    def epoch(self) -> float:
        return START + self.seconds


class FakeCluster:
    def __init__(self, previous: status.GPUNodeStatus | None = None) -> None:
        self.writes: list[status.GPUNodeStatus] = []
        self.previous = previous

    def read_node(self) -> tuple[str, int | None]:
        return "uid", None

    def read_status(self) -> status.GPUNodeStatus | None:
        return copy.deepcopy(self.writes[-1]) if self.writes else self.previous

    def ensure_gpunode(self, node_uid: str) -> None:
        pass

    def apply_status(self, node_status: status.GPUNodeStatus) -> None:
        self.writes.append(copy.deepcopy(node_status))


def make(
    text: str, *, heartbeat: float = 60, with_metrics: bool = True
) -> tuple[runner.Agent, Clock, FakeCluster, Any]:
    clock = Clock()
    plan = scenario.parse(text)
    lib = simulated.library(plan, clock=clock.scenario, start=0.0, identity_seed="node-r")
    registry = prometheus_client.CollectorRegistry()
    cluster = FakeCluster()
    settings = runner.Settings(
        "node-r",
        runner.BACKEND_SIM,
        interval_seconds=1,
        heartbeat_seconds=heartbeat,
        expected_gpus=plan.expected_gpus,
        event_thread=False,
    )
    agent = runner.Agent(
        settings,
        lib,
        report=reporter.Reporter(cluster, heartbeat_seconds=heartbeat),
        agent_metrics=metrics.AgentMetrics(registry) if with_metrics else None,
        clock=clock.epoch,
    )
    return agent, clock, cluster, registry


def turn(agent: runner.Agent, clock: Clock, seconds: float) -> runner.TurnResult:
    clock.seconds = seconds
    return agent.run_once()


def test_an_xid_event_reaches_the_status_with_its_count() -> None:
    agent, clock, cluster, _ = make(
        "gpus: 2\ntimeline:\n- {after: 3s, gpu: 1, xid: 13}\n- {after: 4s, gpu: 1, xid: 13}\n"
    )
    turn(agent, clock, 0)
    result = turn(agent, clock, 4)
    assert result.events == 2
    assert result.status["gpus"][1]["xids"] == [
        {"code": 13, "count": 2, "lastSeen": "2027-01-15T08:00:04.000000Z"}
    ]
    assert result.outcome is not None and result.outcome.written
    assert cluster.writes[-1]["gpus"][1]["xids"][0]["count"] == 2


def test_xid_79_reports_the_gpu_lost_with_the_xid() -> None:
    agent, clock, cluster, _ = make("gpus: 8\ntimeline:\n- {after: 10s, gpu: 0, xid: 79}\n")
    turn(agent, clock, 0)
    gpu = turn(agent, clock, 10).status["gpus"][0]
    assert gpu["lost"] is True
    assert gpu["xids"] == [{"code": 79, "count": 1, "lastSeen": "2027-01-15T08:00:10.000000Z"}]
    assert cluster.writes[-1]["summary"]["gpuCount"] == 7
    assert cluster.writes[-1]["agent"]["expectedGpuCount"] == 8


def test_a_dbe_event_forces_the_slow_counters_to_be_read() -> None:
    agent, clock, _, _ = make(
        "gpus: 1\ntimeline:\n"
        "- {after: 2s, gpu: 0, set: {eccUncorrectedVolatile: 1, retiredPagesPending: true}}\n"
    )
    turn(agent, clock, 0)
    gpu = turn(agent, clock, 2).status["gpus"][0]
    assert gpu["retiredPages"]["pending"] is True  # slow tier, read at once because of the DBE event


def test_steady_state_writes_once_per_heartbeat() -> None:
    agent, clock, cluster, _ = make("gpus: 8\n", heartbeat=60)
    written = [second for second in range(0, 300) if (o := turn(agent, clock, second).outcome) and o.written]
    gaps = [b - a for a, b in itertools.pairwise(written)]
    assert len(cluster.writes) == len(written) >= 5, written
    # Every heartbeat, a little early at random (reporter.HEARTBEAT_JITTER), never late.
    assert all((1 - reporter.HEARTBEAT_JITTER) * 60 - 1 <= gap <= 60 for gap in gaps), written


def test_status_carries_agent_facts() -> None:
    agent, clock, _, _ = make("gpus: 2\ndriverVersion: 575.1.2\n", heartbeat=30)
    node = turn(agent, clock, 0).status
    assert node["agent"]["backend"] == "sim"
    assert node["agent"]["driverVersion"] == "575.1.2"
    assert node["agent"]["heartbeatSeconds"] == 30
    assert node["agent"]["expectedGpuCount"] == 2
    assert node["summary"] == {"gpuCount": 2, "model": scenario.DEFAULT_MODEL, "maxTemperatureCelsius": 40}


def test_metrics_show_gpu_facts_and_agent_health() -> None:
    agent, clock, _, registry = make(
        "gpus: 2\ntimeline:\n- {after: 1s, gpu: 1, xid: 48}\n"
        "- {after: 1s, gpu: 1, set: {eccUncorrectedVolatile: 1, clockEventReasons: [HwThermalSlowdown],"
        " recoveryAction: GpuReset, pcieWidth: 8}}\n"
        "- {after: 1s, gpu: 0, fail: {function: nvmlDeviceGetPowerUsage, error: Unknown}}\n"
    )
    turn(agent, clock, 0)
    turn(agent, clock, 1)
    value = registry.get_sample_value
    uuid = agent.collector.gpu_at(1).uuid
    gpu1 = {"gpu": "1", "uuid": uuid}
    assert value("gpuhealth_agent_gpu_temperature_celsius", gpu1) == 40
    assert value("gpuhealth_agent_gpu_ecc_errors", {**gpu1, "kind": "uncorrected", "scope": "volatile"}) == 1
    assert value("gpuhealth_agent_gpu_xid_errors_total", {**gpu1, "code": "48"}) == 1
    assert (
        value("gpuhealth_agent_gpu_clock_event_reason_active", {**gpu1, "reason": "HwThermalSlowdown"}) == 1
    )
    assert value("gpuhealth_agent_gpu_clock_event_reason_active", {**gpu1, "reason": "GpuIdle"}) == 0
    assert value("gpuhealth_agent_gpu_recovery_action", gpu1) == 1
    assert value("gpuhealth_agent_gpu_pcie_link_width", {**gpu1, "kind": "current"}) == 8
    assert value("gpuhealth_agent_gpu_pcie_link_width", {**gpu1, "kind": "max"}) == 16
    assert value("gpuhealth_agent_gpu_lost", gpu1) == 0
    assert (
        value(
            "gpuhealth_agent_nvml_errors_total", {"function": "nvmlDeviceGetPowerUsage", "error": "Unknown"}
        )
        == 1
    )
    assert value("gpuhealth_agent_collection_duration_seconds_count") == 2
    assert value("gpuhealth_agent_report_writes_total", {"reason": "first"}) == 1
    assert value("gpuhealth_agent_report_writes_total", {"reason": "change"}) == 1
    assert value("gpuhealth_agent_last_successful_report_timestamp_seconds") == START + 1
    assert value("gpuhealth_agent_gpus") == 2
    assert value("gpuhealth_agent_nvml_events_total", {"kind": "xid"}) == 1
    assert value("gpuhealth_agent_nvml_events_total", {"kind": "dbe"}) == 1


def test_agents_without_metrics_share_nothing() -> None:
    a, clock_a, _, _ = make("gpus: 1\n", with_metrics=False)
    b, clock_b, _, _ = make("gpus: 1\n", with_metrics=False)
    assert turn(a, clock_a, 0).status["gpus"][0]["uuid"] == turn(b, clock_b, 0).status["gpus"][0]["uuid"]


def test_two_agents_with_metrics_coexist_in_one_process() -> None:
    make("gpus: 1\n")
    make("gpus: 1\n")  # a second registry: no "Duplicated timeseries" error


def test_liveness_fails_after_three_missed_intervals() -> None:
    now = [100.0]
    live = health.Liveness(interval_seconds=5, clock=lambda: now[0], started_at=100.0)
    assert live.check()[0]
    now[0] = 116
    ok, message = live.check()
    assert not ok and "since start" in message
    live.completed(116)
    assert live.check()[0]
    now[0] = 131.1
    assert not live.check()[0]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_health_server_serves_metrics_and_healthz() -> None:
    agent, clock, _, registry = make("gpus: 1\n")
    wall = [START]
    agent.liveness.clock = lambda: wall[0]
    turn(agent, clock, 0)
    agent.liveness.completed(START)
    server = health.HealthServer(0, agent.liveness, registry, host="127.0.0.1").start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert _get(base + "/healthz") == (200, "ok\n")
        code, text = _get(base + "/metrics")
        assert code == 200
        assert "gpuhealth_agent_gpu_temperature_celsius{" in text
        wall[0] = START + 3.5  # 3 intervals of 1 s without a completed collection: a hung NVML call
        code, text = _get(base + "/healthz")
        assert code == 503
        assert "no completed GPU collection" in text
        assert _get(base + "/nope")[0] == 404
    finally:
        server.stop()


def test_run_forever_stops_on_request() -> None:
    agent, _, cluster, _ = make("gpus: 1\n")
    agent.clock = time.time
    thread = threading.Thread(target=agent.run_forever)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not cluster.writes and time.monotonic() < deadline:
            agent.wake.wait(0.05)
        assert cluster.writes, "the loop never reported"
    finally:
        agent.stop.set()
        agent.wake.set()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_the_catalogue_can_be_shared() -> None:
    shared = xids.Catalogue.packaged()
    clock = Clock()
    lib = simulated.library(scenario.parse("gpus: 1\n"), clock=clock.scenario, start=0.0)
    agent = runner.Agent(runner.Settings("n", event_thread=False), lib, catalogue=shared)
    assert agent.catalogue is shared


def test_the_agent_names_xids_from_the_api_catalogue() -> None:
    catalogue = xids.Catalogue.packaged()
    assert catalogue.lookup(79).critical and catalogue.lookup(79).action == "RESTART_BM"
    assert not catalogue.lookup(13).critical
    unknown = catalogue.lookup(9999)
    assert not unknown.critical
    assert unknown.action == "CONTACT_SUPPORT"
    assert len(catalogue) >= 25


def test_an_agent_restart_carries_xids_over_unless_the_gpu_was_reset() -> None:
    seed_sim = simulated.SimulatedNvml(scenario.parse("gpus: 3\n"), clock=lambda: 0.0, identity_seed="node-r")
    u0, u1, u2 = (seed_sim.uuid(i) for i in range(3))
    earlier = "2027-01-15T07:00:00.000000Z"
    previous = status.GPUNodeStatus(
        gpus=[
            status.GPUStatus(
                index=0, uuid=u0, lost=True, xids=[{"code": 79, "count": 1, "lastSeen": earlier}]
            ),
            status.GPUStatus(
                index=1,
                uuid=u1,
                ecc={"uncorrectedVolatile": 0},
                xids=[{"code": 13, "count": 4, "lastSeen": earlier}],
            ),
            status.GPUStatus(
                index=2,
                uuid=u2,
                ecc={"uncorrectedVolatile": 1},
                xids=[{"code": 48, "count": 1, "lastSeen": earlier}],
            ),
        ]
    )
    clock = Clock()
    plan = scenario.parse(
        "gpus: 3\ntimeline:\n- {after: 0s, gpu: 0, xid: 79}\n"
    )  # GPU 0 is still off the bus
    lib = simulated.library(plan, clock=clock.scenario, start=0.0, identity_seed="node-r")
    cluster = FakeCluster(previous=previous)
    agent = runner.Agent(
        runner.Settings("node-r", runner.BACKEND_SIM, expected_gpus=3, event_thread=False),
        lib,
        report=reporter.Reporter(cluster, heartbeat_seconds=60),
        clock=clock.epoch,
    )
    gpus = turn(agent, clock, 0).status["gpus"]
    assert gpus[0]["lost"] is True
    assert gpus[0]["xids"] == [{"code": 79, "count": 1, "lastSeen": earlier}]  # still lost: not reset
    assert gpus[1]["xids"] == [{"code": 13, "count": 4, "lastSeen": earlier}]  # no sign of a reset
    assert "xids" not in gpus[2]  # volatile ECC count went 1 → 0: the GPU was reset meanwhile
    assert cluster.writes[0]["gpus"][0]["xids"][0]["code"] == 79  # the very first write already has them


def test_xid_log_restore_adds_to_what_was_seen() -> None:
    log = xids.XidLog()
    log.record("GPU-1", 13, "2027-01-15T08:00:00.000000Z")
    log.restore("GPU-1", [{"code": 13, "count": 2, "lastSeen": "2027-01-15T07:00:00Z"}])
    log.restore("GPU-1", [{"code": 48, "count": 1, "lastSeen": "2027-01-15T07:30:00Z"}])
    assert log.records("GPU-1") == [
        {"code": 13, "count": 3, "lastSeen": "2027-01-15T08:00:00.000000Z"},
        {"code": 48, "count": 1, "lastSeen": "2027-01-15T07:30:00Z"},
    ]


@pytest.mark.parametrize(
    ("earlier_boot", "boot", "carried"),
    [("boot-a", "boot-a", True), ("boot-a", "boot-b", False), (None, "boot-b", True), ("boot-a", None, True)],
)
def test_xids_that_leave_no_other_trace_are_not_carried_over_a_reboot(
    earlier_boot: str | None, boot: str | None, carried: bool
) -> None:
    # XID 74 (NVLink) changes no counter, so only the boot ID can tell that a reboot reset the GPU.
    seed_sim = simulated.SimulatedNvml(scenario.parse("gpus: 1\n"), clock=lambda: 0.0, identity_seed="node-b")
    earlier = "2027-01-15T07:00:00.000000Z"
    previous = status.GPUNodeStatus(
        gpus=[
            status.GPUStatus(
                index=0, uuid=seed_sim.uuid(0), xids=[{"code": 74, "count": 1, "lastSeen": earlier}]
            )
        ]
    )
    if earlier_boot:
        previous["agent"] = {"bootId": earlier_boot}
    clock = Clock()
    lib = simulated.library(
        scenario.parse("gpus: 1\n"), clock=clock.scenario, start=0.0, identity_seed="node-b"
    )
    agent = runner.Agent(
        runner.Settings("node-b", runner.BACKEND_SIM, expected_gpus=1, event_thread=False, boot_id=boot),
        lib,
        report=reporter.Reporter(FakeCluster(previous=previous), heartbeat_seconds=60),
        clock=clock.epoch,
    )
    node_status = turn(agent, clock, 0).status
    assert ("xids" in node_status["gpus"][0]) is carried
    assert node_status["agent"].get("bootId") == boot


def test_a_simulated_dbe_reaches_the_gpunode_without_waiting_for_the_interval() -> None:
    """The simulated driver emits nvmlEventTypeDoubleBitEccError when uncorrectable ECC grows."""
    started = time.time()
    plan = scenario.parse("gpus: 2\ntimeline:\n- {after: 1s, gpu: 1, set: {eccUncorrectedVolatile: 1}}\n")
    lib = simulated.library(plan, clock=time.time, start=started, identity_seed="node-dbe")
    cluster = FakeCluster()
    registry = prometheus_client.CollectorRegistry()
    settings = runner.Settings("node-dbe", runner.BACKEND_SIM, interval_seconds=3600, expected_gpus=2)
    agent = runner.Agent(
        settings,
        lib,
        report=reporter.Reporter(cluster, heartbeat_seconds=3600),
        agent_metrics=metrics.AgentMetrics(registry),
    )
    thread = threading.Thread(target=agent.run_forever)
    thread.start()

    def reported() -> bool:
        return any(w["gpus"][1].get("ecc", {}).get("uncorrectedVolatile") == 1 for w in cluster.writes)

    def counted() -> bool:  # the turn counts its events after its write: poll, never race the write
        return registry.get_sample_value("gpuhealth_agent_nvml_events_total", {"kind": "dbe"}) == 1

    try:
        deadline = time.monotonic() + 20
        while not (reported() and counted()) and time.monotonic() < deadline:
            agent.wake.wait(0.05)
        assert reported(), "the DBE never reached the GPUNode"
        assert time.time() - started < 60  # far less than the one-hour interval: the event woke the loop
        assert counted(), registry.get_sample_value("gpuhealth_agent_nvml_events_total", {"kind": "dbe"})
    finally:
        agent.stop.set()
        agent.wake.set()
        thread.join(timeout=10)
    assert not thread.is_alive()


class NodeCluster(FakeCluster):
    """A FakeCluster whose Node reads as the real client reads a Node (labels and capacity)."""

    def __init__(self, node: dict[str, Any], previous: status.GPUNodeStatus | None = None) -> None:
        super().__init__(previous)
        self.node = node

    def read_node(self) -> tuple[str, int | None]:
        return "uid", reporter.physical_gpus(self.node)


def node_json(capacity: int, **labels: str) -> dict[str, Any]:
    return {"metadata": {"labels": labels}, "status": {"capacity": {"nvidia.com/gpu": str(capacity)}}}


def restarted_agent(
    plan_text: str, cluster: FakeCluster, boot_id: str | None = None
) -> tuple[runner.Agent, Clock]:
    clock = Clock()
    lib = simulated.library(
        scenario.parse(plan_text), clock=clock.scenario, start=0.0, identity_seed="node-s"
    )
    agent = runner.Agent(
        runner.Settings("node-s", runner.BACKEND_SIM, event_thread=False, boot_id=boot_id),
        lib,
        report=reporter.Reporter(cluster, heartbeat_seconds=60),
        clock=clock.epoch,
    )
    return agent, clock


@pytest.mark.parametrize(
    "node",
    [
        pytest.param(node_json(128), id="time-sliced-x16-without-gfd-labels"),
        pytest.param(node_json(32, **{"nvidia.com/gpu.count": "8", "nvidia.com/gpu.replicas": "4"}), id="x4"),
        pytest.param(
            node_json(56, **{"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.count": "56"}), id="mig"
        ),
    ],
)
def test_a_shared_gpu_node_reports_its_physical_gpus_and_no_lost_ones(node: dict[str, Any]) -> None:
    cluster = NodeCluster(node)
    agent, clock = restarted_agent("gpus: 8\n", cluster)
    turn(agent, clock, 0)
    written = turn(agent, clock, 1).status
    assert [g["index"] for g in written["gpus"]] == list(range(8))
    assert not any(g.get("lost") for g in written["gpus"])
    assert written["agent"]["expectedGpuCount"] == 8
    assert written["agent"]["maxGpuCountSeen"] == 8


def test_a_gpu_gone_while_no_agent_ran_is_still_missed_over_a_reboot() -> None:
    previous = status.GPUNodeStatus(
        agent=status.AgentInfo(maxGpuCountSeen=8, expectedGpuCount=8, bootId="boot-1"), gpus=[]
    )
    agent, clock = restarted_agent("gpus: 7\n", FakeCluster(previous=previous), boot_id="boot-2")
    turn(agent, clock, 0)
    written = turn(agent, clock, 1).status
    assert [g["index"] for g in written["gpus"]] == list(range(8))
    assert written["gpus"][7]["lost"] is True
    assert written["agent"]["maxGpuCountSeen"] == 8


def test_an_old_agents_capacity_count_is_not_taken_for_gpus_seen() -> None:
    # Before maxGpuCountSeen, expectedGpuCount was the (time-sliced) capacity: never restore it.
    previous = status.GPUNodeStatus(agent=status.AgentInfo(expectedGpuCount=32), gpus=[])
    agent, clock = restarted_agent("gpus: 8\n", FakeCluster(previous=previous))
    turn(agent, clock, 0)
    written = turn(agent, clock, 1).status
    assert len(written["gpus"]) == 8
    assert written["agent"]["expectedGpuCount"] == 8


def test_the_status_never_lists_more_gpus_than_the_crd_allows() -> None:
    agent, clock = restarted_agent(
        "gpus: 2\n", NodeCluster(node_json(1000, **{"nvidia.com/gpu.count": "1000"}))
    )
    turn(agent, clock, 0)
    written = turn(agent, clock, 1).status
    assert len(written["gpus"]) == faults.MAX_GPUS
    assert written["agent"]["expectedGpuCount"] == faults.MAX_GPUS


class BrokenCluster(FakeCluster):
    """An API server the agent cannot reach, until `down` is cleared."""

    def __init__(self) -> None:
        super().__init__()
        self.down = True

    def apply_status(self, node_status: status.GPUNodeStatus) -> None:
        if self.down:
            raise OSError("connection refused")
        super().apply_status(node_status)


def test_readyz_fails_while_the_agent_cannot_write_and_healthz_does_not() -> None:
    """Readiness is the operator's liveness signal; liveness must not restart an agent over an outage."""
    agent, clock, _, registry = make("gpus: 1\n")
    cluster = BrokenCluster()
    assert agent.reporter is not None
    agent.reporter.cluster = cluster
    wall = [START]
    agent.liveness.clock = lambda: wall[0]
    server = health.HealthServer(0, agent.liveness, registry, host="127.0.0.1").start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        turn(agent, clock, 0)
        assert _get(base + "/healthz") == (200, "ok\n")
        code, text = _get(base + "/readyz")
        assert code == 503 and "cannot write to the API server" in text
        cluster.down = False
        turn(agent, clock, 5)  # past the first retry's backoff: the latest state is written
        assert cluster.writes
        assert _get(base + "/readyz") == (200, "ok\n")
    finally:
        server.stop()


def test_the_agent_reports_when_its_boot_began(tmp_path: Any) -> None:
    """Issue 45, item 5: `status.agent.bootTime` (/proc/stat btime, the node's clock), beside bootId."""
    proc_stat = tmp_path / "stat"
    proc_stat.write_text("cpu  1 2 3\nbtime 1764590400\nprocesses 7\n")
    boot_time = cli._boot_time(proc_stat)
    assert boot_time is not None and boot_time.startswith("2025-12-01T12:00:00")
    assert cli._boot_time(tmp_path / "missing") is None
    clock = Clock()
    lib = simulated.library(scenario.parse("gpus: 1\n"), clock=clock.scenario, start=0.0, identity_seed="n")
    agent = runner.Agent(
        runner.Settings(
            "n", runner.BACKEND_SIM, expected_gpus=1, event_thread=False, boot_id="b", boot_time=boot_time
        ),
        lib,
        report=reporter.Reporter(FakeCluster(), heartbeat_seconds=60),
        clock=clock.epoch,
    )
    assert turn(agent, clock, 0).status["agent"].get("bootTime") == boot_time
