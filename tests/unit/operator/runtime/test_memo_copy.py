"""kopf's per-object memory shares the one context instead of copying it for every Node and GPUNode."""

import asyncio

from kopf._core.reactor import inventory

import operator_context
from gpuhealth_operator.client import kube
from gpuhealth_operator.shared import context


def make() -> context.Context:
    client = kube.Kube(kube.Credentials("https://127.0.0.1:1", None, True, None, None, None))
    return operator_context.new_context(client)


def test_every_object_gets_the_same_context() -> None:
    ctx = make()

    async def recall() -> list[object]:
        memories = inventory.ResourceMemories()
        bodies = [{"metadata": {"uid": f"uid-{i}"}} for i in range(3)]
        return [(await memories.recall(b, memobase=ctx)).memo for b in bodies]  # type: ignore[arg-type]

    assert all(memo is ctx for memo in asyncio.run(recall()))
