"""The timer wakes only nodes where a clock runs; a healthy node with a fresh heartbeat is left alone."""

import asyncio
import datetime

import pytest

import gpunode_facts
import operator_context
from gpuhealth_api import keys
from gpuhealth_operator.client import kube
from gpuhealth_operator.decisions import policies, verdicts
from gpuhealth_operator.runtime import reconciler, ticker
from gpuhealth_operator.shared import context
from gpuhealth_operator.verdict import judging

NOW = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)


def make_context(
    node_labels: dict[str, str],
    status: dict,
    annotations: dict[str, str] | None = None,
    seen: datetime.datetime = NOW - datetime.timedelta(seconds=10),
) -> context.Context:
    client = kube.Kube(kube.Credentials("https://127.0.0.1:1", None, True, None, None, None))
    ctx = operator_context.new_context(client)
    ctx.cache.put_node(
        {
            "metadata": {
                "name": "n",
                "resourceVersion": "1",
                "labels": node_labels,
                "annotations": annotations or {},
            },
            "spec": {},
        }
    )
    ctx.cache.put_gpunode({"metadata": {"name": "n", "resourceVersion": "1"}, "status": status}, now=seen)
    policy = policies.parse_policy(
        "p", 1, {"rules": [{"name": "e", "condition": "EccUncorrectable", "action": "Cordon"}]}
    )
    ctx.cache.put_policy(policy)
    return ctx


def fresh(**extra: object) -> dict:
    status = gpunode_facts.agent_status(heartbeat=gpunode_facts.rfc3339(NOW - datetime.timedelta(seconds=10)))
    status.update({"health": "Healthy", "action": "None", "conditions": []})
    status.update(extra)
    return status


def test_healthy_fresh_node_is_not_due_once_judged() -> None:
    ctx = make_context({keys.HEALTH_LABEL: "healthy"}, fresh())
    assert ticker.is_due(ctx, "n", NOW), "never judged: due"
    ctx.verdicts[("p", "n")] = gpunode_facts.verdict()
    assert not ticker.is_due(ctx, "n", NOW)


@pytest.mark.parametrize(
    ("labels", "annotations", "status"),
    [
        ({keys.HEALTH_LABEL: "unhealthy"}, {}, fresh()),
        ({keys.HEALTH_LABEL: "healthy"}, {keys.CORDONED_BY_ANNOTATION: "p"}, fresh()),
        ({keys.HEALTH_LABEL: "healthy", keys.THERMAL_LABEL: "true"}, {}, fresh()),
        ({keys.HEALTH_LABEL: "healthy"}, {}, fresh(action="Pending")),
        (
            {keys.HEALTH_LABEL: "healthy"},
            {},
            fresh(
                conditions=[
                    {"type": "ThermalThrottled", "status": "False", "observedSince": "2026-01-01T11:59:59Z"}
                ]
            ),
        ),
    ],
    ids=["unhealthy", "cordoned-by-us", "labelled", "pending", "condition-pending"],
)
def test_nodes_with_a_running_clock_are_due(labels: dict, annotations: dict, status: dict) -> None:
    ctx = make_context(labels, status, annotations)
    ctx.verdicts[("p", "n")] = gpunode_facts.verdict()
    assert ticker.is_due(ctx, "n", NOW)


@pytest.mark.parametrize("agent_clock_ahead_hours", [0, 24])
def test_a_node_whose_report_the_operator_saw_nearly_3_heartbeats_ago_is_due(
    agent_clock_ahead_hours: int,
) -> None:
    """By the operator's clock: the agent's own (future) timestamp does not keep it fresh."""
    status = fresh()
    status["agent"]["lastHeartbeatTime"] = gpunode_facts.rfc3339(
        NOW + datetime.timedelta(hours=agent_clock_ahead_hours)
    )
    ctx = make_context({keys.HEALTH_LABEL: "healthy"}, status, seen=NOW - datetime.timedelta(seconds=179))
    ctx.verdicts[("p", "n")] = gpunode_facts.verdict()
    assert ticker.is_due(ctx, "n", NOW)


def test_a_deleted_node_is_not_due() -> None:
    ctx = make_context({keys.HEALTH_LABEL: "unhealthy"}, fresh())
    ctx.cache.remove_node("n")
    assert not ticker.is_due(ctx, "n", NOW)


def test_the_timer_judges_a_node_once_per_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass judges every due node for the budget's ranking, then acts on those same verdicts."""
    ctx = make_context({keys.HEALTH_LABEL: "healthy"}, fresh())
    policy = ctx.cache.policies["p"]
    calls = []
    real = verdicts.judge
    monkeypatch.setattr(verdicts, "judge", lambda *args, **kw: calls.append(args) or real(*args, **kw))
    first = judging.judge(ctx, policy, "n", NOW)
    assert judging.judge(ctx, policy, "n", NOW) is first
    assert len(calls) == 1
    ctx.cache.put_gpunode({"metadata": {"name": "n", "resourceVersion": "2"}, "status": fresh()}, NOW)
    judging.judge(ctx, policy, "n", NOW)
    assert len(calls) == 2, "new facts: judged again"
    judging.judge(ctx, policy, "n", NOW + datetime.timedelta(seconds=1))
    assert len(calls) == 3, "a later time: judged again"


def test_a_full_pass_over_a_large_fleet_lets_other_work_run_between_chunks(monkeypatch) -> None:
    """A watch event (a fault) is not held back for the whole pass: the pass yields every PASS_CHUNK nodes."""
    ctx = make_context({keys.HEALTH_LABEL: "healthy"}, fresh())
    count = 3 * ticker.PASS_CHUNK
    for i in range(count):
        ctx.cache.put_node({"metadata": {"name": f"n{i}", "resourceVersion": "1", "labels": {}}, "spec": {}})
        ctx.cache.put_gpunode({"metadata": {"name": f"n{i}", "resourceVersion": "1"}, "status": fresh()}, NOW)
    reconciled: list[str] = []

    async def reconcile(ctx: context.Context, name: str, handler: str, now: datetime.datetime) -> None:
        reconciled.append(name)

    async def no_status(ctx: context.Context, now: datetime.datetime, *, count_gpus: bool = False) -> None:
        return None

    monkeypatch.setattr(reconciler, "reconcile_node", reconcile)
    monkeypatch.setattr(ticker, "write_policy_statuses", no_status)
    seen: list[tuple[int, int]] = []

    async def event() -> None:
        await asyncio.sleep(0)  # scheduled after the pass has started
        seen.append((len(ctx.verdicts), len(reconciled)))

    async def run() -> None:
        try:
            await asyncio.gather(ticker.tick(ctx, full=True), event())
        finally:
            await ctx.client.close()  # a pass may open the session (a term's first sweep asks for rules)

    asyncio.run(run())
    assert len(reconciled) == count + 1
    assert len(ctx.verdicts) == count + 1, "every node judged by the pass"
    (judged_then, reconciled_then) = seen[0]
    assert 0 < judged_then < count and reconciled_then == 0, seen


def test_a_new_version_of_a_quiet_node_is_asked_again() -> None:
    """What a version says is answered once per version (cached), and a new version asks again."""
    ctx = make_context({keys.HEALTH_LABEL: "healthy"}, fresh())
    ctx.verdicts[("p", "n")] = gpunode_facts.verdict()
    assert not ticker.is_due(ctx, "n", NOW)
    ctx.cache.put_gpunode(
        {"metadata": {"name": "n", "resourceVersion": "2"}, "status": fresh(health="Degraded")}, NOW
    )
    assert ticker.is_due(ctx, "n", NOW), "the facts' new version is degraded"
    ctx.cache.put_gpunode({"metadata": {"name": "n", "resourceVersion": "3"}, "status": fresh()}, NOW)
    assert not ticker.is_due(ctx, "n", NOW)
    ctx.cache.put_node(
        {
            "metadata": {"name": "n", "resourceVersion": "2", "labels": {keys.STRAGGLER_LABEL: "true"}},
            "spec": {},
        }
    )
    assert ticker.is_due(ctx, "n", NOW), "the Node's new version carries our straggler label"


@pytest.mark.parametrize("agent", [None, {}, {"heartbeatSeconds": 60}, {"lastHeartbeatTime": "yesterday"}])
def test_a_node_without_a_valid_heartbeat_is_due(agent: dict | None) -> None:
    status = fresh()
    if agent is None:
        del status["agent"]
    else:
        status["agent"] = agent
    ctx = make_context({keys.HEALTH_LABEL: "healthy"}, status)
    ctx.verdicts[("p", "n")] = gpunode_facts.verdict()
    assert ticker.is_due(ctx, "n", NOW)


def test_a_node_waiting_for_the_budget_or_a_drain_is_due() -> None:
    ctx = make_context({keys.HEALTH_LABEL: "healthy"}, fresh())
    ctx.verdicts[("p", "n")] = gpunode_facts.verdict()
    ctx.admission.start_waiting("p", "n")
    assert ticker.is_due(ctx, "n", NOW)
    ctx.admission.stop_waiting("p", "n")
    assert not ticker.is_due(ctx, "n", NOW)
