"""Node passes run off the event path (`passes`, `pass_queue`): a watch event only updates the cache and
asks for a pass; the term's `passes.run` task runs it. On the in-memory cluster, with the operator's own
handlers: a fault is cordoned by the running task, a slow write on one node holds up neither the
cache nor another node, the reports that landed meanwhile are judged once, on the newest, the end of
the term stops a pass half-way, and a pass that fails is counted and does not wedge its node."""

from __future__ import annotations

import asyncio
import copy
import datetime
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pytest

import drain_cluster
import gpunode_facts
from gpuhealth_operator.runtime import handlers, passes, reconciler
from gpuhealth_operator.shared import metrics
from gpuhealth_operator.state import pass_queue
from memory_fleet import MemoryFleet

RULES = [
    {"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"},
    {"name": "hot", "condition": "ThermalThrottled", "action": "Label"},
]
ECC = {0: {"ecc": {"uncorrectedVolatile": 1}}}
HOT = {0: {"temperatureCelsius": 95, "clockEventReasons": ["HwThermalSlowdown"]}}
DEADLINE_SECONDS = 10.0


def test_asks_fold_and_wait_for_the_running_pass() -> None:
    async def scenario() -> None:
        queue = pass_queue.PassQueue()
        queue.request("a", pass_queue.Ask("gpunode"))
        queue.request("b", pass_queue.Ask("node", judge=False, wake=True))
        queue.request("a", pass_queue.Ask("node", judge=False, stop_drains=True))
        assert queue.take() == [
            ("a", pass_queue.Ask("gpunode", judge=True, stop_drains=True)),
            ("b", pass_queue.Ask("node", judge=False, wake=True)),
        ]
        queue.request("a", pass_queue.Ask("gpunode"))  # while a's pass runs
        assert queue.take() == [] and len(queue) == 1
        ready = asyncio.create_task(queue.ready())
        await asyncio.sleep(0)
        assert not ready.done()
        queue.finished("a")
        await asyncio.wait_for(ready, DEADLINE_SECONDS)
        assert queue.take() == [("a", pass_queue.Ask("gpunode"))]

    asyncio.run(scenario())


def test_the_gauge_counts_the_nodes_waiting_for_a_pass() -> None:
    meters = metrics.Metrics.create()
    queue = pass_queue.PassQueue()
    meters.follow_passes(lambda: len(queue))
    for name in ("a", "b", "a"):
        queue.request(name, pass_queue.Ask("gpunode"))
    waiting = "gpuhealth_operator_passes_waiting"
    assert meters.registry.get_sample_value(waiting) == 2  # two nodes, however many events
    queue.take(limit=1)
    assert meters.registry.get_sample_value(waiting) == 1  # a running pass no longer waits
    meters.follow_passes(lambda: 0)  # the term ended
    assert meters.registry.get_sample_value(waiting) == 0


class SlowNodes:
    """The in-memory cluster, where a Node patch of a node in `held` waits until that node is released."""

    def __init__(self, fleet: MemoryFleet) -> None:
        self.held: dict[str, asyncio.Event] = {}
        self.cancelled: list[str] = []
        original: Callable[..., Awaitable[Any]] = fleet.cluster.request

        async def request(method: str, path: str, **kwargs: Any) -> Any:
            name = path.rsplit("/", 1)[-1]
            if method == "PATCH" and path.startswith("/api/v1/nodes/") and name in self.held:
                try:
                    await self.held[name].wait()
                except asyncio.CancelledError:
                    self.cancelled.append(name)
                    raise
            return await original(method, path, **kwargs)

        fleet.cluster.request = request


def report(fleet: MemoryFleet, overrides: Mapping[int, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    at = fleet.now.isoformat().replace("+00:00", "Z")
    return gpunode_facts.agent_status(overrides=overrides, heartbeat=at, observed=at, heartbeat_seconds=60)


async def deliver(fleet: MemoryFleet, name: str, overrides: Mapping[int, Mapping[str, Any]] | None) -> None:
    """The agent's report as a watch event to the handler alone: the running task runs the pass."""
    fleet.now += datetime.timedelta(seconds=10)
    stored = fleet.cluster.put_gpunode(name, report(fleet, overrides))
    await handlers.on_gpunode({"type": "MODIFIED", "object": copy.deepcopy(stored)}, memo=fleet.ctx)  # type: ignore[typeddict-item]


async def started(names: list[str]) -> tuple[MemoryFleet, asyncio.Task[None]]:
    fleet = MemoryFleet(RULES)
    fleet.policies[0]["spec"]["breaker"] = {"maxNewUnhealthy": 10}  # two faults here are no storm
    await fleet.start(names)  # settled: the first Node passes ran
    for name in names:
        fleet.cluster.put_gpunode(name, report(fleet))
    runner = asyncio.create_task(passes.run(fleet.ctx))
    for name in names:
        await deliver(fleet, name, None)
    await drain_cluster.until(lambda: not fleet.ctx.passes.busy, DEADLINE_SECONDS, "the first passes")
    return fleet, runner


def test_a_fault_is_cordoned_by_the_running_task() -> None:
    async def scenario() -> None:
        fleet, runner = await started(["a"])
        await deliver(fleet, "a", ECC)
        assert not fleet.cordoned("a")  # the handler only asked
        await drain_cluster.until(lambda: fleet.cordoned("a"), DEADLINE_SECONDS, "a cordoned")
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)

    asyncio.run(scenario())


def test_a_slow_write_holds_up_no_other_node_and_the_newest_report_is_judged() -> None:
    async def scenario() -> None:
        fleet, runner = await started(["a", "b"])
        slow = SlowNodes(fleet)
        slow.held["a"] = asyncio.Event()
        passes_run: list[str] = []
        original = reconciler.reconcile_node

        async def counted(ctx: Any, name: str, *args: Any, **kwargs: Any) -> None:
            passes_run.append(name)
            await original(ctx, name, *args, **kwargs)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(reconciler, "reconcile_node", counted)
            await deliver(fleet, "a", HOT)  # its label patch hangs
            await drain_cluster.until(lambda: passes_run == ["a"], DEADLINE_SECONDS, "a's pass started")
            for overrides in (None, ECC, ECC):  # three reports while it hangs: cached at once
                await deliver(fleet, "a", overrides)
                assert fleet.ctx.cache.gpunode("a").status["gpus"][0]["ecc"]["uncorrectedVolatile"] == (
                    0 if overrides is None else 1
                )
            await deliver(fleet, "b", ECC)
            await drain_cluster.until(
                lambda: fleet.cordoned("b"), DEADLINE_SECONDS, "b cordoned while a's write hangs"
            )
            assert not fleet.cordoned("a")
            slow.held["a"].set()
            await drain_cluster.until(
                lambda: fleet.cordoned("a"), DEADLINE_SECONDS, "a cordoned after its write answered"
            )
            await drain_cluster.until(
                lambda: not fleet.ctx.passes.busy, DEADLINE_SECONDS, "nothing left to run"
            )
        # a: the pass that hung, then one pass for the three reports (b: one)
        assert passes_run == ["a", "b", "a"]
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)

    asyncio.run(scenario())


def test_the_end_of_the_term_stops_a_pass_half_way() -> None:
    async def scenario() -> None:
        fleet, runner = await started(["a"])
        slow = SlowNodes(fleet)
        slow.held["a"] = asyncio.Event()
        await deliver(fleet, "a", ECC)  # its cordon hangs
        await drain_cluster.until(
            lambda: fleet.ctx.passes.busy and not len(fleet.ctx.passes), DEADLINE_SECONDS, "a's pass started"
        )
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        assert slow.cancelled == ["a"]  # the hanging cordon was cancelled, not left to land later
        slow.held["a"].set()
        await asyncio.sleep(0)
        assert not fleet.cordoned("a")

    asyncio.run(scenario())


def test_a_failing_pass_is_counted_and_its_node_is_passed_again(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        fleet, runner = await started(["a"])
        original = reconciler.reconcile_node
        failures = [1]

        async def failing_once(ctx: Any, name: str, *args: Any, **kwargs: Any) -> None:
            if failures:
                failures.pop()
                raise RuntimeError("a bug")
            await original(ctx, name, *args, **kwargs)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(reconciler, "reconcile_node", failing_once)
            await deliver(fleet, "a", HOT)
            errors = fleet.ctx.meters.reconcile_errors.labels("gpunode")
            await drain_cluster.until(
                lambda: errors._value.get() == 1, DEADLINE_SECONDS, "the failure counted"
            )
            await deliver(fleet, "a", ECC)
            await drain_cluster.until(
                lambda: fleet.cordoned("a"), DEADLINE_SECONDS, "a cordoned by its next pass"
            )
        assert "the pass of node a asked by a gpunode event failed" in caplog.text
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)

    asyncio.run(scenario())
