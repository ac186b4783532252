"""Issue 48, Deliver 1: the agent lets go of NVML when the operator asks (GPUNode annotation
`gpuhealth.io/release-gpus`), says so (`status.agent.released`, written at once), keeps heartbeating
with the facts it had, and initialises NVML again and reports at once when the ask goes."""

from __future__ import annotations

import copy
from typing import Any

from gpuhealth_agent import release, reporter, runner, scenario, simulated
from gpuhealth_api import status

START = 1_800_000_000.0
FAULT = """
gpus: 2
timeline:
- {after: 0s, gpu: 1, set: {eccUncorrectedVolatile: 2}}
"""


class FakeCluster:
    def __init__(self) -> None:
        self.writes: list[status.GPUNodeStatus] = []

    def read_node(self) -> tuple[str, int | None]:
        return "uid", None

    def read_status(self) -> status.GPUNodeStatus | None:
        return copy.deepcopy(self.writes[-1]) if self.writes else None

    def ensure_gpunode(self, node_uid: str) -> None:
        pass

    def apply_status(self, node_status: status.GPUNodeStatus) -> None:
        self.writes.append(copy.deepcopy(node_status))


def make() -> tuple[runner.Agent, list[float], FakeCluster, release.Fixed, Any]:
    seconds = [0.0]
    plan = scenario.parse(FAULT)
    lib = simulated.library(plan, clock=lambda: seconds[0], start=0.0, identity_seed="node-r")
    cluster = FakeCluster()
    settings = runner.Settings(
        "node-r", runner.BACKEND_SIM, interval_seconds=1, heartbeat_seconds=300, event_thread=False
    )
    asked = release.Fixed()
    agent = runner.Agent(
        settings,
        lib,
        report=reporter.Reporter(cluster, heartbeat_seconds=300),
        clock=lambda: START + seconds[0],
        release_source=asked,
    )
    return agent, seconds, cluster, asked, lib


def test_the_agent_lets_go_of_nvml_while_asked_and_takes_it_back_after() -> None:
    agent, seconds, cluster, asked, lib = make()
    agent.run_once()
    assert cluster.writes[-1]["agent"].get("canRelease") is True
    assert "released" not in cluster.writes[-1]["agent"]
    facts = cluster.writes[-1]["gpus"]

    asked.value = "2026-12-01T12:00:00.000000Z"
    seconds[0] = 1.0
    agent.run_once()
    assert lib.initialized is False, "NVML still open while a reset is asked for"
    assert cluster.writes[-1]["agent"].get("released") == asked.value, "the release was not said at once"
    assert cluster.writes[-1]["gpus"] == facts, "the facts changed while NVML was shut"

    writes = len(cluster.writes)
    calls = lib.calls
    for t in range(2, 10):
        seconds[0] = float(t)
        agent.run_once()
    assert lib.calls == calls, "NVML called while released"
    assert len(cluster.writes) == writes, "writes while released, with nothing new to say"

    asked.value = None
    seconds[0] = 10.0
    agent.run_once()
    assert lib.initialized is True
    assert "released" not in cluster.writes[-1]["agent"], "the end of the release was not said at once"
    assert len(cluster.writes[-1]["gpus"]) == 2


def test_an_agent_without_a_release_source_does_not_say_it_can_release() -> None:
    agent, _, cluster, _, _ = make()
    agent.release = None
    agent.run_once()
    assert "canRelease" not in cluster.writes[-1]["agent"]


def test_the_watch_reads_the_annotation_of_a_gpunode_body() -> None:
    body = {"metadata": {"annotations": {"gpuhealth.io/release-gpus": "s"}}}
    assert release.annotation(body) == "s"
    assert release.annotation({"metadata": {}}) is None
