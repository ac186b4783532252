"""The read-only views of the steps' memories (`Memories.isolated`, `repairs`, `cordons_unknown`,
`draining`) show what each step's memory holds now, whatever it did since they were bound."""

import asyncio
import copy

from gpuhealth_operator.client import drain
from gpuhealth_operator.decisions import isolation
from gpuhealth_operator.ladder import memories


def test_each_view_follows_its_memory_as_it_changes() -> None:
    steps = memories.Memories.create(eviction_concurrency=2)
    assert ("p", "n") not in steps.isolated and "n" not in steps.repairs
    assert "n" not in steps.cordons_unknown and "n" not in steps.draining

    steps.isolate.isolations[("p", "n")] = isolation.NodeState()
    steps.repair.history["n"] = [{"step": "reset"}]
    steps.cordon.unknown["n"] = "41"

    async def evicting() -> drain.Result:
        await asyncio.Event().wait()  # runs until cancelled
        raise AssertionError("never set")

    async def a_drain() -> None:
        task = asyncio.create_task(evicting())
        steps.drain.start("n", "p", task)
        assert "n" in steps.draining and "n" in copy.copy(steps).draining  # a shallow copy shares them
        steps.forget_node("n")
        assert "n" not in steps.draining and task.cancelling()

    assert steps.isolated[("p", "n")] == isolation.NodeState()
    assert steps.repairs["n"] == [{"step": "reset"}]
    assert "n" in steps.cordons_unknown
    asyncio.run(a_drain())
    assert ("p", "n") not in steps.isolated and "n" not in steps.cordons_unknown
