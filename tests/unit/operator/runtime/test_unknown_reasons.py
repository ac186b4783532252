"""Unknown nodes are counted per policy by why nothing is judged on them.

A node is Unknown for a stale agent, an agent in error (it sees no GPU) or the
GPU Operator's maintenance (driver upgrade, MIG reconfiguration). Only the
first is what GPUHealthAgentsStale pages for: during a rolling driver upgrade
some node is nearly always in maintenance, and an agent in error has its own
alert. `gpuhealth_operator_unknown_nodes{policy, reason}` tells them apart,
one reason per node (the GPUHealthy Node condition's), exported by the leader only.
"""

import dataclasses
import datetime

import prometheus_client
from prometheus_client import parser

import gpunode_facts
import operator_context
from gpuhealth_api import vocabulary
from gpuhealth_operator.client import kube
from gpuhealth_operator.decisions import policies
from gpuhealth_operator.runtime import ticker
from gpuhealth_operator.shared import context, metrics

NOW = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
C = vocabulary.Condition
GAUGE = "gpuhealth_operator_unknown_nodes"


NODES: dict[str, tuple[vocabulary.Health, tuple[vocabulary.Condition, ...]]] = {
    "healthy": (vocabulary.Health.HEALTHY, ()),
    "stale-1": (vocabulary.Health.UNKNOWN, (C.AGENT_STALE,)),
    "stale-2": (vocabulary.Health.UNKNOWN, (C.AGENT_STALE,)),
    "no-gpus": (vocabulary.Health.UNKNOWN, (C.AGENT_ERROR,)),
    "upgrading": (vocabulary.Health.UNKNOWN, (C.GPU_OPERATOR_MAINTENANCE,)),
    # The agent pod restarts during the driver upgrade: maintenance explains the silence.
    "upgrading-and-silent": (vocabulary.Health.UNKNOWN, (C.GPU_OPERATOR_MAINTENANCE, C.AGENT_STALE)),
}


def fleet(policy_names: tuple[str, ...] = ("p",)) -> context.Context:
    client = kube.Kube(kube.Credentials("https://127.0.0.1:1", None, True, None, None, None))
    ctx = operator_context.new_context(client)
    for name in policy_names:
        ctx.cache.put_policy(
            policies.parse_policy(
                name,
                1,
                {
                    "nodeSelector": {"matchLabels": {"pool": "gpu"}},
                    "rules": [{"name": "e", "condition": "EccUncorrectable", "action": "Cordon"}],
                },
            )
        )
    for node, (health, issues) in NODES.items():
        ctx.cache.put_node(
            {
                "metadata": {"name": node, "resourceVersion": "1", "labels": {"pool": "gpu"}},
                "spec": {},
            }
        )
        ctx.cache.put_gpunode(
            {"metadata": {"name": node, "resourceVersion": "1"}, "status": gpunode_facts.agent_status()}, NOW
        )
        for name in policy_names:
            ctx.verdicts[(name, node)] = dataclasses.replace(
                gpunode_facts.verdict(node=node), health=health, issues=issues
            )
    return ctx


def scraped(meters: metrics.Metrics) -> dict[tuple[str, str], float]:
    """The gauge's samples as a scrape of /metrics yields them: (policy, reason) to value."""
    text = prometheus_client.generate_latest(meters.registry).decode()
    out: dict[tuple[str, str], float] = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == GAUGE:
                out[(s.labels["policy"], s.labels["reason"])] = s.value
    return out


def test_unknown_nodes_are_counted_under_the_reason_nothing_is_judged() -> None:
    ctx = fleet()
    ctx.meters.set_leading(True)
    ticker.policy_status(ctx, "p", NOW)
    assert scraped(ctx.meters) == {
        ("p", "AgentStale"): 2,
        ("p", "AgentError"): 1,
        ("p", "GPUOperatorMaintenance"): 2,
    }
    nodes = ctx.meters.nodes.labels("p", "Unknown")._value.get()
    assert sum(scraped(ctx.meters).values()) == nodes, "one reason per Unknown node"


def test_each_policy_counts_its_own_nodes_and_a_deleted_one_loses_its_series() -> None:
    ctx = fleet(("p", "q"))
    ctx.meters.set_leading(True)
    ticker.policy_status(ctx, "p", NOW)
    ticker.policy_status(ctx, "q", NOW)
    assert scraped(ctx.meters)[("q", "AgentStale")] == 2
    ctx.meters.forget_policy("q")
    assert {policy for policy, _ in scraped(ctx.meters)} == {"p"}


def test_a_reason_that_no_longer_holds_drops_to_zero() -> None:
    ctx = fleet()
    ctx.meters.set_leading(True)
    ticker.policy_status(ctx, "p", NOW)
    for node in ("upgrading", "upgrading-and-silent"):
        ctx.verdicts[("p", node)] = gpunode_facts.verdict(node=node)
    ticker.policy_status(ctx, "p", NOW + datetime.timedelta(seconds=1))
    assert scraped(ctx.meters)[("p", "GPUOperatorMaintenance")] == 0


def test_a_standby_exports_none() -> None:
    ctx = fleet()
    ctx.meters.set_leading(True)
    ticker.policy_status(ctx, "p", NOW)
    ctx.meters.set_leading(False)
    assert scraped(ctx.meters) == {}
    ticker.policy_status(ctx, "p", NOW + datetime.timedelta(seconds=1))  # a pass still running
    assert scraped(ctx.meters) == {}
    assert ctx.meters.unknown_nodes in ctx.meters.fleet_gauges()
