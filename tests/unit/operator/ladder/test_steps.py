"""The ladder's steps are registered once (`ladder/steps.py`): the timer runs each row's sweep in order.

A new ladder step is its package plus its row; the timer (`runtime/ticker.py`) names no step.
"""

import asyncio
import datetime

import operator_context
from gpuhealth_operator.client import kube
from gpuhealth_operator.ladder import steps
from gpuhealth_operator.runtime import ticker


def test_the_registered_steps_in_order() -> None:
    assert [step.name for step in steps.STEPS] == [
        "cordon",
        "repair",
        "new_nodes",
        "orphan_jobs",
        "check",
        "isolate",
        "domain",
    ]


def test_the_timer_runs_every_registered_sweep_in_order(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    ran: list[tuple[str, bool, bool]] = []

    def row(name: str) -> steps.Step:
        async def sweep(_ctx: object, tick: steps.Tick) -> tuple[str, ...]:
            ran.append((name, tick.full, tick.refresh))
            return ()

        return steps.Step(name, sweep)

    monkeypatch.setattr(steps, "STEPS", (row("a"), row("b"), row("c")))
    client = kube.Kube(kube.Credentials("https://127.0.0.1:1", None, True, None, None, None))
    ctx = operator_context.new_context(
        client, clock=lambda: datetime.datetime(2026, 1, 5, tzinfo=datetime.UTC)
    )
    asyncio.run(ticker.tick(ctx, full=False, statuses=False, refresh=True))
    assert ran == [("a", False, True), ("b", False, True), ("c", False, True)]
