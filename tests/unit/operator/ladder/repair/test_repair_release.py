"""Issue 48, Deliver 1: the agent releases the GPU before a ResetGPU Job (DESIGN.md, "Repair that
releases the GPU").

On the in-memory cluster, a node with an uncorrectable ECC error on GPU 0 is drained by a policy whose
repair resets, then reboots. The test plays the agent: it heartbeats every tick and, when `confirms`,
answers the GPUNode annotation `gpuhealth.io/release-gpus` with `status.agent.released` (same value).
The agent says it can release (`status.agent.canRelease`; an older agent is not asked).
What a user sees: the annotation (the cycle's start stamp) is on the GPUNode before any ResetGPU Job;
no ResetGPU Job exists before the agent confirmed; the annotation goes once the Job ended; an agent
that never confirms fails the step at its deadline (RepairFailed naming the release), the next step
runs; never AgentStale.
"""

from __future__ import annotations

import asyncio

import repair_memory
from gpuhealth_api import keys

NODE = repair_memory.NODE


class Fleet(repair_memory.Fleet):
    """The shared repair fleet (`repair_memory`), also noting, for each ResetGPU Job, whether the
    release was asked before it was created."""

    def __init__(self, *, confirms: bool) -> None:
        super().__init__(confirms=confirms)
        self.asked_before_job: list[bool] = []

    async def tick(self, seconds: float = 1.0, times: int = 1) -> None:
        for _ in range(times):
            before = set(self.resets())
            await super().tick(seconds)
            for _ in set(self.resets()) - before:
                self.asked_before_job.append(self.asked() is not None)

    def resets(self) -> list[str]:
        return [j["metadata"]["name"] for j in self.jobs("ResetGPU")]


def test_no_reset_job_before_the_agent_released_and_the_ask_goes_after_it() -> None:
    async def story() -> None:
        fleet = Fleet(confirms=False)
        await fleet.start()
        await fleet.tick(times=8)  # cordoned, drained, the cycle begun: the agent is asked
        stamp = fleet.asked()
        state = (fleet.cluster.nodes[NODE]["metadata"].get("annotations") or {}).get(keys.REPAIR_ANNOTATION)
        assert stamp is not None, "no release asked before the reset"
        assert state is not None and stamp in state, (stamp, state)
        assert fleet.resets() == [], "a reset Job before the agent let go of the GPUs"
        assert fleet.action() == "Repairing"

        fleet.confirms = True  # the agent shut NVML down and says so
        await fleet.tick(times=2)
        (reset,) = fleet.resets()
        assert fleet.asked_before_job == [True]
        assert fleet.asked() == stamp, "the ask went while the reset runs"

        fleet.cluster.end_job(reset, True, fleet.epoch())
        fleet.faulty = False
        await fleet.tick(times=3)
        assert fleet.asked() is None, "the ask outlived the reset Job"
        assert fleet.jobs("Validation"), "no validation after the reset worked"
        assert not fleet.messages("AgentStale"), fleet.messages("AgentStale")

    asyncio.run(story())


def test_an_agent_that_never_confirms_fails_the_step_at_its_deadline() -> None:
    async def story() -> None:
        fleet = Fleet(confirms=False)
        await fleet.start()
        await fleet.tick(times=8)
        assert fleet.asked() is not None
        await fleet.tick(seconds=30, times=9)  # 270 s: before the step's 300 s deadline it waits
        assert fleet.resets() == [] and not fleet.messages("RepairFailed")
        assert fleet.action() == "Repairing"
        await fleet.tick(seconds=30, times=2)
        failed = fleet.messages("RepairFailed")
        assert failed and "release" in failed[0], failed
        assert fleet.resets() == [], "a reset Job although the agent never let go"
        assert fleet.jobs("RebootNode"), "the cycle did not move on to the next step"
        assert fleet.asked() is None, "the ask outlived its step"
        assert not fleet.messages("AgentStale"), fleet.messages("AgentStale")
        assert fleet.cluster.nodes[NODE]["spec"].get("unschedulable") is True

    asyncio.run(story())
