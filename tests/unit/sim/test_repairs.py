"""The simulated node's side of repair: the scenario's `repair:` key, the outcome of each repair pod,
the status it ends with, and what a simulated GPU reset clears (and what it keeps)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpuhealth_agent import runner, scenario, simulated
from gpuhealth_api import keys, timestamps
from gpuhealth_operator.client import kube
from gpuhealth_sim.backtest import memcluster, tracerecord, traces
from gpuhealth_sim.fleet import fleetfile, repairs

NODE = "gpu-node-3"
UUIDS = [simulated.gpu_uuid(NODE, i) for i in range(8)]


def plan(repair: object = None, timeline: list[dict[str, Any]] | None = None) -> scenario.Scenario:
    data: dict[str, Any] = {"gpus": 8, "timeline": timeline or []}
    if repair is not None:
        data["repair"] = repair
    return scenario.from_data(data, "test.yaml")


# --- the scenario key ----------------------------------------------------------------------------------


def test_without_repair_every_step_fixes_and_validation_passes() -> None:
    repair = plan().repair
    assert [repair.outcome(k, 0) for k in ("ResetGPU", "RebootNode", "validation")] == [
        "fixes",
        "fixes",
        "pass",
    ]
    assert repair.outcome("ResetGPU", 7) == "fixes"


def test_outcomes_per_attempt_the_last_repeats() -> None:
    repair = plan({"ResetGPU": "fails", "validation": ["fail", "pass"]}).repair
    assert [repair.outcome("validation", i) for i in range(3)] == ["fail", "pass", "pass"]
    assert repair.outcome("ResetGPU", 0) == "fails" and repair.outcome("RebootNode", 0) == "fixes"


@pytest.mark.parametrize(
    ("repair", "said"),
    [
        ({"ResetGPU": "works"}, "test.yaml: repair.ResetGPU: expected one of fixes, fails, noEffect"),
        ({"validation": "fixes"}, "test.yaml: repair.validation: expected one of pass, fail"),
        ({"validation": ["pass", "maybe"]}, "test.yaml: repair.validation[1]: expected one of pass, fail"),
        ({"RebootNode": []}, "test.yaml: repair.RebootNode: expected one of fixes"),
        ({"Reboot": "fixes"}, "test.yaml: repair.Reboot: expected one of the keys ResetGPU, RebootNode"),
        ("fixes", "test.yaml: repair: expected a mapping like {ResetGPU: fixes"),
    ],
)
def test_a_bad_repair_key_is_named(repair: object, said: str) -> None:
    with pytest.raises(scenario.ScenarioError) as error:
        plan(repair)
    assert str(error.value).startswith(said), str(error.value)


def test_a_fleet_reports_a_bad_repair_key_and_does_not_crash() -> None:
    data = {
        "pools": [
            {"name": "h100", "count": 1, "gpu": {"model": "NVIDIA H100 80GB HBM3", "count": 8}},
        ],
        "overrides": [{"nodes": "h100-0", "scenario": {"timeline": [], "repair": {"ResetGPU": "maybe"}}}],
    }
    with pytest.raises(fleetfile.FleetError) as error:
        fleetfile.parse(data, "fleet.yaml")
    assert "scenario of h100-0" in str(error.value) and "repair.ResetGPU" in str(error.value)


# --- one pod's outcome -----------------------------------------------------------------------------------


def test_a_reset_that_fixes_resets_the_named_gpus() -> None:
    outcome = repairs.decide(plan().repair, "ResetGPU", 0, [UUIDS[3], UUIDS[1]], UUIDS)
    assert (outcome.phase, outcome.exit_code, outcome.reset, outcome.reboot) == (
        "Succeeded",
        0,
        (1, 3),
        False,
    )


def test_a_reboot_that_fixes_reboots() -> None:
    outcome = repairs.decide(plan().repair, "RebootNode", 0, [], UUIDS)
    assert (outcome.phase, outcome.reset, outcome.reboot) == ("Succeeded", (), True)


def test_fails_and_no_effect_change_nothing() -> None:
    repair = plan({"ResetGPU": ["fails", "noEffect"]}).repair
    failed = repairs.decide(repair, "ResetGPU", 0, [UUIDS[3]], UUIDS)
    assert (failed.phase, failed.exit_code, failed.reset) == ("Failed", 1, ())
    idle = repairs.decide(repair, "ResetGPU", 1, [UUIDS[3]], UUIDS)
    assert (idle.phase, idle.exit_code, idle.reset, idle.reboot) == ("Succeeded", 0, (), False)


def test_validation_passes_or_fails_per_attempt() -> None:
    repair = plan({"validation": ["fail", "pass"]}).repair
    assert repairs.decide(repair, "Validation", 0, [], UUIDS).phase == "Failed"
    assert repairs.decide(repair, "Validation", 1, [], UUIDS).phase == "Succeeded"


def test_a_reset_of_a_gpu_the_node_lacks_fails_as_nvidia_smi_would() -> None:
    outcome = repairs.decide(plan().repair, "ResetGPU", 0, ["GPU-elsewhere"], UUIDS)
    assert (outcome.phase, outcome.exit_code, outcome.reset) == ("Failed", 1, ())
    assert "GPU-elsewhere" in outcome.message


def test_only_repair_actions_are_played() -> None:
    assert repairs.scenario_key("Validation") == "validation"
    assert repairs.scenario_key("ResetGPU") == "ResetGPU"
    assert repairs.scenario_key("Drain") is None
    with pytest.raises(ValueError, match="not a repair action"):
        repairs.decide(plan().repair, "Drain", 0, [], UUIDS)


def test_the_gpus_come_from_the_pods_env() -> None:
    pod = {
        "spec": {
            "containers": [
                {"name": "a", "env": [{"name": "OTHER", "value": "x"}]},
                {"name": "b", "env": [{"name": keys.REPAIR_GPUS_ENV, "value": f"{UUIDS[2]}, {UUIDS[5]},"}]},
            ]
        }
    }
    assert repairs.requested_gpus(pod) == [UUIDS[2], UUIDS[5]]
    assert repairs.requested_gpus({"spec": {"containers": [{"name": "a"}]}}) == []


def test_the_status_a_pod_ends_with_is_a_kubelets() -> None:
    pod = {
        "spec": {"containers": [{"name": "reset", "image": "cuda"}]},
        "status": {
            "phase": "Running",
            "startTime": "2026-11-26T15:00:00Z",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True"},
            ],
            "containerStatuses": [
                {"name": "reset", "state": {"running": {"startedAt": "2026-11-26T15:00:01Z"}}}
            ],
        },
    }
    failed = repairs.terminal_status(pod, repairs.Outcome(False, 1, "boom"), 1_795_000_000.0)["status"]
    assert failed["phase"] == "Failed"
    (container,) = failed["containerStatuses"]
    terminated = container["state"]["terminated"]
    assert container["state"].keys() == {"terminated"}
    assert (terminated["exitCode"], terminated["reason"], terminated["message"]) == (1, "Error", "boom")
    assert terminated["startedAt"] == "2026-11-26T15:00:01Z"
    ready = {c["type"]: c for c in failed["conditions"]}
    assert ready["Ready"]["status"] == "False" and ready["PodScheduled"]["status"] == "True"
    done = repairs.terminal_status(pod, repairs.Outcome(True, 0, "ok"), 1_795_000_000.0)["status"]
    assert done["phase"] == "Succeeded"
    assert done["containerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"


# --- what a simulated reset does -------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_reset_clears_volatile_state_and_keeps_what_a_real_reset_keeps() -> None:
    clock = Clock()
    script = plan(
        timeline=[
            {
                "after": "5s",
                "gpu": 3,
                "set": {
                    "eccUncorrectedVolatile": 2,
                    "eccUncorrectedAggregate": 2,
                    "retiredPagesPending": True,
                    "recoveryAction": "GpuReset",
                },
            },
            {"after": "6s", "gpu": 6, "xid": 79},
            {"after": "7s", "gpu": 2, "fail": {"function": "nvmlDeviceGetPowerUsage", "error": "Unknown"}},
        ]
    )
    lib = simulated.SimulatedNvml(script, clock=clock, start=clock.now, identity_seed=NODE)
    clock.now += 10
    assert lib.nvmlDeviceGetTotalEccErrors(simulated.Handle(3), 1, 0) == 2
    with pytest.raises(Exception, match="GPU is lost"):
        lib.nvmlDeviceGetUUID(simulated.Handle(6))
    lib.reset_gpus([3, 6])
    assert lib.nvmlDeviceGetTotalEccErrors(simulated.Handle(3), 1, 0) == 0  # volatile: reset
    assert lib.nvmlDeviceGetTotalEccErrors(simulated.Handle(3), 1, 1) == 2  # aggregate: kept
    facts = lib._gpus[3].facts
    assert facts["retiredPagesPending"] is False and facts["recoveryAction"] == "None"
    assert lib.nvmlDeviceGetUUID(simulated.Handle(6)) == UUIDS[6]  # back on the bus
    with pytest.raises(Exception, match="Unknown"):  # GPU 2 was not reset
        lib.nvmlDeviceGetPowerUsage(simulated.Handle(2))
    lib.reset_gpus(None)
    assert lib.nvmlDeviceGetPowerUsage(simulated.Handle(2)) > 0
    # A rewound clock replays the resets where they happened.
    clock.now -= 9
    assert lib.nvmlDeviceGetTotalEccErrors(simulated.Handle(3), 1, 0) == 0
    clock.now += 9
    assert lib.nvmlDeviceGetTotalEccErrors(simulated.Handle(3), 1, 0) == 0
    with pytest.raises(ValueError, match="no simulated GPU 9"):
        lib.reset_gpus([9])


def test_a_later_scripted_fault_still_happens_after_a_reset() -> None:
    clock = Clock()
    script = plan(
        timeline=[
            {"after": "5s", "gpu": 3, "set": {"eccUncorrectedVolatile": 1}},
            {"after": "60s", "gpu": 3, "set": {"eccUncorrectedVolatile": 1}},
        ]
    )
    lib = simulated.SimulatedNvml(script, clock=clock, start=clock.now, identity_seed=NODE)
    clock.now += 10
    lib.reset_gpus([3])
    assert lib.nvmlDeviceGetTotalEccErrors(simulated.Handle(3), 1, 0) == 0
    clock.now += 60
    assert lib.nvmlDeviceGetTotalEccErrors(simulated.Handle(3), 1, 0) == 1


def test_the_agent_reads_a_reset_gpu_clean_and_forgets_its_xids() -> None:
    clock = Clock()
    script = plan(timeline=[{"after": "5s", "gpu": 6, "xid": 79}])
    lib = simulated.SimulatedNvml(script, clock=clock, start=clock.now, identity_seed=NODE)
    settings = runner.Settings(node_name=NODE, backend=runner.BACKEND_SIM, event_thread=False)
    agent = runner.Agent(settings, lib, clock=clock)
    try:
        agent.run_once()
        clock.now += 10
        agent.run_once()
        gpu = agent.run_once().status["gpus"][6]
        assert gpu.get("lost") is True and [x["code"] for x in gpu.get("xids", [])] == [79]
        lib.reset_gpus([6])
        clock.now += 1
        gpu = agent.run_once().status["gpus"][6]
        assert not gpu.get("lost") and not gpu.get("xids"), gpu
    finally:
        agent.close()


# --- the backtest's side: Jobs in the in-memory cluster, ending as the trace says ----------------------


def _job(name: str) -> dict[str, Any]:
    labels = {keys.REPAIR_ACTION_LABEL: "ResetGPU", keys.NODE_LABEL: NODE}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": labels}}


def test_the_in_memory_cluster_keeps_jobs_and_ends_them_as_the_trace_says() -> None:
    now = [1_000.0]
    cluster = memcluster.MemoryKube(clock=lambda: now[0])
    path = "/apis/batch/v1/namespaces/gpu-health/jobs"
    created = asyncio.run(cluster.create(path, _job("a")))
    assert created["metadata"]["namespace"] == "gpu-health" and created["status"] == {}
    with pytest.raises(kube.ApiError) as conflict:  # the operator adopts on 409
        asyncio.run(cluster.create(path, _job("a")))
    assert conflict.value.status == 409
    cluster.end_job("a", True, 1_005.0)
    done = asyncio.run(cluster.get(f"{path}/a"))
    assert done["status"]["conditions"][0]["type"] == "Complete"
    assert done["status"]["completionTime"] == "1970-01-01T00:16:45Z"
    # An ending known before the replay creates its Job: it ends when created, not before.
    cluster.end_job("b", False, 990.0)
    now[0] = 1_010.0
    failed = asyncio.run(cluster.create(path, _job("b")))
    assert failed["status"]["conditions"][0] == {
        "type": "Failed",
        "status": "True",
        "lastTransitionTime": "1970-01-01T00:16:50Z",
    }
    assert [j["metadata"]["name"] for j in cluster.job_log] == ["a", "b"]
    asyncio.run(cluster.delete(f"{path}/a"))
    with pytest.raises(kube.ApiError) as gone:
        asyncio.run(cluster.get(f"{path}/a"))
    assert gone.value.status == 404


def test_a_recording_writes_each_repair_jobs_end_once() -> None:
    compactor = tracerecord.Compactor(start=1_000.0)
    job = _job("gpuhealth-repair-x-c1-0")
    job["metadata"].update(namespace="gpu-health", uid="u1")
    assert compactor.job(job, 1_001.0) is None  # running
    job["status"] = {
        "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": "2026-11-26T15:00:03Z"}],
        "completionTime": "2026-11-26T15:00:02Z",
    }
    record = compactor.job(job, 1_004.0)
    assert record is not None
    assert timestamps.parse(record.pop("at")) == timestamps.parse("2026-11-26T15:00:02Z")  # completionTime
    assert record == {
        "kind": "job",
        "t": 4.0,
        "name": "gpu-health/gpuhealth-repair-x-c1-0",
        "node": NODE,
        "action": "ResetGPU",
        "ended": "Succeeded",
    }
    assert compactor.job(job, 1_005.0) is None  # once
    record["at"] = "2026-11-26T15:00:02Z"
    traces._check(record, "trace:2")
    with pytest.raises(traces.TraceError, match="job record needs"):
        traces._check({**record, "ended": "Maybe"}, "trace:3")


def test_a_reset_leaves_an_xid_the_agent_cannot_see_was_reset() -> None:
    """NVML has no reset event: an XID scripted alone (no counter, no lost GPU) outlives a reset, as on
    real hardware (the operator then says NoEffect and the reboot's new bootId clears it)."""
    clock = Clock()
    lib = simulated.SimulatedNvml(
        plan(timeline=[{"after": "5s", "gpu": 2, "xid": 48}]),
        clock=clock,
        start=clock.now,
        identity_seed=NODE,
    )
    agent = runner.Agent(runner.Settings(node_name=NODE, backend="sim", event_thread=False), lib, clock=clock)
    try:
        agent.run_once()
        clock.now += 10
        agent.run_once()
        lib.reset_gpus([2])
        clock.now += 1
        assert [x["code"] for x in agent.run_once().status["gpus"][2].get("xids", [])] == [48]
    finally:
        agent.close()


def validation_pod(hostengine: str | None) -> dict[str, Any]:
    env = [{"name": keys.REPAIR_GPUS_ENV, "value": ""}]
    if hostengine is not None:
        env.append({"name": keys.REPAIR_HOSTENGINE_ENV, "value": hostengine})
    return {"spec": {"containers": [{"name": "validation", "env": env}]}}


@pytest.mark.parametrize(
    ("hostengine", "running", "second"),
    [
        ("", ["gpu-operator/nvidia-dcgm-x"], True),  # the node runs one, the template starts its own
        (None, ["gpu-operator/nvidia-dcgm-x"], True),  # an older operator: not told of it
        ("10.0.0.7:5555", ["gpu-operator/nvidia-dcgm-x"], False),  # pointed at the node's: dcgmi --host
        ("", [], False),  # none on the node: its own is the only one
    ],
    ids=["own-beside-the-nodes", "not-told", "uses-the-nodes", "none-running"],
)
def test_a_validation_that_would_start_a_second_host_engine_fails(
    hostengine: str | None, running: list[str], second: bool
) -> None:
    """Issue 48, Deliver 5: DCGM allows one nv-hostengine per node; the simulated node refuses a second."""
    assert repairs.second_hostengine(validation_pod(hostengine), running) is second
