"""Alerts that name the node: `gpuhealth_operator_node_unhealthy{policy, node, condition, health}`.

One series per true condition of each node a policy judges not Healthy (for an
Unknown node: why nothing is judged), present only while that holds, so the
series count follows the nodes in trouble, never the fleet. On the in-memory
cluster with the operator's own handlers and timer, read as a scrape reads it.
"""

import asyncio

import prometheus_client
from prometheus_client import parser

import gpunode_facts
from memory_fleet import MemoryFleet

GAUGE = "gpuhealth_operator_node_unhealthy"
RULES = [
    {"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"},
    {"name": "hot", "condition": "ThermalThrottled", "action": "Label"},
]
ECC = {0: {"ecc": {"uncorrectedVolatile": 1}}}


def scraped(fleet: MemoryFleet) -> set[tuple[str, str, str, str]]:
    text = prometheus_client.generate_latest(fleet.ctx.meters.registry).decode()
    return {
        (s.labels["policy"], s.labels["node"], s.labels["condition"], s.labels["health"])
        for family in parser.text_string_to_metric_families(text)
        for s in family.samples
        if s.name == GAUGE and s.value == 1
    }


def test_only_nodes_in_trouble_carry_a_series_and_it_goes_when_they_recover() -> None:
    async def scenario() -> None:
        fleet = MemoryFleet(RULES, policies=("p", "q"))
        names = [f"n{i}" for i in range(5)]
        await fleet.start(names)
        for name in names:
            await fleet.deliver(name, gpunode_facts.agent_status())
        await fleet.tick(1)
        assert scraped(fleet) == set()  # a healthy fleet: no series at all

        await fleet.deliver("n3", gpunode_facts.agent_status(overrides=ECC))
        await fleet.tick(1)
        assert scraped(fleet) == {
            ("p", "n3", "EccUncorrectable", "Unhealthy"),
            ("q", "n3", "EccUncorrectable", "Unhealthy"),
        }

        await fleet.deliver("n3", gpunode_facts.agent_status())
        await fleet.tick(1)
        assert scraped(fleet) == set()

        fleet.ctx.meters.set_leading(False)  # a standby exports no fleet gauge, this one included
        await fleet.deliver("n1", gpunode_facts.agent_status(overrides=ECC))
        assert scraped(fleet) == set()

    asyncio.run(scenario())


def test_a_deleted_policy_leaves_no_node_series() -> None:
    async def scenario() -> None:
        fleet = MemoryFleet(RULES)
        await fleet.start(["n0"])
        await fleet.deliver("n0", gpunode_facts.agent_status(overrides=ECC))
        await fleet.tick(1)
        assert scraped(fleet) == {("p", "n0", "EccUncorrectable", "Unhealthy")}
        fleet.ctx.meters.forget_policy("p")
        assert scraped(fleet) == set()

    asyncio.run(scenario())
