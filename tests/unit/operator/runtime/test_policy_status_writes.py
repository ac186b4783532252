"""The timer's policy status writes: a policy deleted under a pass costs that write, not the others."""

import asyncio
import datetime
from typing import Any

import operator_context
from gpuhealth_operator.client import kube
from gpuhealth_operator.decisions import policies
from gpuhealth_operator.runtime import ticker


class Client(kube.Kube):
    """Answers server-side apply of policy status; 'gone' was deleted after the cache saw it."""

    def __init__(self) -> None:
        super().__init__(kube.Credentials("https://127.0.0.1:1", None, True, None, None, None))
        self.applied: list[str] = []

    async def apply(self, path: str, body: object, field_manager: str) -> kube.JsonObject:
        name = path.split("/")[-2]
        if name == "gone":
            raise kube.ApiError(404, "NotFound", 'gpuhealthpolicies.gpuhealth.io "gone" not found')
        self.applied.append(name)
        return {}


def policy(name: str) -> Any:
    return policies.parse_policy(
        name, 1, {"rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Event"}]}
    )


def test_a_policy_deleted_meanwhile_does_not_stop_the_others_status() -> None:
    async def scenario() -> tuple[list[str], set[str]]:
        client = Client()
        ctx = operator_context.new_context(client)
        for name in ("a-first", "gone", "z-last"):
            ctx.cache.put_policy(policy(name))
        await ticker.write_policy_statuses(ctx, datetime.datetime.now(datetime.UTC))
        return client.applied, set(ctx.status.written)

    applied, written = asyncio.run(scenario())
    assert applied == ["a-first", "z-last"]
    assert written == {"a-first", "z-last"}


def test_a_pass_without_statuses_writes_none_and_the_next_full_one_does() -> None:
    """The backtest's ticks leave the policies' status alone (they only report) until its full pass."""

    async def scenario() -> tuple[list[str], list[str]]:
        client = Client()
        ctx = operator_context.new_context(client)
        ctx.cache.put_policy(policy("a"))
        await ticker.tick(ctx, statuses=False)
        quiet = list(client.applied)
        await ticker.tick(ctx, full=True)
        return quiet, client.applied

    quiet, applied = asyncio.run(scenario())
    assert quiet == []
    assert applied == ["a"]
