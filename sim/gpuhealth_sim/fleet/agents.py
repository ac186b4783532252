"""One real gpu-health agent per simulated node, built the way `gpu-health-agent --backend sim` builds it.

The fleet must exercise the agent's own code (collector, change detection,
reporter with its backoff), not a copy, so this module only wires the
agent's parts together: the simulated NVML replaying the node's scenario,
a reporter over the fleet's shared ApiClient, and no metrics server and no
event thread (the fleet polls NVML events on each turn instead, which keeps
a thousand agents to a handful of threads).

Building a thousand agents must be cheap: each distinct scenario is parsed
and validated by the agent's loader once, and each node's baseline is drawn
onto the parsed scenario; the XID catalogue is parsed once for the fleet.
"""

import threading
import uuid
from typing import Any

from kubernetes import client

from gpuhealth_agent import release, reporter, runner, scenario, simulated, xids
from gpuhealth_sim.fleet import baselines, fleetfile


class Builder:
    """Builds the agents of one fleet; thread-safe, caches parsed scenarios."""

    def __init__(
        self,
        fleet: fleetfile.Fleet,
        api_client: client.ApiClient,
        *,
        started_at: float,
        request_timeout_seconds: float = 10.0,
    ) -> None:
        self.fleet = fleet
        self.api_client = api_client
        self.started_at = started_at
        """Scenario time 0 for every node (epoch seconds)."""
        self.request_timeout_seconds = request_timeout_seconds
        self._lock = threading.Lock()
        self._parsed: dict[tuple[str, str, int], scenario.Scenario] = {}
        self._catalogue = xids.Catalogue.packaged()

    def scenario_for(self, plan: fleetfile.NodePlan) -> scenario.Scenario:
        """The node's validated scenario with its own healthy baseline drawn onto it."""
        key = (plan.scenario_source, plan.gpu_model, plan.gpu_count)
        with self._lock:
            parsed = self._parsed.get(key)
            if parsed is None:
                parsed = self._parsed[key] = scenario.from_data(plan.scenario, plan.scenario_source)
        return baselines.apply_to(parsed, plan.spread, baselines.node_rng(self.fleet.seed, plan.name))

    def library(self, plan: fleetfile.NodePlan) -> simulated.SimulatedNvml:
        """The node's simulated GPUs (one per node for the fleet's life: a reboot keeps them)."""
        return simulated.SimulatedNvml(
            self.scenario_for(plan), identity_seed=plan.name, start=self.started_at
        )

    def build(
        self, plan: fleetfile.NodePlan, lib: simulated.SimulatedNvml | None = None, boots: int = 0
    ) -> runner.Agent:
        """The node's agent over `lib` (default: new simulated GPUs), as started after boot `boots`
        (0: the first; each reboot of the node counts one more and gives the agent a new bootId)."""
        node_scenario = self.scenario_for(plan)
        if lib is None:
            lib = self.library(plan)
        settings = runner.Settings(
            node_name=plan.name,
            backend=runner.BACKEND_SIM,
            interval_seconds=self.fleet.interval_seconds,
            heartbeat_seconds=self.fleet.heartbeat_seconds,
            expected_gpus=node_scenario.expected_gpus,
            event_thread=False,
            boot_id=boot_id(plan.name, boots),
        )
        cluster = reporter.GPUNodeClient(
            self.api_client, plan.name, request_timeout_seconds=self.request_timeout_seconds
        )
        report = reporter.Reporter(cluster, heartbeat_seconds=self.fleet.heartbeat_seconds)
        # The operator's GPU release ask (issue 48) reaches a simulated agent from the repair executor,
        # which reads the GPUNodes (`repairs.Executor`): a watch per simulated node would not scale.
        return runner.Agent(
            settings, lib, report=report, catalogue=self._catalogue, release_source=release.Fixed()
        )


def boot_id(node: str, boots: int) -> str:
    """A simulated node's kernel boot ID after `boots` reboots: stable per node and boot (a fleet
    restarted over the same Nodes is the same boot, so the agents carry their XIDs over)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpu-health-sim/{node}/boot/{boots}"))


def nvml_calls(agent: runner.Agent) -> int:
    """NVML calls the agent's simulated GPUs have served (0 if unknown)."""
    lib: Any = agent.lib
    return int(getattr(lib, "calls", 0))
