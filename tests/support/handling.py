"""Hand a watch event to an operator handler the way the operator does: the handler observes, then the
node passes it asked for run (`passes`). Tests on the in-memory cluster settle them before they look."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

import kopf

from gpuhealth_operator.runtime import passes
from gpuhealth_operator.shared import context

Handler = Callable[..., Awaitable[None]]


async def handle(handler: Handler, event: Mapping[str, Any], ctx: context.Context) -> None:
    """`handler` (`handlers.on_node`, `on_gpunode`) given `event`, and the passes it asked for, run."""
    await handler(cast(kopf.RawEvent, event), memo=ctx)
    await passes.settle(ctx)
