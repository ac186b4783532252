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
import copy
import datetime
from typing import Any

import gpunode_facts
import handling
import operator_context
from gpuhealth_api import keys, resources
from gpuhealth_operator.client import kube
from gpuhealth_operator.runtime import handlers, ticker
from gpuhealth_operator.shared import settings
from gpuhealth_sim.backtest import memcluster

T0 = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)
NODE = "gpu-node-1"
RELEASE = "gpuhealth.io/release-gpus"


class Cluster(memcluster.MemoryKube):
    """The in-memory cluster, also serving merge patches of a GPUNode's annotations."""

    async def request(self, method: str, path: str, **kwargs: Any) -> kube.JsonObject:
        name = path.removeprefix(memcluster.GPUNODES)
        if method == "PATCH" and path.startswith(memcluster.GPUNODES) and "/" not in name:
            current = self.gpunodes.get(name)
            if current is None:
                raise kube.ApiError(404, "NotFound", path)
            body = kwargs.get("body")
            assert isinstance(body, dict) and set(body) == {"metadata"}, body
            self.gpunodes[name] = self.bump(memcluster.merge_patch(copy.deepcopy(current), body))
            return copy.deepcopy(self.gpunodes[name])
        return await super().request(method, path, **kwargs)


class Fleet:
    def __init__(self, *, confirms: bool) -> None:
        self.cluster = Cluster()
        self.cluster.clock = self.epoch
        self.now = T0
        self.confirms = confirms
        self.faulty = True
        config = settings.Settings()
        self.ctx = operator_context.new_context(self.cluster, config=config, clock=lambda: self.now)
        self.asked_before_job: list[bool] = []

    def epoch(self) -> float:
        return self.now.timestamp()

    async def start(self) -> None:
        spec = {
            "nodeSelector": {"matchLabels": {"pool": "gpu"}},
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
            "maxUnavailable": "100%",
            "recovery": {"healthyForSeconds": 3600, "uncordon": True},
            "repair": {
                "steps": [
                    {"name": "reset", "action": "ResetGPU", "timeoutSeconds": 300},
                    {"name": "reboot", "action": "RebootNode", "timeoutSeconds": 600},
                ],
                "validation": {"timeoutSeconds": 300},
                "maxConcurrent": 1,
            },
        }
        policy: dict[str, Any] = {"apiVersion": resources.API_VERSION, "kind": resources.POLICY_KIND}
        policy |= {"metadata": {"name": "p", "generation": 1}, "spec": spec}
        await handlers.on_policy({"type": "ADDED", "object": policy}, memo=self.ctx)  # type: ignore[typeddict-item]
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": NODE,
                "uid": "uid-1",
                "labels": {"pool": "gpu"},
                "creationTimestamp": gpunode_facts.rfc3339(self.now),
            },
            "spec": {},
        }
        stored = self.cluster.put_node(node)
        await handling.handle(handlers.on_node, {"type": "ADDED", "object": copy.deepcopy(stored)}, self.ctx)
        await self.report()

    def asked(self) -> str | None:
        gpunode = self.cluster.gpunodes.get(NODE) or {}
        return ((gpunode.get("metadata") or {}).get("annotations") or {}).get(RELEASE)

    async def report(self) -> None:
        """The agent's report: released while the annotation asks (if it `confirms`), facts kept."""
        overrides: dict[int, dict[str, Any]] = {0: {"ecc": {"uncorrectedVolatile": 2}}} if self.faulty else {}
        status = gpunode_facts.agent_status(
            heartbeat=gpunode_facts.rfc3339(self.now),
            observed=gpunode_facts.rfc3339(self.now),
            overrides=overrides,
        )
        status["agent"]["canRelease"] = True  # an agent of issue 48
        asked = self.asked()
        if asked is not None and self.confirms:
            status["agent"]["released"] = asked
        stored = self.cluster.put_gpunode(NODE, status)
        event = {"type": "MODIFIED", "object": copy.deepcopy(stored)}
        await handling.handle(handlers.on_gpunode, event, self.ctx)

    async def tick(self, seconds: float = 1.0, times: int = 1) -> None:
        for _ in range(times):
            self.now += datetime.timedelta(seconds=seconds)
            before = set(self.resets())
            await self.report()
            await ticker.tick(self.ctx, full=True)
            for _ in set(self.resets()) - before:
                self.asked_before_job.append(self.asked() is not None)

    def resets(self) -> list[str]:
        return [
            j["metadata"]["name"]
            for j in self.cluster.job_log
            if (j["metadata"].get("labels") or {}).get(keys.REPAIR_ACTION_LABEL) == "ResetGPU"
        ]

    def jobs(self, action: str) -> list[str]:
        return [
            j["metadata"]["name"]
            for j in self.cluster.job_log
            if (j["metadata"].get("labels") or {}).get(keys.REPAIR_ACTION_LABEL) == action
        ]

    def messages(self, reason: str) -> list[str]:
        return [str(e.get("message")) for e in self.cluster.event_log if e.get("reason") == reason]

    def action(self) -> str:
        return str(self.cluster.gpunodes[NODE]["status"].get("action"))


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
