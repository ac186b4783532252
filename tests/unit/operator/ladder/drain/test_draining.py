"""The drain as an action (`draining.NodeDrain`): where it stands after a restart, and when it may start.

A restarted operator (or a new leader) has nothing in memory: the Node's
`drain-started` annotation and the GPUNode's `status.action` say where the
drain stood. A drain that timed out before the restart stays failed (a human
takes over) and asks the API server nothing; one that was running resumes.
"""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest

import gpunode_facts
import operator_context
from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import drain, kube, protocol
from gpuhealth_operator.decisions import policies, times
from gpuhealth_operator.ladder.drain import draining
from gpuhealth_operator.shared import context

NOW = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
Progress = draining.Progress
NodeAction = vocabulary.NodeAction


def cluster(action: str | None, *, started: datetime.datetime | None) -> context.Context:
    """Node `n` cordoned by drain policy `p` (timeout 900 s), its GPUNode status.action `action`.

    The client points at a closed port: any request fails, so a test passes only if none was needed.
    """
    client = kube.Kube(kube.Credentials("https://127.0.0.1:1", None, True, None, None, None))
    ctx = operator_context.new_context(client)
    spec = {
        "nodeSelector": {"matchLabels": {"pool": "gpu"}},
        "rules": [{"name": "e", "condition": "EccUncorrectable", "action": "Drain"}],
        "drain": {"timeoutSeconds": 900},
    }
    ctx.cache.put_policy(policies.parse_policy("p", 1, spec))
    annotations = {keys.CORDONED_BY_ANNOTATION: "p"}
    if started is not None:
        annotations[keys.DRAIN_STARTED_ANNOTATION] = times.render(started)
    meta = {"name": "n", "resourceVersion": "1", "labels": {"pool": "gpu"}, "annotations": annotations}
    node: dict[str, Any] = {"metadata": meta, "spec": {"unschedulable": True}}
    ctx.cache.put_node(node)
    status = {**gpunode_facts.agent_status(), **({"action": action} if action else {})}
    ctx.cache.put_gpunode({"metadata": {"name": "n", "resourceVersion": "1"}, "status": status}, NOW)
    return ctx


def the_drain(ctx: context.Context) -> draining.NodeDrain:
    return draining.NodeDrain(ctx, ctx.cache.policies["p"], "n")


def test_it_is_an_action() -> None:
    action: protocol.Action[draining.Progress] = the_drain(cluster(None, started=None))
    assert action.name == "drain of node n by policy p"


@pytest.mark.parametrize(
    ("action", "started", "progress"),
    [
        (None, None, Progress.NOT_STARTED),
        ("Cordoned", None, Progress.NOT_STARTED),
        ("Draining", NOW, Progress.STARTED),
        ("Cordoned", NOW - datetime.timedelta(hours=1), Progress.STARTED),
        ("Drained", NOW - datetime.timedelta(hours=1), Progress.DRAINED),
    ],
    ids=["fresh", "cordoned-by-a-cordon-rule", "draining-at-a-restart", "failed-before-a-restart", "drained"],
)
def test_a_restarted_operator_reads_where_the_drain_stood(
    action: str | None, started: datetime.datetime | None, progress: draining.Progress
) -> None:
    assert asyncio.run(the_drain(cluster(action, started=started)).observe()) is progress


def test_a_drain_that_timed_out_before_a_restart_stays_failed_and_asks_nothing() -> None:
    ctx = cluster("Cordoned", started=NOW - datetime.timedelta(seconds=901))
    policy = ctx.cache.policies["p"]
    why = asyncio.run(the_drain(ctx).decide(NOW))
    assert why is not None and "timed out" in why
    assert asyncio.run(draining.advance(ctx, policy, "n", NOW)) is NodeAction.CORDONED
    assert "n" not in ctx.steps.drain, "no drain started"
    record = ctx.cache.node("n")
    assert record is not None and draining.timed_out(ctx, policy, record, NOW), (
        "the DrainFailed gauge counts it"
    )


def test_a_drain_running_at_a_restart_resumes_with_the_deadline_it_began_with(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    deadlines: list[datetime.datetime] = []

    async def evicting(*_: Any, deadline: datetime.datetime, **__: Any) -> drain.Result:
        deadlines.append(deadline)
        await asyncio.sleep(3600)  # evicting until cancelled
        raise AssertionError("cancelled first")

    monkeypatch.setattr(drain, "drain", evicting)

    async def scenario() -> tuple[NodeAction, datetime.datetime | None]:
        ctx = cluster("Draining", started=NOW - datetime.timedelta(seconds=600))
        done = await draining.advance(ctx, ctx.cache.policies["p"], "n", NOW)
        await asyncio.sleep(0)  # the task's first step
        assert await the_drain(ctx).observe() is Progress.RUNNING
        assert await draining.advance(ctx, ctx.cache.policies["p"], "n", NOW) is NodeAction.DRAINING
        assert await the_drain(ctx).undo() is True
        assert await the_drain(ctx).undo() is False, "nothing left to undo"
        return done, deadlines[0] if deadlines else None

    done, deadline = asyncio.run(scenario())
    assert done is NodeAction.DRAINING
    assert deadline == NOW + datetime.timedelta(seconds=300), "900 s from when it began, not from now"


def test_a_failed_drain_of_this_term_is_kept_until_its_cordon_goes() -> None:
    ctx = cluster("Cordoned", started=NOW)
    ctx.steps.drain.finished("n", drain.Result(completed=False, blocking=("ns/db",), evicted=0, skipped=()))
    assert asyncio.run(the_drain(ctx).observe()) is Progress.FAILED
    assert asyncio.run(draining.advance(ctx, ctx.cache.policies["p"], "n", NOW)) is NodeAction.CORDONED
    assert draining.shown(ctx, "n") is NodeAction.CORDONED


def test_a_drain_begun_before_a_restart_whose_status_still_said_cordoned_resumes_and_is_not_failed() -> None:
    """A Cordon rule's cordon escalated by a Drain rule: the drain began (its annotation written) and the
    operator stopped before the status said Draining. The restarted operator resumes it (its deadline
    has not come), so the DrainFailed gauge, which pages at once, must not count it meanwhile."""
    ctx = cluster("Cordoned", started=NOW - datetime.timedelta(seconds=600))
    assert asyncio.run(the_drain(ctx).decide(NOW)) is None, "it resumes"
    record = ctx.cache.node("n")
    policy = ctx.cache.policies["p"]
    assert record is not None and not draining.timed_out(ctx, policy, record, NOW), (
        "counted failed while it resumes"
    )
