"""The fleet SLIs the timer sets: GPUs by policy and model, out of service by reason, GPU-hours lost."""

import dataclasses
import datetime

import gpunode_facts
import operator_context
from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import kube
from gpuhealth_operator.decisions import policies
from gpuhealth_operator.runtime import ticker
from gpuhealth_operator.shared import context, gpu_meters

NOW = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
A100 = "NVIDIA A100-SXM4-80GB"


def node(
    name: str, *, unschedulable: bool = False, cordoned_by: str | None = None, taint: bool = False
) -> dict:
    return {
        "metadata": {
            "name": name,
            "resourceVersion": "1",
            "labels": {"pool": "gpu"},
            "annotations": {keys.CORDONED_BY_ANNOTATION: cordoned_by} if cordoned_by else {},
        },
        "spec": {
            "unschedulable": unschedulable,
            "taints": [{"key": keys.UNHEALTHY_TAINT, "value": "EccUncorrectable", "effect": "NoSchedule"}]
            if taint
            else [],
        },
    }


def fleet() -> context.Context:
    client = kube.Kube(kube.Credentials("https://127.0.0.1:1", None, True, None, None, None))
    ctx = operator_context.new_context(client)
    ctx.cache.put_policy(
        policies.parse_policy(
            "p",
            1,
            {
                "nodeSelector": {"matchLabels": {"pool": "gpu"}},
                "rules": [{"name": "e", "condition": "EccUncorrectable", "action": "Cordon"}],
            },
        )
    )
    healthy = gpunode_facts.verdict()
    nodes = {
        "healthy": (node("healthy"), gpunode_facts.agent_status(), healthy),
        "cordoned": (
            node("cordoned", unschedulable=True, cordoned_by="p"),
            gpunode_facts.agent_status(),
            dataclasses.replace(healthy, health=vocabulary.Health.UNHEALTHY),
        ),
        "tainted": (
            node("tainted", taint=True),
            gpunode_facts.agent_status(gpus=4, model=A100),
            dataclasses.replace(healthy, health=vocabulary.Health.UNHEALTHY, wanted_taint="EccUncorrectable"),
        ),
        "stale": (
            node("stale"),
            gpunode_facts.agent_status(),
            dataclasses.replace(healthy, health=vocabulary.Health.UNKNOWN),
        ),
        "by-hand": (node("by-hand", unschedulable=True), gpunode_facts.agent_status(), healthy),
        "unjudged": (node("unjudged"), gpunode_facts.agent_status(), None),
    }
    for name, (body, status, verdict) in nodes.items():
        ctx.cache.put_node(body)
        ctx.cache.put_gpunode({"metadata": {"name": name, "resourceVersion": "1"}, "status": status}, NOW)
        if verdict is not None:
            ctx.verdicts[("p", name)] = dataclasses.replace(verdict, node=name)
    return ctx


def values(ctx: context.Context, name: str) -> dict[tuple[str, ...], float]:
    return {
        tuple(v for k, v in sorted(s.labels.items()) if k != "policy"): s.value
        for family in ctx.meters.registry.collect()
        for s in family.samples
        if s.name == name
    }


def test_gpus_are_counted_by_model_and_out_of_service_reason() -> None:
    ctx = fleet()
    ticker.policy_status(ctx, "p", NOW)
    h100 = gpunode_facts.MODEL
    # Judged nodes only; a node cordoned by hand counts healthy: its GPUs are sound, the cordon is not ours.
    assert values(ctx, "gpuhealth_operator_gpus") == {(h100,): 32, (A100,): 4}
    assert values(ctx, "gpuhealth_operator_gpus_healthy") == {(h100,): 16, (A100,): 0}
    out = values(ctx, "gpuhealth_operator_gpus_out_of_service")
    assert out == {
        (h100, "cordoned"): 8,
        (h100, "isolated"): 0,
        (h100, "unknown"): 8,
        (A100, "cordoned"): 0,
        (A100, "isolated"): 4,
        (A100, "unknown"): 0,
    }


def test_gpu_hours_lost_grow_with_the_cordoned_and_isolated_gpus() -> None:
    ctx = fleet()
    for seconds in range(0, 3601, 10):
        ticker.policy_status(ctx, "p", NOW + datetime.timedelta(seconds=seconds))
    lost = values(ctx, "gpuhealth_operator_gpu_hours_lost_total")
    assert round(lost[(gpunode_facts.MODEL,)], 6) == 8.0
    assert round(lost[(A100,)], 6) == 4.0


def test_gpus_are_recounted_every_few_seconds_not_on_every_tick() -> None:
    ctx = fleet()
    ticker.policy_status(ctx, "p", NOW)
    ctx.cache.put_node(node("healthy", unschedulable=True, cordoned_by="p"))
    ticker.policy_status(ctx, "p", NOW + datetime.timedelta(seconds=1))
    assert values(ctx, "gpuhealth_operator_gpus_out_of_service")[(gpunode_facts.MODEL, "cordoned")] == 8
    ticker.policy_status(ctx, "p", NOW + datetime.timedelta(seconds=gpu_meters.GPU_SLI_SECONDS))
    assert values(ctx, "gpuhealth_operator_gpus_out_of_service")[(gpunode_facts.MODEL, "cordoned")] == 16
