"""#26 repair: the pure cycle (decisions.repair) and `spec.repair` parsing, without a cluster."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import re

import pytest

from gpuhealth_api import vocabulary
from gpuhealth_operator.client import kube
from gpuhealth_operator.decisions import model, policies, repair
from gpuhealth_operator.ladder.cordon import cordoning
from gpuhealth_operator.ladder.repair import jobs

RepairAction = vocabulary.RepairAction
Result = vocabulary.RepairResult
T0 = datetime.datetime(2026, 11, 26, 12, 0, tzinfo=datetime.UTC)


def _at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


_PARSED = policies.parse_policy(
    "p",
    1,
    {
        "repair": {
            "steps": [{"name": "reset", "action": "ResetGPU"}, {"name": "reboot", "action": "RebootNode"}],
            "validation": {},
        }
    },
).repair
assert _PARSED is not None
SPEC: model.RepairSpec = _PARSED
RESET, REBOOT = SPEC.steps


def _state(step: int = 0, phase: repair.Phase = repair.Phase.STEP, boot: str | None = "b1") -> repair.State:
    return repair.State(
        policy="p", cycle=1, step=step, phase=phase, since=T0, gpus=("GPU-a",), boot_id=boot, job="j"
    )


# --- spec.repair parsing ------------------------------------------------------------------------------


def test_repair_omitted_is_none() -> None:
    assert policies.parse_policy("p", 1, {}).repair is None


def test_repair_defaults() -> None:
    assert SPEC.steps == (
        model.RepairStep("reset", RepairAction.RESET_GPU, 300.0),
        model.RepairStep("reboot", RepairAction.REBOOT_NODE, 1800.0),
    )
    assert SPEC.validation_timeout_seconds == 900.0
    assert not SPEC.validation_new_nodes
    assert (SPEC.max_concurrent, SPEC.max_attempts, SPEC.attempt_window_seconds) == (1, 3, 604800.0)
    bare = policies.parse_policy(
        "p", 1, {"repair": {"steps": [{"name": "r", "action": "RebootNode"}]}}
    ).repair
    assert bare is not None and bare.validation_timeout_seconds is None  # no validation Job


def test_repair_explicit_values() -> None:
    spec = policies.parse_policy(
        "p",
        1,
        {
            "repair": {
                "steps": [{"name": "reset", "action": "ResetGPU", "timeoutSeconds": 5}],
                "validation": {"timeoutSeconds": 10, "newNodes": True},
                "maxConcurrent": "20%",
                "maxAttempts": 1,
                "attemptWindowSeconds": 3600,
            }
        },
    ).repair
    assert spec is not None
    assert spec.steps[0].timeout_seconds == 5.0
    assert (spec.validation_timeout_seconds, spec.validation_new_nodes) == (10.0, True)
    assert (spec.max_concurrent, spec.max_attempts, spec.attempt_window_seconds) == ("20%", 1, 3600.0)
    assert policies.resolve_max_concurrent(spec, 10) == 2
    assert policies.resolve_max_concurrent(spec, 3) == 1  # rounded down, at least 1


@pytest.mark.parametrize(
    ("repair_spec", "field"),
    [
        ({}, "spec.repair.steps"),
        ({"steps": []}, "spec.repair.steps"),
        ({"steps": [{"name": f"s{i}", "action": "ResetGPU"} for i in range(5)]}, "spec.repair.steps"),
        ({"steps": [{"name": "Reset", "action": "ResetGPU"}]}, "spec.repair.steps[0].name"),
        ({"steps": [{"action": "ResetGPU"}]}, "spec.repair.steps[0].name"),
        (
            {"steps": [{"name": "a", "action": "ResetGPU"}, {"name": "a", "action": "RebootNode"}]},
            "spec.repair.steps[1].name",
        ),
        ({"steps": [{"name": "a", "action": "Pray"}]}, "spec.repair.steps[0].action"),
        (
            {"steps": [{"name": "a", "action": "ResetGPU", "timeoutSeconds": 0}]},
            "spec.repair.steps[0].timeoutSeconds",
        ),
        ({"steps": [{"name": "a", "action": "ResetGPU"}], "maxConcurrent": 0}, "spec.repair.maxConcurrent"),
        ({"steps": [{"name": "a", "action": "ResetGPU"}], "maxAttempts": 0}, "spec.repair.maxAttempts"),
        (
            {"steps": [{"name": "a", "action": "ResetGPU"}], "attemptWindowSeconds": 59},
            "spec.repair.attemptWindowSeconds",
        ),
        (
            {"steps": [{"name": "a", "action": "ResetGPU"}], "validation": {"timeoutSeconds": 0}},
            "spec.repair.validation.timeoutSeconds",
        ),
        (
            {"steps": [{"name": "a", "action": "ResetGPU"}], "validation": {"newNodes": "yes"}},
            "spec.repair.validation.newNodes",
        ),
        ("steps", "spec.repair"),
    ],
)
def test_invalid_repair_names_the_field(repair_spec: object, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{re.escape(field)}:"):
        policies.parse_policy("p", 1, {"repair": repair_spec})


# --- the annotation -----------------------------------------------------------------------------------


def test_state_round_trips() -> None:
    state = repair.State(
        policy="p",
        cycle=3,
        step=1,
        phase=repair.Phase.VALIDATE,
        since=_at(5),
        gpus=("GPU-a", "GPU-b"),
        boot_id="boot-1",
        job="gpuhealth-repair-x",
        started=T0,
    )
    assert repair.parse(repair.render(state)) == state


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "{",
        "[]",
        '{"policy": "p"}',
        '{"policy":"p","cycle":-1,"step":0,"phase":"step","since":"2026-11-26T12:00:00Z","job":"j"}',
        '{"policy":"p","cycle":1,"step":0,"phase":"nap","since":"2026-11-26T12:00:00Z","job":"j"}',
    ],
)
def test_unreadable_state_is_none(text: str | None) -> None:
    assert repair.parse(text) is None


# --- job names ----------------------------------------------------------------------------------------


def test_job_name_is_deterministic_and_short() -> None:
    name = repair.job_name("gpu-node-0001", 2, 1)
    assert name == repair.job_name("gpu-node-0001", 2, 1)
    assert re.fullmatch(r"gpuhealth-repair-gpu-node-0001-[0-9a-f]{6}-c2-1", name)
    assert repair.job_name("gpu-node-0001", 2, 1, validation=True).endswith("-c2-v1")
    long_a = "ip-10-0-12-34.us-west-2.compute.internal.example.com"
    long_b = long_a.replace("example", "elpmaxe")
    for node in (long_a, long_b, "A" * 253):
        made = repair.job_name(node, 123456, 3, validation=True)
        assert len(made) <= 63
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", made), made
    assert repair.job_name(long_a, 1, 0) != repair.job_name(long_b, 1, 0)  # same first 28: the hash differs


# --- steps and starting -------------------------------------------------------------------------------


def test_reset_is_skipped_without_faulty_gpus() -> None:
    assert repair.next_step(SPEC, 0, ["GPU-a"]) == 0
    assert repair.next_step(SPEC, 0, []) == 1
    assert repair.next_step(SPEC, 1, ["GPU-a"]) == 1
    assert repair.next_step(SPEC, 2, ["GPU-a"]) is None


def _history(*cycles_at: tuple[int, float]) -> list[dict[str, object]]:
    return [
        repair.entry(
            _at(t), cycle=c, step="reset", action="ResetGPU", gpus=[], result=Result.STARTED, message=""
        )
        for c, t in cycles_at
    ]


def test_may_start_go_wait_retire() -> None:
    now = _at(1000)
    kwargs = {"in_progress": 0, "limit": 1, "gpus": ["GPU-a"], "now": now}
    assert repair.may_start(SPEC, history=[], **kwargs) is repair.Start.GO  # type: ignore[arg-type]
    assert repair.may_start(SPEC, history=[], **{**kwargs, "in_progress": 1}) is repair.Start.WAIT  # type: ignore[arg-type]
    three = _history((1, 0), (1, 10), (2, 100), (3, 200))
    assert repair.may_start(SPEC, history=three, **kwargs) is repair.Start.RETIRE  # type: ignore[arg-type]
    # cycles older than the window do not count
    old = _history((1, -700000), (2, 100), (3, 200))
    assert repair.cycles_in_window(old, now, SPEC.attempt_window_seconds) == 2
    assert repair.may_start(SPEC, history=old, **kwargs) is repair.Start.GO  # type: ignore[arg-type]
    assert repair.next_cycle(old) == 4
    assert repair.next_cycle([]) == 1
    only_reset = model.RepairSpec(steps=(RESET,))
    assert repair.may_start(only_reset, history=[], **{**kwargs, "gpus": []}) is repair.Start.NOTHING  # type: ignore[arg-type]


# --- observing ----------------------------------------------------------------------------------------


def _job(phase: repair.JobPhase, at: float | None = None) -> repair.JobView:
    return repair.JobView(phase, _at(at) if at is not None else None, "BackoffLimitExceeded")


def _report(at: float | None, boot: str | None = "b1", *, gone: bool) -> repair.Report:
    return repair.Report(_at(at) if at is not None else None, boot, gone)


def test_reset_effect_needs_a_report_newer_than_the_job() -> None:
    state = _state()
    done = _job(repair.JobPhase.SUCCEEDED, 20)
    seen = _at(20)
    assert (
        repair.observe_step(state, RESET, done, _report(15, gone=False), _at(21), finished_seen=seen).outcome
        is repair.Outcome.WAIT
    )
    effect = repair.observe_step(state, RESET, done, _report(25, gone=True), _at(26), finished_seen=seen)
    assert (effect.outcome, effect.result) == (repair.Outcome.EFFECT, Result.SUCCEEDED)
    none = repair.observe_step(state, RESET, done, _report(25, gone=False), _at(26), finished_seen=seen)
    assert (none.outcome, none.result) == (repair.Outcome.FAILED, Result.NO_EFFECT)


def test_failed_missing_and_timed_out_steps() -> None:
    state = _state()
    failed = repair.observe_step(
        state, RESET, _job(repair.JobPhase.FAILED, 5), _report(1, gone=False), _at(6)
    )
    assert (failed.outcome, failed.result) == (repair.Outcome.FAILED, Result.FAILED)
    assert "BackoffLimitExceeded" in failed.message
    gone = repair.observe_step(state, RESET, _job(repair.JobPhase.MISSING), _report(1, gone=False), _at(6))
    assert gone.result is Result.FAILED
    running = _job(repair.JobPhase.ACTIVE)
    assert repair.observe_step(state, RESET, running, _report(1, gone=False), _at(299)) is repair.WAIT
    late = repair.observe_step(state, RESET, running, _report(1, gone=False), _at(300))
    assert (late.outcome, late.result) == (repair.Outcome.FAILED, Result.TIMED_OUT)


def test_reboot_counts_a_new_boot_id_not_the_job() -> None:
    state = _state(step=1)
    running = _job(repair.JobPhase.ACTIVE)
    # the Job's success alone is not the effect: a new bootId is
    done = _job(repair.JobPhase.SUCCEEDED, 10)
    assert repair.observe_step(state, REBOOT, done, _report(20, gone=True), _at(21)) is repair.WAIT
    back = repair.observe_step(state, REBOOT, running, _report(60, "b2", gone=True), _at(61))
    assert (back.outcome, back.result) == (repair.Outcome.EFFECT, Result.SUCCEEDED)
    still = repair.observe_step(state, REBOOT, running, _report(60, "b2", gone=False), _at(61))
    assert (still.outcome, still.result) == (repair.Outcome.FAILED, Result.NO_EFFECT)
    # a pod that died with its node is no failure; a report well after it with the old boot is
    died = _job(repair.JobPhase.FAILED, 10)
    seen = _at(10)
    assert (
        repair.observe_step(state, REBOOT, died, _report(20, gone=False), _at(21), finished_seen=seen)
        is repair.WAIT
    )
    refused = repair.observe_step(state, REBOOT, died, _report(41, gone=False), _at(42), finished_seen=seen)
    assert refused.result is Result.FAILED
    assert (
        repair.observe_step(state, REBOOT, running, _report(1, gone=False), _at(1800)).result
        is Result.TIMED_OUT
    )


def test_validation() -> None:
    state = _state(phase=repair.Phase.VALIDATE)
    passed = repair.observe_validation(state, 900, _job(repair.JobPhase.SUCCEEDED, 3), _at(4))
    assert (passed.outcome, passed.result) == (repair.Outcome.PASSED, Result.VALIDATION_PASSED)
    failed = repair.observe_validation(state, 900, _job(repair.JobPhase.FAILED, 3), _at(4))
    assert (failed.outcome, failed.result) == (repair.Outcome.FAILED, Result.VALIDATION_FAILED)
    assert repair.observe_validation(state, 900, _job(repair.JobPhase.ACTIVE), _at(899)) is repair.WAIT
    assert repair.observe_validation(state, 900, _job(repair.JobPhase.ACTIVE), _at(900)).result is (
        Result.VALIDATION_FAILED
    )


def test_job_view() -> None:
    assert repair.job_view(None).phase is repair.JobPhase.MISSING
    assert repair.job_view({"status": {"active": 1}}).phase is repair.JobPhase.ACTIVE
    done = repair.job_view(
        {
            "status": {
                "completionTime": "2026-11-26T12:00:20Z",
                "conditions": [
                    {"type": "SuccessCriteriaMet", "status": "True"},
                    {"type": "Complete", "status": "True", "lastTransitionTime": "2026-11-26T12:00:21Z"},
                ],
            }
        }
    )
    assert done == repair.JobView(repair.JobPhase.SUCCEEDED, _at(20))
    failed = repair.job_view(
        {
            "status": {
                "conditions": [
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "DeadlineExceeded",
                        "lastTransitionTime": "2026-11-26T12:00:30Z",
                    }
                ]
            }
        }
    )
    assert failed == repair.JobView(repair.JobPhase.FAILED, _at(30), "DeadlineExceeded")


def test_history_keeps_the_last_20() -> None:
    history: list[dict[str, object]] = []
    for i in range(25):
        history = repair.with_entry(
            history,
            repair.entry(
                _at(i),
                cycle=i,
                step="s",
                action="ResetGPU",
                gpus=["GPU-0000000a-0000-0000-0000-000000000000"],
                result=Result.STARTED,
                message="m",
            ),
        )
    assert len(history) == 20
    assert [e["cycle"] for e in history] == list(range(5, 25))


def test_gpu_words() -> None:
    assert repair.gpu_words([(3, "GPU-x")]) == "GPU 3 (GPU-x)"
    assert repair.gpu_words([(1, "GPU-a"), (3, "GPU-b")]) == "GPUs 1 (GPU-a), 3 (GPU-b)"
    assert repair.gpu_words([]) == "all GPUs"


# --- #26 hardening: clock skew ------------------------------------------------------------------------


def test_reset_effect_is_judged_on_the_operators_clock_only() -> None:
    """The operator's clock runs 10 s ahead of the API server's: the Job completed at server time 20 (its
    completionTime), which the operator's clock calls 30; the operator first sees it finished at 31. A
    report it saw at 25 was made while the reset still ran: the fault it shows is no NoEffect."""
    state = _state()
    done = _job(repair.JobPhase.SUCCEEDED, 20)  # completionTime: the API server's clock
    during = repair.observe_step(state, RESET, done, _report(25, gone=False), _at(31), finished_seen=_at(31))
    assert during is repair.WAIT, during
    during_gone = repair.observe_step(
        state, RESET, done, _report(25, gone=True), _at(31), finished_seen=_at(31)
    )  # seen after the step began, the fault gone, the Job then succeeded: the reset's effect
    assert (during_gone.outcome, during_gone.result) == (repair.Outcome.EFFECT, Result.SUCCEEDED)
    after = repair.observe_step(state, RESET, done, _report(35, gone=False), _at(36), finished_seen=_at(31))
    assert (after.outcome, after.result) == (repair.Outcome.FAILED, Result.NO_EFFECT)
    worked = repair.observe_step(state, RESET, done, _report(35, gone=True), _at(36), finished_seen=_at(31))
    assert (worked.outcome, worked.result) == (repair.Outcome.EFFECT, Result.SUCCEEDED)
    # the operator's clock behind (server 20 = operator 10): a report after its own sighting counts
    behind = repair.observe_step(state, RESET, done, _report(12, gone=False), _at(13), finished_seen=_at(11))
    assert behind.result is Result.NO_EFFECT
    # not yet seen finished by this process (None): nothing is judged from the Job's own times
    assert repair.observe_step(state, RESET, done, _report(99, gone=False), _at(99)) is repair.WAIT


def test_a_failed_reboot_is_timed_from_the_operators_sighting() -> None:
    state = _state(step=1)
    died = _job(repair.JobPhase.FAILED, 10)  # server clock, 30 s behind the operator's
    seen = _at(40)
    quiet = repair.observe_step(state, REBOOT, died, _report(60, gone=False), _at(61), finished_seen=seen)
    assert quiet is repair.WAIT  # 20 s after the operator saw it fail: still within the grace
    late = repair.observe_step(state, REBOOT, died, _report(71, gone=False), _at(72), finished_seen=seen)
    assert late.result is Result.FAILED


# --- #26 hardening: a stale Job of the same name -------------------------------------------------------


def test_a_job_belongs_to_the_cycle_that_stamped_it() -> None:
    """A recreated GPUNode restarts cycle numbers: a finished Job of the same name from before (under
    ttlSecondsAfterFinished) is another cycle's, told by the stamp of the cycle's start it carries."""
    state = dataclasses.replace(_state(), started=_at(-5))
    filled = jobs.fill(
        {"spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}},
        name="j",
        namespace="ns",
        node="n",
        node_uid="uid-n",
        policy="p",
        cycle=1,
        action="ResetGPU",
        gpus=["GPU-0000000a-0000-0000-0000-000000000000"],
        timeout_seconds=5,
        cycle_started=repair.cycle_stamp(state),
    )
    assert repair.belongs(filled, state)
    older = dataclasses.replace(state, started=_at(-3600))
    assert not repair.belongs(filled, older)
    assert not repair.belongs({"metadata": {"name": "j"}}, state)  # unstamped: not known to be this cycle's
    assert repair.belongs(filled, dataclasses.replace(state, step=1, since=_at(60)))  # same cycle, later


class _FakeJobs:
    """The Jobs API as `ladder.repair.jobs` uses it: one stored Job of the name, the create's 409."""

    def __init__(self, stored: dict[str, object] | None) -> None:
        self.stored = stored
        self.deleted: list[tuple[str, dict[str, str] | None]] = []

    async def create(self, path: str, body: dict[str, object]) -> dict[str, object]:
        if self.stored is not None:
            raise kube.ApiError(409, "AlreadyExists", "exists")
        self.stored = body
        return body

    async def get(self, path: str) -> dict[str, object]:
        if self.stored is None:
            raise kube.ApiError(404, "NotFound", "")
        return self.stored

    async def request(self, method: str, path: str, query: dict[str, str] | None = None) -> None:
        self.deleted.append((path, query))


def test_a_stale_same_name_job_is_deleted_never_adopted() -> None:
    state = dataclasses.replace(_state(), started=_at(0))
    template = {"spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}}

    def made(stamp_of: repair.State) -> dict[str, object]:
        return jobs.fill(
            template,
            name="j",
            namespace="ns",
            node="n",
            node_uid="uid-n",
            policy="p",
            cycle=1,
            action="ResetGPU",
            gpus=[],
            timeout_seconds=5,
            cycle_started=repair.cycle_stamp(stamp_of),
        )

    old = made(dataclasses.replace(state, started=_at(-600)))
    old["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    fake = _FakeJobs(old)
    with pytest.raises(jobs.StaleJob):
        asyncio.run(jobs.create(fake, made(state), belongs=lambda b: repair.belongs(b, state)))  # type: ignore[arg-type]
    assert fake.deleted == [("/apis/batch/v1/namespaces/ns/jobs/j", {"propagationPolicy": "Background"})]
    # this cycle's own Job (a lost answer, a new leader): adopted
    own = _FakeJobs(made(state))
    body, created = asyncio.run(jobs.create(own, made(state), belongs=lambda b: repair.belongs(b, state)))  # type: ignore[arg-type]
    assert not created and body is own.stored and not own.deleted


# --- #26 hardening: waiting for maxConcurrent is said -------------------------------------------------


def test_the_wait_for_max_concurrent_names_the_holders() -> None:
    assert repair.wait_words(1, ["gpu-b"]) == "repair maxConcurrent 1 reached, held by node gpu-b"
    assert repair.wait_words(2, ["b", "a"]) == "repair maxConcurrent 2 reached, held by nodes a, b"
    many = repair.wait_words(12, [f"n{i:02d}" for i in range(12)])
    assert many.endswith("held by nodes n00, n01, n02, n03, n04, n05, n06, n07, n08, n09 and 2 more"), many


# --- #26 hardening: a create whose answer is lost ------------------------------------------------------


class _LostAnswer(_FakeJobs):
    """The API server stores the Job, but its answer never arrives (a 504 from its own timeout)."""

    async def create(self, path: str, body: dict[str, object]) -> dict[str, object]:
        if self.stored is None:
            self.stored = body
            raise kube.ApiError(504, "Gateway Timeout", "the answer was lost")
        return await super().create(path, body)


def test_a_create_whose_answer_is_lost_is_adopted_by_name_never_a_second_job() -> None:
    """The outcome is unknown (`cordoning.outcome_unknown`): the error propagates, so `stepping.launch`
    neither fails the step nor creates again in that pass; the next pass's create meets 409 and adopts the
    Job that landed, as this cycle's (its stamp)."""
    state = dataclasses.replace(_state(), started=_at(0))
    job = jobs.fill(
        {"spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}},
        name="j",
        namespace="ns",
        node="n",
        node_uid="uid-n",
        policy="p",
        cycle=1,
        action="ResetGPU",
        gpus=[],
        timeout_seconds=5,
        cycle_started=repair.cycle_stamp(state),
    )
    api = _LostAnswer(None)
    with pytest.raises(kube.ApiError) as lost:
        asyncio.run(jobs.create(api, job, belongs=lambda b: repair.belongs(b, state)))  # type: ignore[arg-type]
    assert cordoning.outcome_unknown(lost.value)
    body, created = asyncio.run(jobs.create(api, job, belongs=lambda b: repair.belongs(b, state)))  # type: ignore[arg-type]
    assert not created and body is api.stored and not api.deleted


def test_a_cleared_fault_written_while_the_reset_job_ends_counts_without_waiting_for_a_heartbeat() -> None:
    """The agent writes the cleared counters at once (a significant change), usually before the operator
    sees the Job finished; its next report may be a heartbeat (300 s) away. That report, seen after the
    step began, is the effect; one seen before the step began is not, nor is any while the Job runs."""
    state = _state()  # the step began at T0
    done = _job(repair.JobPhase.SUCCEEDED, 20)
    early = repair.observe_step(state, RESET, done, _report(5, gone=True), _at(21), finished_seen=_at(21))
    assert (early.outcome, early.result) == (repair.Outcome.EFFECT, Result.SUCCEEDED)
    before = repair.observe_step(state, RESET, done, _report(-1, gone=True), _at(21), finished_seen=_at(21))
    assert before is repair.WAIT
    running = repair.observe_step(state, RESET, _job(repair.JobPhase.ACTIVE), _report(5, gone=True), _at(6))
    assert running is repair.WAIT
    failed = repair.observe_step(
        state, RESET, _job(repair.JobPhase.FAILED, 20), _report(5, gone=True), _at(21)
    )
    assert (failed.outcome, failed.result) == (repair.Outcome.FAILED, Result.FAILED)


# --- NVSwitch boards: a ResetGPU resets the board's GPUs together (issue 48, item 4) --------------------


def fabric_gpu(index: int, clique: int | None = 1, *, fabric: bool = True) -> dict[str, object]:
    gpu: dict[str, object] = {"index": index, "uuid": f"GPU-{index:08d}-0000-0000-0000-000000000000"}
    if fabric:
        gpu["fabric"] = {"state": "Completed", "status": "Success"} | (
            {"cliqueId": clique} if clique is not None else {}
        )
    return gpu


def uuid(index: int) -> str:
    return f"GPU-{index:08d}-0000-0000-0000-000000000000"


@pytest.mark.parametrize(
    ("listed", "faulty", "expected"),
    [
        ([fabric_gpu(i, fabric=False) for i in range(8)], [3], [3]),  # PCIe GPUs: the faulty one alone
        ([fabric_gpu(i) for i in range(8)], [3], list(range(8))),  # HGX: the whole board
        ([fabric_gpu(i, clique=None) for i in range(4)], [1], [0, 1, 2, 3]),  # no clique: the node's fabric
        (
            [*(fabric_gpu(i, 1) for i in range(4)), *(fabric_gpu(i, 2) for i in range(4, 8))],
            [5],
            [4, 5, 6, 7],
        ),
        (
            [*(fabric_gpu(i, 1) for i in range(4)), *(fabric_gpu(i, 2) for i in range(4, 8))],
            [0, 6],
            list(range(8)),
        ),
    ],
    ids=["pcie", "hgx-board", "no-clique", "two-boards", "faults-on-both"],
)
def test_a_reset_on_an_nvswitch_board_takes_the_boards_gpus_together(
    listed: list[dict[str, object]], faulty: list[int], expected: list[int]
) -> None:
    found = repair.reset_together([(i, uuid(i)) for i in faulty], listed)
    assert found == [(i, uuid(i)) for i in expected]


@pytest.mark.parametrize(
    ("recovery", "first"),
    [
        ([], 0),  # no request: the policy's first step
        (["None"], 0),
        (["NodeReboot"], 1),  # the driver asks for a reboot: no reset first
        (["GpuReset", "SystemReboot"], 1),  # a reboot cures both
        (["DrainAndReset"], 0),
        (["BusReset"], 0),
    ],
)
def test_the_drivers_recovery_action_picks_the_first_step(recovery: list[str], first: int) -> None:
    assert repair.first_step(SPEC, [uuid(0)], recovery) == first


def test_a_reset_request_without_a_reset_step_starts_at_the_first_step() -> None:
    only_reboot = model.RepairSpec(steps=(REBOOT,))
    assert repair.first_step(only_reboot, [uuid(0)], ["GpuReset"]) == 0
