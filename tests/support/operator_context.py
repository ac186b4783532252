"""The operator's `Context` as the tests build it: the common arguments once, overrides by keyword.

`Context.create` takes a term's settings, client, meters and instance name;
nearly every test wants the defaults (settings as the chart ships them, fresh
meters, instance "t") and varies only the client, and sometimes the instance
(a restarted operator is "t2"), the settings, the cache a lost term kept, or
the clock the test turns. A test names what it varies and nothing else.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

from gpuhealth_operator.client import kube
from gpuhealth_operator.shared import context, metrics, settings
from gpuhealth_operator.state import cache


def new_context(
    client: kube.Client,
    *,
    config: settings.Settings | None = None,
    instance: str = "t",
    cluster: cache.ClusterCache | None = None,
    clock: Callable[[], datetime.datetime] | None = None,
) -> context.Context:
    """A term's context on `client`; `cluster` is the cache an earlier term kept, `clock` the test's."""
    ctx = context.Context.create(
        config if config is not None else settings.Settings(),
        client,
        metrics.Metrics.create(),
        instance=instance,
        cluster=cluster,
    )
    if clock is not None:
        ctx.clock = clock
    return ctx
