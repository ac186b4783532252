"""The check step's timer sweep asks the API server nothing where no policy has active checks.

The chart grants no right to list Jobs until repair or checks are enabled (DESIGN.md, "Privilege is an
explicit grant"): a sweep that listed them anyway would log a 403 every second on every install.
"""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import operator_context
from gpuhealth_operator.ladder.check import checking
from gpuhealth_operator.shared import context

NOW = datetime.datetime(2026, 12, 2, 12, 0, tzinfo=datetime.UTC)


class Refusing:
    """A client that records every request and refuses it, as the API server does without the grant."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __getattr__(self, name: str) -> Any:
        async def call(*args: object, **kwargs: object) -> object:
            self.asked.append(name)
            raise AssertionError(f"the sweep asked the API server: {name}{args}")

        return call


async def _no_write(ctx: context.Context, name: str) -> None:
    raise AssertionError("nothing to write")


def test_a_sweep_without_any_policy_with_checks_sends_no_request() -> None:
    client = Refusing()
    ctx = operator_context.new_context(client)  # type: ignore[arg-type]
    asyncio.run(checking.sweep(ctx, NOW, _no_write))
    assert client.asked == []
