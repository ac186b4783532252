"""One real gpu-health agent per simulated node, built the way `gpu-health-agent --backend sim` builds it.

The fleet must exercise the agent's own code (collector, change detection,
reporter with its backoff), not a copy, so this module only wires the
agent's parts together: the simulated NVML replaying the node's scenario,
a reporter over the fleet's shared ApiClient, and no metrics server and no
event thread (the fleet polls NVML events on each turn instead, which keeps
a thousand agents to a handful of threads).
"""

from typing import Any

from kubernetes import client

from gpuhealth_agent import reporter, runner, scenario, simulated, xids
from gpuhealth_sim import baselines, fleetfile


def scenario_for(fleet: fleetfile.Fleet, plan: fleetfile.NodePlan) -> scenario.Scenario:
    """The node's validated scenario with its own healthy baseline folded in."""
    return fleetfile.to_agent(baselines.for_node(fleet, plan), plan.scenario_source)


def build(
    fleet: fleetfile.Fleet,
    plan: fleetfile.NodePlan,
    api_client: client.ApiClient,
    *,
    started_at: float,
    catalogue: xids.Catalogue | None = None,
    request_timeout_seconds: float = 10.0,
) -> runner.Agent:
    """An agent for `plan` whose scenario time 0 is `started_at` (epoch seconds)."""
    node_scenario = scenario_for(fleet, plan)
    lib = simulated.library(node_scenario, identity_seed=plan.name, start=started_at)
    settings = runner.Settings(
        node_name=plan.name,
        backend=runner.BACKEND_SIM,
        interval_seconds=fleet.interval_seconds,
        heartbeat_seconds=fleet.heartbeat_seconds,
        expected_gpus=node_scenario.expected_gpus,
        event_thread=False,
    )
    cluster = reporter.GPUNodeClient(api_client, plan.name, request_timeout_seconds=request_timeout_seconds)
    agent = runner.Agent(
        settings, lib, report=reporter.Reporter(cluster, heartbeat_seconds=fleet.heartbeat_seconds)
    )
    if catalogue is not None:
        # Every agent parses the same XID catalogue; keep one copy for the whole fleet.
        agent.catalogue = catalogue
    return agent


def nvml_calls(agent: runner.Agent) -> int:
    """NVML calls the agent's simulated GPUs have served (0 if unknown)."""
    lib: Any = agent.lib
    return int(getattr(lib, "calls", 0))
