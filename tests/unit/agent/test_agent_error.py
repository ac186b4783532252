"""An agent that sees no GPU on a GPU node reports its own error, never the node's GPUs as lost.

A container runtime that hides the GPUs from the agent (a common hardened setting, or a
DaemonSet rollout that changed it) is a configuration error of the agent, on every node at
once: judged as GPULost it drained the whole fleet (issue 24, item 16).
"""

import copy
from typing import Any

import prometheus_client

from gpuhealth_agent import access_hints, check, metrics, reporter, runner, scenario, simulated, xids
from gpuhealth_api import status, vocabulary

START = 1_800_000_000.0
NO_GPUS = vocabulary.AgentErrorReason.NO_GPUS_VISIBLE.value


class Hidden(simulated.SimulatedNvml):
    """The node's GPUs, with the runtime showing the agent none of them (until `shown`)."""

    shown = False

    def nvmlDeviceGetCount(self) -> int:
        count = super().nvmlDeviceGetCount()
        return count if self.shown else 0


class Cluster:
    def __init__(self, previous: status.GPUNodeStatus | None = None, physical: int | None = 8) -> None:
        self.writes: list[status.GPUNodeStatus] = []
        self.previous = previous
        self.physical = physical

    def read_node(self) -> tuple[str, int | None]:
        return "uid", self.physical  # the Node's GFD labels: nvidia.com/gpu.count=8

    def read_status(self) -> status.GPUNodeStatus | None:
        return copy.deepcopy(self.writes[-1]) if self.writes else self.previous

    def ensure_gpunode(self, node_uid: str) -> None:
        pass

    def apply_status(self, node_status: status.GPUNodeStatus) -> None:
        self.writes.append(copy.deepcopy(node_status))


def make(cluster: Cluster, expected: int | None = None) -> tuple[runner.Agent, Hidden, list[float], Any]:
    moment = [0.0]
    lib = Hidden(scenario.parse("gpus: 8\n"), clock=lambda: moment[0], start=0.0, identity_seed="n")
    registry = prometheus_client.CollectorRegistry()
    agent = runner.Agent(
        runner.Settings(
            "n", runner.BACKEND_NVML, interval_seconds=1, expected_gpus=expected, event_thread=False
        ),
        lib,
        report=reporter.Reporter(cluster, heartbeat_seconds=60),  # type: ignore[arg-type]
        agent_metrics=metrics.AgentMetrics(registry),
        clock=lambda: START + moment[0],
    )
    return agent, lib, moment, registry


def test_no_gpu_visible_on_a_gpu_node_is_an_agent_error_not_eight_lost_gpus() -> None:
    cluster = Cluster()
    agent, _, moment, registry = make(cluster)
    for second in (0, 1, 2):
        moment[0] = second
        agent.run_once()
    written = cluster.writes[0]  # the very first report already says so
    assert written["gpus"] == []
    assert written["agent"]["error"]["reason"] == NO_GPUS
    assert "no GPU" in written["agent"]["error"]["message"]
    assert cluster.writes[-1]["agent"]["error"]["reason"] == NO_GPUS
    assert registry.get_sample_value("gpuhealth_agent_error", {"reason": NO_GPUS}) == 1


def test_an_agent_restarted_blind_on_a_node_whose_gpus_it_saw_reports_an_error() -> None:
    """The rollout case: the earlier agent saw 8 GPUs (and an XID); the new one sees none."""
    previous = status.GPUNodeStatus(
        agent=status.AgentInfo(maxGpuCountSeen=8, expectedGpuCount=8),
        gpus=[
            status.GPUStatus(
                index=i,
                uuid=simulated.gpu_uuid("n", i),
                xids=[status.XidRecord(code=79, count=1, lastSeen="2027-01-15T07:00:00.000Z")]
                if i == 3
                else [],
            )
            for i in range(8)
        ],
    )
    cluster = Cluster(previous)
    agent, lib, moment, _ = make(cluster)
    agent.run_once()
    moment[0] = 1
    report = agent.run_once().status
    assert report["gpus"] == []  # no GPU reported lost: the agent cannot tell
    assert report["agent"]["error"]["reason"] == NO_GPUS
    assert report["agent"]["maxGpuCountSeen"] == 8  # still remembered for when the GPUs show again
    lib.shown = True  # the runtime is fixed
    moment[0] = 2
    report = agent.run_once().status
    assert "error" not in report["agent"]
    assert len(report["gpus"]) == 8 and not any(g.get("lost") for g in report["gpus"])
    assert report["gpus"][3]["xids"][0]["code"] == 79  # the XID carried over is still there


def test_gpus_that_vanish_after_the_agent_saw_them_are_lost_as_before() -> None:
    cluster = Cluster()
    agent, lib, moment, registry = make(cluster)
    lib.shown = True
    agent.run_once()
    lib.shown = False
    moment[0] = 1
    report = agent.run_once().status
    assert "error" not in report["agent"]
    assert [g.get("lost") for g in report["gpus"]] == [True] * 8
    assert registry.get_sample_value("gpuhealth_agent_error", {"reason": NO_GPUS}) == 0


def test_check_says_the_agent_cannot_see_a_gpu_and_exits_non_zero() -> None:
    node = status.GPUNodeStatus(
        agent=status.AgentInfo(
            error=status.AgentError(
                reason=NO_GPUS, message="NVML sees no GPU", since="2027-01-15T08:00:00.000Z"
            )
        ),
        gpus=[],
    )
    code, text = check.render(node, xids.Catalogue.packaged(), "table")
    assert code == check.AGENT_ERROR_EXIT
    assert "AGENT ERROR NoGPUsVisible: NVML sees no GPU" in text


class NoNvml(Hidden):
    """A runtime that did not inject NVML at all (`NVML Shared Library Not Found`) until `shown`."""

    def nvmlInit(self) -> None:
        if not self.shown:
            raise simulated.nvml.error("LibraryNotFound")
        super().nvmlInit()


def test_an_agent_whose_nvml_cannot_start_reports_an_error_and_keeps_trying() -> None:
    """Was: the agent exited (CrashLoopBackOff): the node went stale, with no word of why."""
    cluster = Cluster()
    moment = [0.0]
    lib = NoNvml(scenario.parse("gpus: 8\n"), clock=lambda: moment[0], start=0.0, identity_seed="n")
    agent = runner.Agent(
        runner.Settings("n", runner.BACKEND_NVML, interval_seconds=1, event_thread=False),
        lib,
        report=reporter.Reporter(cluster, heartbeat_seconds=60),  # type: ignore[arg-type]
        clock=lambda: START + moment[0],
    )
    report = agent.run_once().status
    assert report["gpus"] == []
    assert report["agent"]["error"]["reason"] == NO_GPUS
    assert "NVML cannot start (LibraryNotFound)" in report["agent"]["error"]["message"]
    assert agent.liveness.check()[0]  # alive: a restart would not help, the error is said instead
    lib.shown = True  # the driver came up
    moment[0] = 1
    report = agent.run_once().status
    assert "error" not in report["agent"] and len(report["gpus"]) == 8
    agent.close()


def test_without_a_cluster_to_tell_an_nvml_that_cannot_start_still_fails_the_command() -> None:
    lib = NoNvml(scenario.parse("gpus: 1\n"), clock=lambda: 0.0, start=0.0)
    agent = runner.Agent(runner.Settings("n", runner.BACKEND_NVML, event_thread=False), lib)
    try:
        agent.run_once()
    except simulated.nvml.NVMLError:
        return
    raise AssertionError("check (no reporter) must fail when NVML cannot start")


def test_gpus_listed_but_none_readable_say_so() -> None:
    cluster = Cluster()
    moment = [0.0]
    plan = scenario.parse(
        "gpus: 2\ntimeline:\n"
        "- {after: 0s, gpu: 0, fail: {function: nvmlDeviceGetUUID, error: NoPermission}}\n"
        "- {after: 0s, gpu: 1, fail: {function: nvmlDeviceGetUUID, error: NoPermission}}\n"
    )
    lib = simulated.SimulatedNvml(plan, clock=lambda: moment[0], start=0.0, identity_seed="n")
    agent = runner.Agent(
        runner.Settings("n", runner.BACKEND_NVML, event_thread=False),
        lib,
        report=reporter.Reporter(cluster, heartbeat_seconds=60),  # type: ignore[arg-type]
        clock=lambda: START + moment[0],
    )
    error = agent.run_once().status["agent"]["error"]
    assert error["reason"] == NO_GPUS
    assert error["message"].startswith("NVML lists GPUs but cannot open any (NoPermission)")


def blind_message(access: access_hints.GpuAccess | None) -> str:
    cluster = Cluster()
    lib = Hidden(scenario.parse("gpus: 8\n"), clock=lambda: 0.0, start=0.0, identity_seed="n")
    settings = runner.Settings(
        "n", runner.BACKEND_NVML, interval_seconds=1, event_thread=False, gpu_access=access
    )
    agent = runner.Agent(
        settings,
        lib,
        report=reporter.Reporter(cluster, heartbeat_seconds=60),  # type: ignore[arg-type]
        agent_metrics=metrics.AgentMetrics(prometheus_client.CollectorRegistry()),
        clock=lambda: START,
    )
    agent.run_once()
    message: str = cluster.writes[0]["agent"]["error"]["message"]
    return message


def test_no_gpu_visible_without_a_runtime_class_names_the_gpu_operator_cdi_cause_and_the_value() -> None:
    """GPU Operator >= 25.10 uses CDI by default: NVIDIA_VISIBLE_DEVICES works only in its `nvidia` class."""
    message = blind_message(access_hints.GpuAccess(mode="envvar", runtime_class=""))
    assert "CDI" in message
    assert "agent.runtimeClassName=nvidia" in message


def test_no_gpu_visible_in_the_nvidia_class_names_the_unprivileged_env_var_cause_and_the_value() -> None:
    """The runtime class is there, so the toolkit itself refuses the env var of an unprivileged pod."""
    message = blind_message(access_hints.GpuAccess(mode="envvar", runtime_class="nvidia"))
    assert "agent.gpuAccess.mode=volumeMounts" in message


def test_no_gpu_visible_without_an_nvidia_runtime_names_the_host_driver_mode() -> None:
    message = blind_message(access_hints.GpuAccess(mode="volumeMounts", runtime_class=""))
    assert "agent.gpuAccess.mode=hostDriver" in message
