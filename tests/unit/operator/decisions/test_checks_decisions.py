"""Active checks, the pure part: which checks start where and when, how a run ended, what it reported,
and whether ActiveCheckFailed holds. Plain values in, plain values out."""

import datetime
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import checks, model, policies, straggler_stats

Result = vocabulary.CheckResult
T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
DAY = 86400.0


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def check(name: str = "quick", **fields: object) -> model.ActiveCheck:
    values: dict[str, object] = {
        "name": name,
        "template": "DcgmDiagQuick",
        "every_seconds": DAY,
        "idle_for_seconds": 900.0,
        "timeout_seconds": 900.0,
        "max_concurrent": 100,
    } | fields
    return model.ActiveCheck(**values)  # type: ignore[arg-type]


def node(name: str, **fields: object) -> checks.NodeState:
    values: dict[str, object] = {"name": name, "idle_since": at(0), "known_since": at(0)} | fields
    return checks.NodeState(**values)  # type: ignore[arg-type]


def policy(
    name: str, nodes: set[str], *items: model.ActiveCheck, dry_run: bool = False
) -> checks.PolicyChecks:
    return checks.PolicyChecks(
        policy=name, dry_run=dry_run, checks=items or (check(),), nodes=frozenset(nodes)
    )


def run(name: str, seconds: float, result: Result = Result.PASSED, **figures: float) -> checks.Run:
    return checks.Run(check=name, time=at(seconds), result=result, figures=figures)


NOW = at(10 * DAY)


# --- which checks start ---------------------------------------------------------------------------


def test_an_idle_node_never_checked_is_started() -> None:
    plan = checks.plan([policy("p", {"a"})], [node("a")], (), NOW)
    assert plan.start == (checks.Start("a", "p", "quick", "DcgmDiagQuick", 900.0),)
    assert plan.would_start == plan.waiting == ()


def test_a_node_checked_within_every_seconds_is_not_due() -> None:
    fresh = node("a", runs=(run("quick", 10 * DAY - 3600),))
    assert checks.plan([policy("p", {"a"})], [fresh], (), NOW).start == ()
    stale = node("a", runs=(run("quick", 9 * DAY - 1),))
    assert [s.node for s in checks.plan([policy("p", {"a"})], [stale], (), NOW).start] == ["a"]


def test_a_preempted_run_does_not_count_as_a_check() -> None:
    preempted = node(
        "a",
        runs=(
            run("quick", 9 * DAY - 1),
            run("quick", NOW.timestamp() - T0.timestamp() - 60, Result.PREEMPTED),
        ),
    )
    assert [s.node for s in checks.plan([policy("p", {"a"})], [preempted], (), NOW).start] == ["a"]


@pytest.mark.parametrize("failed", [Result.FAILED, Result.TIMED_OUT])
def test_a_failed_or_timed_out_run_counts_as_a_check_for_the_schedule(failed: Result) -> None:
    done = node("a", runs=(run("quick", 10 * DAY - 60, failed),))
    assert checks.plan([policy("p", {"a"})], [done], (), NOW).start == ()


def test_a_node_is_checked_only_after_idle_for_seconds_without_a_gpu_pod() -> None:
    busy = node("a", idle_since=None)
    recent = node("b", idle_since=NOW - datetime.timedelta(seconds=899))
    idle = node("c", idle_since=NOW - datetime.timedelta(seconds=900))
    plan = checks.plan([policy("p", {"a", "b", "c"})], [busy, recent, idle], (), NOW)
    assert [s.node for s in plan.start] == ["c"]


@pytest.mark.parametrize(
    "guard",
    [
        {"schedulable": False},
        {"in_repair": True},
        {"excluded": True},
        {"maintenance": True},
        {"overridden": True},
    ],
    ids=lambda g: next(iter(g)),
)
def test_never_on_a_guarded_node(guard: dict[str, bool]) -> None:
    plan = checks.plan([policy("p", {"a"})], [node("a", **guard)], (), NOW)
    assert plan.start == plan.would_start == plan.waiting == ()


def test_a_node_no_policy_selects_is_never_checked() -> None:
    plan = checks.plan([policy("p", {"a"})], [node("a"), node("b")], (), NOW)
    assert [s.node for s in plan.start] == ["a"]


def test_a_dry_run_policy_only_says_it_would_check() -> None:
    plan = checks.plan([policy("p", {"a"}, dry_run=True)], [node("a")], (), NOW)
    assert plan.start == ()
    assert plan.would_start == (checks.Start("a", "p", "quick", "DcgmDiagQuick", 900.0),)


def test_a_node_an_acting_and_a_dry_run_policy_select_runs_the_acting_policys_check() -> None:
    policies = [policy("dry", {"a"}, check("deep", template="DcgmDiag"), dry_run=True), policy("act", {"a"})]
    plan = checks.plan(policies, [node("a")], (), NOW)
    assert [(s.policy, s.check) for s in plan.start] == [("act", "quick")]
    assert plan.would_start == ()  # the node is taken by the real check: nothing it "would" do there now
    checked = node("a", runs=(run("quick", 10 * DAY - 60),))
    plan = checks.plan(policies, [checked], (), NOW)
    assert plan.start == ()
    assert [(s.policy, s.check) for s in plan.would_start] == [("dry", "deep")]


def test_never_two_checks_on_one_node() -> None:
    two = policy("p", {"a"}, check("quick"), check("deep", template="DcgmDiag"))
    assert len(checks.plan([two], [node("a")], (), NOW).start) == 1
    other = policy("q", {"a"}, check("other"))
    assert len(checks.plan([two, other], [node("a")], (), NOW).start) == 1


def test_a_node_with_a_check_in_flight_gets_no_second_one_from_any_policy() -> None:
    in_flight = (checks.InFlight("a", "q", "other"),)
    plan = checks.plan([policy("p", {"a", "b"})], [node("a"), node("b")], in_flight, NOW)
    assert [s.node for s in plan.start] == ["b"]


def test_the_check_in_flight_is_not_started_again_after_a_restart() -> None:
    """A restarted leader's plan sees the running Job as in flight: nothing starts on that node."""
    plan = checks.plan([policy("p", {"a"})], [node("a")], (checks.InFlight("a", "p", "quick"),), NOW)
    assert plan.start == ()


def test_most_overdue_first() -> None:
    nodes = [
        node("recent", runs=(run("quick", 8 * DAY),)),
        node("oldest", runs=(run("quick", 1 * DAY),)),
        node("never", known_since=at(6 * DAY)),
        node("older", runs=(run("quick", 4 * DAY),)),
    ]
    plan = checks.plan([policy("p", {n.name for n in nodes}, check(max_concurrent=3))], nodes, (), NOW)
    assert [s.node for s in plan.start] == ["oldest", "older", "never"]
    assert [s.node for s in plan.waiting] == ["recent"]


def test_max_concurrent_counts_in_flight_checks_of_all_policies() -> None:
    nodes = [node(f"n{i}") for i in range(6)]
    p = policy("p", {"n0", "n1", "n2"}, check(max_concurrent=3))
    q = policy("q", {"n3", "n4", "n5"}, check("other", max_concurrent=3))
    in_flight = (checks.InFlight("n0", "p", "quick"), checks.InFlight("n3", "q", "other"))
    plan = checks.plan([p, q], nodes, in_flight, NOW)
    assert len(plan.start) == 1
    assert len(plan.waiting) == 3


def test_a_percent_max_concurrent_is_of_all_policies_selected_nodes_together() -> None:
    nodes = [node(f"n{i:02}") for i in range(40)]
    p = policy("p", {n.name for n in nodes[:20]}, check(max_concurrent="5%"))
    q = policy("q", {n.name for n in nodes[20:]}, check("other", max_concurrent="5%"))
    plan = checks.plan([p, q], nodes, (), NOW)
    assert len(plan.start) == 2  # 5% of 40, not 1 of each policy's 20
    assert (
        checks.plan([p], nodes[:20], (), NOW).start[0:]
        and len(checks.plan([p], nodes[:20], (), NOW).start) == 1
    )


def test_a_percent_max_concurrent_is_never_below_one() -> None:
    p = policy("p", {"a", "b"}, check(max_concurrent="1%"))
    assert len(checks.plan([p], [node("a"), node("b")], (), NOW).start) == 1


def test_dry_run_checks_take_no_budget() -> None:
    dry = policy("dry", {"a"}, check(max_concurrent=1), dry_run=True)
    act = policy("act", {"b"}, check("other", max_concurrent=1))
    plan = checks.plan([dry, act], [node("a"), node("b")], (), NOW)
    assert [s.node for s in plan.start] == ["b"]
    assert [s.node for s in plan.would_start] == ["a"]


def test_the_plan_never_exceeds_max_concurrent_whatever_is_in_flight() -> None:
    nodes = [node(f"n{i:02}") for i in range(30)]
    for limit in (1, 2, 5):
        for busy in range(0, 8):
            in_flight = tuple(checks.InFlight(f"n{i:02}", "p", "quick") for i in range(busy))
            plan = checks.plan(
                [policy("p", {n.name for n in nodes}, check(max_concurrent=limit))], nodes, in_flight, NOW
            )
            assert len(plan.start) == max(0, limit - busy)
            assert not {s.node for s in plan.start} & {f.node for f in in_flight}


GUARDS = ("schedulable", "in_repair", "excluded", "maintenance", "overridden")


@st.composite
def fleets(
    draw: st.DrawFn,
) -> tuple[list[checks.PolicyChecks], list[checks.NodeState], list[checks.InFlight]]:
    names = [f"n{i}" for i in range(draw(st.integers(1, 12)))]
    nodes = []
    for name in names:
        guard = draw(st.sampled_from((None, *GUARDS)))
        fields: dict[str, object] = {} if guard is None else {guard: guard != "schedulable"}
        idle = draw(st.one_of(st.none(), st.floats(0, 10 * DAY)))
        last = draw(st.one_of(st.none(), st.floats(0, 10 * DAY)))
        runs = (
            ()
            if last is None
            else (run(draw(st.sampled_from(("a", "b"))), last, draw(st.sampled_from(list(Result)))),)
        )
        nodes.append(node(name, idle_since=None if idle is None else at(idle), runs=runs, **fields))
    policy_list = []
    for i in range(draw(st.integers(1, 3))):
        selected = draw(st.sets(st.sampled_from(names)))
        limit = draw(st.one_of(st.integers(1, 4), st.sampled_from(["5%", "25%", "50%", "100%"])))
        items = tuple(
            check(n, max_concurrent=limit, idle_for_seconds=600.0)
            for n in draw(st.sets(st.sampled_from(("a", "b")), min_size=1))
        )
        policy_list.append(policy(f"p{i}", selected, *items, dry_run=draw(st.booleans())))
    in_flight = [checks.InFlight(n, "p0", "a") for n in draw(st.sets(st.sampled_from(names), max_size=4))]
    return policy_list, nodes, in_flight


@settings(max_examples=300, deadline=None)
@given(fleets())
def test_the_plan_keeps_every_guard(
    fleet: tuple[list[checks.PolicyChecks], list[checks.NodeState], list[checks.InFlight]],
) -> None:
    policy_list, nodes, in_flight = fleet
    plan = checks.plan(policy_list, nodes, in_flight, NOW)
    by_name = {n.name: n for n in nodes}
    started = [s.node for s in plan.start]
    assert len(started) == len(set(started)), "two checks on one node"
    assert not set(started) & {f.node for f in in_flight}, "a second check beside one in flight"
    assert not {s.node for s in plan.would_start} & (set(started) | {f.node for f in in_flight})
    acting = {p.policy: p for p in policy_list if not p.dry_run}
    selected = len(set().union(*(p.nodes for p in acting.values())))
    for s in plan.start:
        state = by_name[s.node]
        assert not state.guarded and state.idle_since is not None
        assert s.policy in acting and s.node in acting[s.policy].nodes
        (item,) = [c for c in acting[s.policy].checks if c.name == s.check]
        assert len(in_flight) + started.index(s.node) < policies.resolve_check_max_concurrent(item, selected)
    for s in plan.would_start:
        assert s.policy not in acting and not by_name[s.node].guarded


# --- overdue --------------------------------------------------------------------------------------


def test_overdue_means_no_pass_within_every_seconds() -> None:
    nodes = [
        node("passed", runs=(run("quick", 9.5 * DAY),)),
        node("failed", runs=(run("quick", 9.5 * DAY, Result.FAILED), run("quick", 8 * DAY))),
        node("preempted", runs=(run("quick", 9.9 * DAY, Result.PREEMPTED),)),
        node("new", known_since=at(9.9 * DAY)),
        node("never"),
    ]
    overdue = checks.overdue([policy("p", {n.name for n in nodes})], nodes, NOW)
    assert [(o.node, o.check) for o in overdue] == [
        ("failed", "quick"),
        ("never", "quick"),
        ("preempted", "quick"),
    ]
    assert overdue[1].since == at(DAY)
    assert checks.overdue_nodes(overdue) == ["failed", "never", "preempted"]


# --- a run's result -------------------------------------------------------------------------------


def pod(phase: str, *conditions: dict[str, str], message: str | None = None) -> dict[str, object]:
    terminated: dict[str, object] = {"exitCode": 0 if phase == "Succeeded" else 1}
    if message is not None:
        terminated["message"] = message
    return {
        "status": {
            "phase": phase,
            "conditions": list(conditions),
            "containerStatuses": [{"name": "check", "state": {"terminated": terminated}}],
        }
    }


def job(*conditions: dict[str, str]) -> dict[str, object]:
    return {"status": {"conditions": list(conditions)}}


PREEMPTED = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
COMPLETE = {"type": "Complete", "status": "True"}
FAILED = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
DEADLINE = {"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}


def test_a_running_check_has_no_result() -> None:
    assert checks.result_of(job(), {"status": {"phase": "Running"}}) is None
    assert checks.result_of(job(), None) is None


def test_results_from_the_job_and_its_pod() -> None:
    assert checks.result_of(job(COMPLETE), pod("Succeeded")) is Result.PASSED
    assert checks.result_of(job(FAILED), pod("Failed")) is Result.FAILED
    assert checks.result_of(job(DEADLINE), pod("Failed")) is Result.TIMED_OUT
    assert checks.result_of(job(), pod("Succeeded")) is Result.PASSED
    assert checks.result_of(job(), pod("Failed")) is Result.FAILED


def test_a_pod_the_scheduler_preempted_is_preempted_never_failed() -> None:
    assert checks.result_of(job(FAILED), pod("Failed", PREEMPTED)) is Result.PREEMPTED
    assert checks.result_of(job(), pod("Running", PREEMPTED)) is Result.PREEMPTED
    assert checks.result_of(None, pod("Failed", PREEMPTED)) is Result.PREEMPTED


def test_a_job_its_pod_failure_policy_failed_for_a_disruption_is_preempted_once_the_pod_is_gone() -> None:
    # The check Job's podFailurePolicy fails it on the pod's DisruptionTarget condition: once the preempted
    # pod is deleted only the Job's condition is left to tell a preemption from a failed check.
    by_policy = {
        "type": "Failed",
        "status": "True",
        "reason": "PodFailurePolicy",
        "message": "Pod ns/check-a-x has condition DisruptionTarget matching FailJob rule at index 0",
    }
    assert checks.result_of(job(by_policy), None) is Result.PREEMPTED
    assert checks.result_of(job({**by_policy, "message": "Pod ns/x has condition Other"}), None) is (
        Result.FAILED
    )


def test_another_disruption_is_a_failure_not_a_preemption() -> None:
    evicted = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    assert checks.result_of(job(FAILED), pod("Failed", evicted)) is Result.FAILED
    stale = {**PREEMPTED, "status": "False"}
    assert checks.result_of(job(FAILED), pod("Failed", stale)) is Result.FAILED


def test_a_check_past_its_deadline_without_a_job_verdict_timed_out() -> None:
    started = at(0)
    assert (
        checks.result_of(
            job(), {"status": {"phase": "Running"}}, started=started, timeout_seconds=900, now=at(899)
        )
        is None
    )
    assert (
        checks.result_of(
            job(), {"status": {"phase": "Running"}}, started=started, timeout_seconds=900, now=at(960)
        )
        is Result.TIMED_OUT
    )


def test_malformed_objects_are_no_result_never_a_crash() -> None:
    for body in (
        {},
        {"status": None},
        {"status": {"conditions": "x"}},
        {"status": {"conditions": [None, 3]}},
        "pod",
    ):
        assert checks.result_of(body, body) is None  # type: ignore[arg-type]


# --- figures --------------------------------------------------------------------------------------


def test_figures_come_from_the_termination_message() -> None:
    figures, message = checks.figures_of(pod("Succeeded", message='{"busBandwidthGBps": 372.4, "n": 8}'))
    assert figures == {"busBandwidthGBps": 372.4, "n": 8.0}
    assert message == ""


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("all good", {}),
        ("[1, 2]", {}),
        ('{"a": "fast", "b": 2}', {"b": 2.0}),
        ('{"a": true, "b": NaN, "c": Infinity, "d": 1e400}', {}),
        ('{"a": 1', {}),
        ("", {}),
    ],
)
def test_a_bad_termination_message_is_a_message_never_a_crash(text: str, kept: dict[str, float]) -> None:
    figures, message = checks.figures_of(pod("Failed", message=text))
    assert figures == kept
    if text and not kept:
        assert message and len(message) <= checks.MESSAGE_CHARS


def test_a_long_termination_message_is_cut() -> None:
    _, message = checks.figures_of(pod("Failed", message="x" * 10000))
    assert len(message) <= checks.MESSAGE_CHARS


def test_too_many_figures_are_cut_to_a_bound() -> None:
    text = "{" + ",".join(f'"f{i:03}": {i}' for i in range(100)) + "}"
    figures, message = checks.figures_of(pod("Succeeded", message=text))
    assert len(figures) == checks.MAX_FIGURES
    assert "figures" in message


def test_no_pod_no_figures() -> None:
    assert checks.figures_of(None) == ({}, "")
    assert checks.figures_of({"status": {"containerStatuses": "x"}}) == ({}, "")


# --- z-scores against same-model nodes ------------------------------------------------------------


def test_a_figure_far_below_same_model_peers_fails_the_threshold() -> None:
    peers = {f"n{i}": 370.0 + i for i in range(6)} | {"slow": 300.0}
    z = checks.figure_z("slow", peers)
    assert z is not None and z < -3.5
    assert checks.below_threshold({"bw": 300.0}, {"bw": peers}, "slow", 3.5) == ["bw"]
    assert checks.below_threshold({"bw": 372.0}, {"bw": peers}, "n2", 3.5) == []


def test_too_few_peers_judge_nothing() -> None:
    peers = {"a": 370.0, "b": 371.0, "c": 372.0, "slow": 100.0}  # 3 peers: fewer than 4
    assert checks.figure_z("slow", peers) is None
    assert checks.below_threshold({"bw": 100.0}, {"bw": peers}, "slow", 3.5) == []


def test_a_node_without_the_figure_has_no_z() -> None:
    assert checks.figure_z("x", {f"n{i}": 1.0 for i in range(6)}) is None


def test_the_z_score_is_the_stragglers_robust_one() -> None:
    """The same median and floored MAD as decisions/stragglers (no second copy of the statistics)."""
    values = {f"n{i}": v for i, v in enumerate([10.0, 10.1, 9.9, 10.2, 9.8, 7.0])}
    median, scale = straggler_stats.cohort_scale(list(values.values()))
    assert checks.figure_z("n5", values) == pytest.approx(
        straggler_stats.MAD_TO_SIGMA * (7.0 - median) / scale
    )
    assert math.isfinite(checks.figure_z("n0", {f"n{i}": 5.0 for i in range(6)}) or 0.0)


# --- ActiveCheckFailed and history ----------------------------------------------------------------


def test_active_check_failed_is_true_from_a_failed_run_until_a_later_pass() -> None:
    assert checks.check_failed(()) is None
    assert checks.check_failed((run("quick", 1),)) is None
    failed = checks.check_failed((run("quick", 1), run("quick", 2, Result.FAILED)))
    assert failed == checks.Failing(check="quick", since=at(2))
    still = (
        run("quick", 2, Result.FAILED),
        run("quick", 3, Result.PREEMPTED),
        run("quick", 4, Result.FAILED),
    )
    assert checks.check_failed(still) == checks.Failing(check="quick", since=at(2))
    assert checks.check_failed((*still, run("quick", 5))) is None


def test_a_timed_out_run_is_not_a_failure_of_the_gpus() -> None:
    assert checks.check_failed((run("quick", 1, Result.TIMED_OUT),)) is None


def test_each_check_is_judged_on_its_own_runs() -> None:
    history = (run("deep", 1, Result.FAILED), run("quick", 2))
    assert checks.check_failed(history) == checks.Failing(check="deep", since=at(1))


def test_history_is_bounded_newest_kept() -> None:
    history: tuple[checks.Run, ...] = ()
    for i in range(checks.HISTORY_LIMIT + 5):
        history = checks.with_run(history, run("quick", i))
    assert len(history) == checks.HISTORY_LIMIT
    assert history[-1].time == at(checks.HISTORY_LIMIT + 4)
    assert history[0].time == at(5)


def test_a_check_in_flight_on_a_deleted_node_still_counts_until_its_job_goes() -> None:
    """The Job of a deleted Node lives until the garbage collector removes it: it holds its place."""
    in_flight = (checks.InFlight("gone", "p", "quick"),)
    plan = checks.plan([policy("p", {"a", "gone"}, check(max_concurrent=1))], [node("a")], in_flight, NOW)
    assert plan.start == ()
    assert [s.node for s in plan.waiting] == ["a"]


def test_a_re_created_node_is_due_from_its_new_joining() -> None:
    """A Node deleted and made again has a new GPUNode: its history starts empty, due from its creation."""
    again = node("a", known_since=NOW - datetime.timedelta(hours=1))
    assert [s.node for s in checks.plan([policy("p", {"a"})], [again], (), NOW).start] == ["a"]
    assert checks.overdue([policy("p", {"a"})], [again], NOW) == []
