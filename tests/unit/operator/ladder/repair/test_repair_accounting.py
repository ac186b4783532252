"""Issue 45: repair's accounting on the in-memory cluster — every allowed maxAttempts honoured across
restarts, Jobs adopted only with this operator's identity, a whole history, the driver's recovery
action choosing the first step.

The operator's own handlers and timer run on `memcluster` under a test clock (`memory_fleet`); the test
plays the node: it ends a step's Job (`end_job`) and writes the agent's next report.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import json
from collections.abc import Mapping
from typing import Any

import gpunode_facts
import memory_fleet
import operator_context
from gpuhealth_api import keys
from gpuhealth_operator.client import kube
from gpuhealth_operator.decisions import repair

NODE = "n1"
ECC = {"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}
RECOVERY = {"name": "recovery", "condition": "RecoveryRequired", "action": "Drain"}
BOOT = "boot-1"


class RepairFleet(memory_fleet.MemoryFleet):
    """One node under policy `p` with `spec.repair` (reset, reboot, validation; `repair` overrides)."""

    def __init__(self, rules: list[dict[str, Any]] | None = None, **repair: Any) -> None:
        super().__init__(rules or [ECC])
        spec: dict[str, Any] = {
            "steps": [
                {"name": "reset", "action": "ResetGPU", "timeoutSeconds": 120},
                {"name": "reboot", "action": "RebootNode", "timeoutSeconds": 120},
            ],
            "validation": {"timeoutSeconds": 120},
            "maxConcurrent": 1,
        }
        spec.update(repair)
        self.policies[0]["spec"].update(
            recovery={"uncordon": True, "healthyForSeconds": 3600},
            drain={"timeoutSeconds": 30, "force": True},
            repair=spec,
        )
        self.boot = BOOT

    async def report(self, *, faulty: bool, gpu: Mapping[str, Any] | None = None) -> None:
        overrides: dict[int, Mapping[str, Any]] = {}
        if gpu is not None:
            overrides[0] = gpu
        elif faulty:
            overrides[0] = {"ecc": {"uncorrectedVolatile": 2}}
        facts = gpunode_facts.agent_status(overrides=overrides, heartbeat=gpunode_facts.rfc3339(self.now))
        facts["agent"]["bootId"] = self.boot
        await self.deliver(NODE, facts)

    def status(self) -> dict[str, Any]:
        return self.cluster.gpunodes[NODE].get("status") or {}

    def annotations(self) -> dict[str, str]:
        return self.cluster.nodes[NODE]["metadata"].get("annotations") or {}

    def running(self) -> list[dict[str, Any]]:
        """The node's repair Jobs that have not ended."""
        return [
            j
            for j in self.cluster.jobs.values()
            if not (j.get("status") or {}).get("conditions")
            and (j["metadata"].get("labels") or {}).get(keys.NODE_LABEL) == NODE
        ]

    def job(self, action: str) -> dict[str, Any]:
        found = [j for j in self.running() if j["metadata"]["labels"][keys.REPAIR_ACTION_LABEL] == action]
        assert len(found) == 1, (action, [j["metadata"]["name"] for j in self.running()])
        return found[0]

    async def until(self, what: str, test: Any, ticks: int = 30) -> None:
        for _ in range(ticks):
            if test():
                return
            await self.tick(1)
        raise AssertionError(f"{what}: status {self.status().get('action')}, jobs {self.running()}")

    async def action(self, action: str) -> None:
        await self.until(f"action {action}", lambda: self.status().get("action") == action)

    async def end(self, action: str, *, ok: bool = True) -> None:
        """The step's (or validation's) pod exits; the operator sees the Job finished."""
        self.cluster.end_job(self.job(action)["metadata"]["name"], ok, 0.0)
        await self.tick(1)

    async def one_successful_cycle(self) -> None:
        """Fault → drained → reset (works) → validation (passes) → back in service."""
        await self.report(faulty=True)
        await self.action("Repairing")
        await self.end("ResetGPU")
        await self.report(faulty=False)
        await self.action("Validating")
        await self.end("Validation")
        await self.until("back in service", lambda: not self.cordoned(NODE))

    def restart(self) -> None:
        """A new operator process (or a new leader) on the same cluster: nothing kept in memory."""
        ctx = operator_context.new_context(self.cluster, instance="t2", clock=lambda: self.now)
        self.ctx = ctx

    async def resume(self) -> None:
        """The new process lists the cluster (its priming) as watch events."""
        import handling  # noqa: PLC0415
        from gpuhealth_operator.runtime import handlers  # noqa: PLC0415

        for policy in self.policies:
            await handlers.on_policy({"type": "ADDED", "object": policy}, memo=self.ctx)  # type: ignore[typeddict-item]
        await handling.handle(
            handlers.on_node, {"type": "ADDED", "object": copy.deepcopy(self.cluster.nodes[NODE])}, self.ctx
        )
        await handling.handle(
            handlers.on_gpunode,
            {"type": "ADDED", "object": copy.deepcopy(self.cluster.gpunodes[NODE])},
            self.ctx,
        )


def results(fleet: RepairFleet) -> list[tuple[int, str, str]]:
    return [
        (e.get("cycle", 0), e.get("action", ""), e["result"]) for e in fleet.status().get("repairs") or []
    ]


# --- item 1: every allowed maxAttempts is honoured ------------------------------------------------------


def test_max_attempts_six_retires_after_six_cycles_across_a_restart() -> None:
    """maxAttempts 6: six successful cycles (4 history entries each: 24 > the 20 kept), a restart after
    the third, then the seventh fault retires the node instead of resetting it again."""

    async def story() -> None:
        fleet = RepairFleet(maxAttempts=6)
        await fleet.start([NODE])
        await fleet.report(faulty=False)
        for cycle in range(6):
            await fleet.one_successful_cycle()
            if cycle == 2:
                fleet.restart()
                await fleet.resume()
        assert len(fleet.status()["repairs"]) == 20  # the history is bounded: it cannot count 6 cycles
        await fleet.report(faulty=True)
        await fleet.action("Retired")
        assert fleet.labels(NODE).get(keys.NEEDS_REPAIR_LABEL) == keys.NEEDS_REPAIR_MANUAL
        assert fleet.cordoned(NODE)
        assert not fleet.running(), "no seventh reset"
        retired = fleet.status()["repairs"][-1]
        assert (retired["result"], retired.get("fault")) == ("Retired", "EccUncorrectable")
        started = [
            e for e in fleet.status()["repairs"] if e["result"] == "Started" and e["action"] == "ResetGPU"
        ]
        assert started and all(e.get("fault") == "EccUncorrectable" for e in started)
        assert [j["metadata"]["labels"][keys.REPAIR_ACTION_LABEL] for j in fleet.cluster.job_log].count(
            "ResetGPU"
        ) == 6
        # What the Node keeps for the count is bounded too: at most 10 cycle starts (the CRD's maximum).
        assert len(fleet.annotations()[keys.REPAIR_CYCLES_ANNOTATION].split(",")) <= 10

    asyncio.run(story())


def test_cycles_outside_the_window_do_not_count() -> None:
    """maxAttempts 1 within 600 s: a fault after the window is repaired again, one inside is retired."""

    async def story() -> None:
        fleet = RepairFleet(maxAttempts=1, attemptWindowSeconds=600)
        await fleet.start([NODE])
        await fleet.report(faulty=False)
        await fleet.one_successful_cycle()
        await fleet.tick(700)
        await fleet.one_successful_cycle()
        await fleet.report(faulty=True)
        await fleet.action("Retired")

    asyncio.run(story())


def test_the_cycle_starts_a_node_keeps_are_bounded_and_a_hand_edit_counts_for_nothing() -> None:
    t0 = memory_fleet.T0
    value = ""
    for number in range(1, 15):
        value = repair.with_cycle(repair.parse_cycles(value), number, t0 + datetime.timedelta(hours=number))
    kept = repair.parse_cycles(value)
    assert [n for n, _ in kept] == list(range(5, 15))
    assert repair.next_cycle([], kept) == 15
    assert repair.cycles_in_window([], t0 + datetime.timedelta(hours=14), 3 * 3600 + 1, kept) == 4
    assert repair.parse_cycles("x@now,3@,7@2026-01-01T00:00:00Z") == (
        (7, repair.times.parse("2026-01-01T00:00:00Z")),
    )


# --- item 12: adopt only Jobs this operator made ----------------------------------------------------------


def test_a_job_that_only_carries_the_name_and_cycle_stamp_is_not_adopted() -> None:
    """A tenant who can create Jobs in the repair namespace reads the Node's repair annotation (the Job's
    name and the cycle's start are there) and races the operator to a finished "validation" of that name.
    The operator must not adopt it (it would return a faulty node to service): it deletes it, creates its
    own, and the node stays cordoned until that one passes."""

    async def story() -> None:
        fleet = RepairFleet()
        await fleet.start([NODE])
        await fleet.report(faulty=False)
        await fleet.report(faulty=True)
        await fleet.action("Repairing")
        serve = fleet.cluster._jobs
        forged: list[str] = []

        def racing(method: str, path: str, body: object) -> Any:
            if method == "POST" and isinstance(body, dict) and not forged:
                labels = body["metadata"].get("labels") or {}
                if labels.get(keys.REPAIR_ACTION_LABEL) == "Validation":
                    state = json.loads(fleet.annotations()[keys.REPAIR_ANNOTATION])
                    fake = {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "metadata": {
                            "name": state["job"],
                            "namespace": "gpu-health",
                            "labels": dict(labels),
                            "annotations": {keys.REPAIR_CYCLE_STARTED_ANNOTATION: state["started"]},
                        },
                        "spec": {},
                        "status": {
                            "conditions": [{"type": "Complete", "status": "True"}],
                            "completionTime": "2026-01-01T12:00:00Z",
                        },
                    }
                    fleet.cluster.jobs[f"gpu-health/{state['job']}"] = fleet.cluster.bump(fake)
                    forged.append(state["job"])
            return serve(method, path, body)

        fleet.cluster._jobs = racing
        await fleet.end("ResetGPU")
        await fleet.report(faulty=False)
        await fleet.tick(1)
        await fleet.tick(1)
        assert forged, "the race happened"
        assert fleet.cordoned(NODE), "a forged validation returned the node to service"
        assert fleet.status().get("action") == "Validating"
        own = fleet.job("Validation")  # the operator's own, created once the forged one was gone
        assert own["metadata"]["annotations"].get(keys.REPAIR_TOKEN_ANNOTATION)
        await fleet.end("Validation")
        await fleet.until("back in service", lambda: not fleet.cordoned(NODE))

    asyncio.run(story())


def test_a_job_belongs_only_with_the_token_whose_hash_the_state_holds() -> None:
    started = memory_fleet.T0
    state = repair.State(
        policy="p",
        cycle=1,
        step=0,
        phase=repair.Phase.STEP,
        since=started,
        gpus=(),
        boot_id=None,
        job="j",
        started=started,
        token=repair.token_digest("secret"),
    )
    stamp = {keys.REPAIR_CYCLE_STARTED_ANNOTATION: repair.cycle_stamp(state)}

    def job(annotations: dict[str, str]) -> dict[str, Any]:
        return {"metadata": {"name": "j", "annotations": annotations}}

    assert repair.belongs(job({**stamp, keys.REPAIR_TOKEN_ANNOTATION: "secret"}), state)
    assert not repair.belongs(job(stamp), state)  # the name and the stamp alone: anyone's
    assert not repair.belongs(
        job({**stamp, keys.REPAIR_TOKEN_ANNOTATION: state.token or ""}), state
    )  # the hash
    assert repair.parse(repair.render(state)) == state  # the hash travels with the state on the Node
    assert "secret" not in repair.render(state)


# --- history that outlives Events is whole -------------------------------------------------------------


def test_excluding_the_node_records_the_cancel_in_the_history() -> None:
    async def story() -> None:
        fleet = RepairFleet()
        await fleet.start([NODE])
        await fleet.report(faulty=False)
        await fleet.report(faulty=True)
        await fleet.action("Repairing")

        def exclude(node: dict[str, Any]) -> None:
            node["metadata"].setdefault("labels", {})[keys.EXCLUDE_LABEL] = "true"

        await fleet.edit_node(NODE, exclude)
        await fleet.until("the Job deleted", lambda: not fleet.running())
        assert keys.REPAIR_ANNOTATION not in fleet.annotations()
        await fleet.until("Cancelled recorded", lambda: (1, "ResetGPU", "Cancelled") in results(fleet))
        json.dumps(fleet.status())  # what was written is JSON (a real API server's client sends it so)

    asyncio.run(story())


class Dying:
    """The leader dies right after its pass created a Job: the GPUNode status write of that pass (with the
    history entries it made) never lands."""

    def __init__(self, fleet: RepairFleet) -> None:
        self.fleet = fleet
        self.apply = fleet.cluster._apply_status
        self.dead = False
        fleet.cluster._apply_status = self._apply

    def _apply(self, path: str, body: object) -> Any:
        if self.dead and "/gpunodes/" in path:
            raise RuntimeError("the leader is gone")
        return self.apply(path, body)

    async def kill_after_next_job(self) -> None:
        jobs = len(self.fleet.cluster.job_log)
        self.dead = True
        await self.fleet.until("a Job created", lambda: len(self.fleet.cluster.job_log) > jobs, ticks=200)
        self.dead = False
        self.fleet.restart()
        await self.fleet.resume()


def test_a_leader_killed_between_a_job_and_its_history_leaves_no_gap() -> None:
    async def story() -> None:
        fleet = RepairFleet()
        await fleet.start([NODE])
        await fleet.report(faulty=False)
        await fleet.report(faulty=True)
        dying = Dying(fleet)
        assert not fleet.cluster.job_log
        await dying.kill_after_next_job()  # the reset's Job created, its Started never written
        await fleet.tick(1)
        assert [r for r in results(fleet) if r[0] == 1] == [(1, "ResetGPU", "Started")]
        await dying.kill_after_next_job()  # the reset timed out, the reboot's Job created; neither written
        await fleet.tick(1)
        assert results(fleet) == [
            (1, "ResetGPU", "Started"),
            (1, "ResetGPU", "TimedOut"),
            (1, "RebootNode", "Started"),
        ]
        assert len(fleet.running()) == 1, "adopted, not a second Job"
        fleet.restart()  # once more: what is recorded is not recorded twice
        await fleet.resume()
        await fleet.tick(1)
        assert len(results(fleet)) == 3, results(fleet)

    asyncio.run(story())


# --- the driver's recovery action chooses the first step ------------------------------------------------


def _first_job(rules: list[dict[str, Any]], gpu: Mapping[str, Any], **repair: Any) -> list[str]:
    async def story() -> list[str]:
        fleet = RepairFleet(rules, **repair)
        await fleet.start([NODE])
        await fleet.report(faulty=False)
        await fleet.report(faulty=True, gpu=gpu)
        await fleet.action("Repairing")
        return [j["metadata"]["labels"][keys.REPAIR_ACTION_LABEL] for j in fleet.cluster.job_log]

    return asyncio.run(story())


def test_a_node_reboot_request_starts_at_the_reboot_step() -> None:
    assert _first_job([RECOVERY], {"recoveryAction": "NodeReboot"}) == ["RebootNode"]
    # With an ECC fault on the same GPU too: the driver's word on the cure wins.
    both = {"recoveryAction": "NodeReboot", "ecc": {"uncorrectedVolatile": 2}}
    assert _first_job([ECC, RECOVERY], both) == ["RebootNode"]


def test_a_gpu_reset_request_starts_at_the_reset_step() -> None:
    steps = [
        {"name": "reboot", "action": "RebootNode", "timeoutSeconds": 120},
        {"name": "reset", "action": "ResetGPU", "timeoutSeconds": 120},
    ]
    assert _first_job([RECOVERY], {"recoveryAction": "GpuReset"}, steps=steps) == ["ResetGPU"]
    # No recovery action asked for: the policy's order.
    assert _first_job([ECC], {"ecc": {"uncorrectedVolatile": 2}}, steps=steps) == ["RebootNode"]


def test_a_forged_new_node_validation_is_not_adopted() -> None:
    """The same race for a new node's validation Job: its name and stamp (the Node's creationTimestamp)
    are readable; a forged Job that "passed" must not lift the node's unvalidated taint."""

    async def story() -> None:
        import handling  # noqa: PLC0415
        from gpuhealth_operator.runtime import handlers  # noqa: PLC0415

        fleet = RepairFleet(validation={"timeoutSeconds": 120, "newNodes": True})
        fleet.policies[0]["metadata"]["creationTimestamp"] = "2026-01-01T11:00:00Z"
        await fleet.start([])
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "uid": NODE, "creationTimestamp": "2026-01-01T12:00:00Z"},
            "spec": {},
        }
        stored = fleet.cluster.put_node(copy.deepcopy(node))
        await handling.handle(handlers.on_node, {"type": "ADDED", "object": copy.deepcopy(stored)}, fleet.ctx)
        await fleet.report(faulty=False)
        serve = fleet.cluster._jobs
        forged: list[str] = []

        def racing(method: str, path: str, body: object) -> Any:
            if method == "POST" and isinstance(body, dict) and not forged:
                fake = copy.deepcopy(body)
                fake["metadata"]["annotations"] = {
                    keys.REPAIR_CYCLE_STARTED_ANNOTATION: node["metadata"]["creationTimestamp"]
                }
                fake["status"] = {
                    "conditions": [{"type": "Complete", "status": "True"}],
                    "completionTime": "2026-01-01T12:00:00Z",
                }
                fake["metadata"]["namespace"] = "gpu-health"
                fleet.cluster.jobs[f"gpu-health/{fake['metadata']['name']}"] = fleet.cluster.bump(fake)
                forged.append(fake["metadata"]["name"])
            return serve(method, path, body)

        fleet.cluster._jobs = racing

        async def passes(n: int) -> None:
            for _ in range(n):
                await fleet.tick(1)
                await fleet.edit_node(NODE, lambda _: None)  # the watch event of our own taint write

        await passes(5)
        assert forged, "the race happened"
        assert keys.VALIDATED_ANNOTATION not in fleet.annotations(), "a forged Job validated the node"
        taints = [t["key"] for t in fleet.cluster.nodes[NODE]["spec"].get("taints") or []]
        assert keys.UNVALIDATED_TAINT in taints
        own = fleet.job("Validation")
        assert own["metadata"]["annotations"].get(keys.REPAIR_TOKEN_ANNOTATION)
        fleet.cluster.end_job(own["metadata"]["name"], True, 0.0)
        await passes(3)
        assert keys.VALIDATED_ANNOTATION in fleet.annotations()

    asyncio.run(story())


def test_a_restart_between_the_state_and_its_job_makes_a_new_token_and_one_job() -> None:
    """The leader writes the step's state (with its token's hash), then dies before its Job is created (a
    5xx here). The next process never saw the token: it writes a new hash first, then the one Job."""

    async def story() -> None:
        fleet = RepairFleet()
        await fleet.start([NODE])
        await fleet.report(faulty=False)
        serve = fleet.cluster._jobs
        refused: list[str] = []

        def failing(method: str, path: str, body: object) -> Any:
            if method == "POST" and not refused:
                refused.append(path)
                raise kube.ApiError(503, "Service Unavailable", "etcd leader changed")
            return serve(method, path, body)

        fleet.cluster._jobs = failing
        await fleet.report(faulty=True)
        await fleet.until("the create refused", lambda: bool(refused))
        before = json.loads(fleet.annotations()[keys.REPAIR_ANNOTATION])
        fleet.restart()
        await fleet.resume()
        await fleet.action("Repairing")
        (job,) = fleet.running()
        state = json.loads(fleet.annotations()[keys.REPAIR_ANNOTATION])
        token = job["metadata"]["annotations"][keys.REPAIR_TOKEN_ANNOTATION]
        assert state["jobToken"] == repair.token_digest(token) != before["jobToken"]
        assert state["job"] == before["job"] == job["metadata"]["name"]

    asyncio.run(story())
