"""What `why`, `status` and `check` show of active checks: the history, the overdue nodes, one result."""

import datetime
from typing import Any

from gpuhealth_api import keys, timestamps
from gpuhealth_kubectl import checkviews

NOW = datetime.datetime(2026, 12, 2, 12, 0, tzinfo=datetime.UTC)
QUICK = {
    "name": "quick",
    "template": "DcgmDiagQuick",
    "everySeconds": 3600,
    "idleForSeconds": 60,
    "timeoutSeconds": 600,
    "maxConcurrent": 1,
}


def stamp(minutes_ago: float) -> str:
    return (NOW - datetime.timedelta(minutes=minutes_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def run(name: str, result: str, minutes_ago: float, **more: Any) -> dict[str, Any]:
    return {
        "name": name,
        "template": "DcgmDiagQuick",
        "policy": "fleet",
        "started": stamp(minutes_ago + 1),
        "time": stamp(minutes_ago),
        "result": result,
        **more,
    }


def gpunode(name: str, runs: list[dict[str, Any]], *, joined_minutes_ago: float = 600) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "creationTimestamp": stamp(joined_minutes_ago)},
        "status": {"health": "Healthy", "checks": runs},
    }


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"pool": "a", **labels}}, "spec": {}}


def policy(checks: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "fleet", "generation": 1},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "a"}}, "activeChecks": checks, **spec},
    }


def test_the_history_keeps_the_last_runs_of_each_check_newest_first() -> None:
    runs = [run("quick", "Passed", 50 - i) for i in range(5)] + [
        run("deep", "Failed", 3, template="DcgmDiag", message="GPU 2 memory test failed"),
        run("quick", "Preempted", 1),
    ]
    rows = checkviews.history(gpunode("n1", runs), per_check=3)
    assert [(r["name"], r["result"], r["time"]) for r in rows] == [
        ("deep", "Failed", stamp(3)),
        ("quick", "Preempted", stamp(1)),
        ("quick", "Passed", stamp(46)),
        ("quick", "Passed", stamp(47)),
    ]
    text = "\n".join(checkviews.render_history(rows, NOW))
    assert "deep   DcgmDiag" in text and "GPU 2 memory test failed" in text
    assert "Preempted" in text and " 1m " in text


def test_figures_show_in_the_history() -> None:
    rows = checkviews.history(gpunode("n1", [run("nccl", "Passed", 2, figures={"busBandwidthGBps": 310.5})]))
    assert "busBandwidthGBps=310.5" in "\n".join(checkviews.render_history(rows, NOW))


def test_a_node_without_a_pass_within_every_seconds_is_overdue() -> None:
    gpunodes = [
        gpunode("fresh", [run("quick", "Passed", 10)]),
        gpunode("stale", [run("quick", "Passed", 90), run("quick", "Failed", 5)]),
        gpunode("never", [], joined_minutes_ago=61),
        gpunode("new", [], joined_minutes_ago=30),
        gpunode("other", [], joined_minutes_ago=600),
    ]
    nodes = [node("fresh"), node("stale"), node("never"), node("new"), {"metadata": {"name": "other"}}]
    rows = checkviews.overdue([policy([QUICK])], gpunodes, nodes, NOW)
    assert [(r["node"], r["policy"], r["check"], timestamps.parse(r["since"])) for r in rows] == [
        ("never", "fleet", "quick", timestamps.parse(stamp(1))),
        ("stale", "fleet", "quick", timestamps.parse(stamp(30))),
    ]
    text = "\n".join(checkviews.render_overdue(rows, NOW))
    assert "never" in text and "stale" in text and "30m" in text


def test_an_excluded_node_and_a_policy_without_checks_are_never_overdue() -> None:
    gpunodes = [gpunode("out", [], joined_minutes_ago=600)]
    nodes = [node("out", **{keys.EXCLUDE_LABEL: "true"})]
    assert checkviews.overdue([policy([QUICK])], gpunodes, nodes, NOW) == []
    assert checkviews.overdue([policy([])], [gpunode("in", [])], [node("in")], NOW) == []


def test_the_result_of_a_request_is_the_run_carrying_its_token() -> None:
    mine = run("quick", "Failed", 0, requestId="tok1", figures={"x": 1.0}, message="GPU 3 failed")
    body = gpunode("n1", [run("quick", "Passed", 5, requestId="other"), mine])
    outcome = checkviews.request_outcome(body, [], "tok1")
    assert outcome is not None and outcome["result"] == "Failed"
    assert checkviews.exit_code(outcome) == 1
    text = checkviews.render_outcome("n1", outcome)
    assert "Failed" in text and "GPU 3 failed" in text and "x=1" in text
    assert checkviews.request_outcome(body, [], "tok2") is None


def test_a_refused_request_is_its_check_refused_event() -> None:
    events = [
        {"reason": "CheckRefused", "message": "check request tok9 refused: the node is cordoned"},
        {"reason": "CheckRefused", "message": "check request tok1 refused: the node is in repair"},
    ]
    outcome = checkviews.request_outcome(gpunode("n1", []), events, "tok1")
    assert outcome == {"result": "Refused", "message": "check request tok1 refused: the node is in repair"}
    assert checkviews.exit_code(outcome) == 1
    assert "refused" in checkviews.render_outcome("n1", outcome).lower()


def test_passed_exits_0_and_preempted_says_it_is_no_failure() -> None:
    passed = checkviews.request_outcome(gpunode("n1", [run("quick", "Passed", 0, requestId="t")]), [], "t")
    assert passed is not None and checkviews.exit_code(passed) == 0
    preempted = checkviews.request_outcome(
        gpunode("n1", [run("quick", "Preempted", 0, requestId="t")]), [], "t"
    )
    assert preempted is not None and checkviews.exit_code(preempted) == 1
    assert "not a failure" in checkviews.render_outcome("n1", preempted)
