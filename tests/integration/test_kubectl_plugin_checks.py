"""`kubectl gpuhealth check`, and active checks in `why` and `status`, against a real API server.

The plugin runs as its console script with $KUBECONFIG, as a user runs it. The test plays the operator's
side of the contract (api/gpuhealth_api/keys.py CHECK_NOW_ANNOTATION): it takes the request off the
GPUNode and writes the run, carrying the request's token, to GPUNode `status.checks[]`, or refuses it
with a `CheckRefused` Event naming the token.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

import operator_fixtures
import operator_harness
from gpuhealth_api import keys, resources, timestamps
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

TIMEOUT = 30.0
PLUGIN = str(pathlib.Path(sys.executable).parent / "kubectl-gpuhealth")
QUICK = {
    "name": "quick",
    "template": "DcgmDiagQuick",
    "everySeconds": 3600,
    "idleForSeconds": 60,
    "timeoutSeconds": 600,
    "maxConcurrent": 1,
}
CORDON = {"name": "ecc-cordon", "condition": "EccUncorrectable", "action": "Cordon"}


@pytest.fixture
def fleet(
    request: pytest.FixtureRequest, crds: local.ControlPlane, k8s: client.ApiClient
) -> Iterator[operator_harness.Fleet]:
    with operator_harness.Fleet(k8s, label=operator_fixtures.label_for("kc", request)) as nodes:
        yield nodes


@pytest.fixture
def plugin(crds: local.ControlPlane) -> Any:
    """Start `kubectl-gpuhealth ARGS` with $KUBECONFIG as a user has it; the running process."""

    def start(*args: str) -> subprocess.Popen[str]:
        env = {**os.environ, "KUBECONFIG": str(crds.kubeconfig)}
        return subprocess.Popen(
            [PLUGIN, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    return start


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=60)
    return process.returncode, out, err


def now_stamp(seconds_ago: float = 0) -> str:
    return timestamps.render(datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds_ago))


def take_request(fleet: operator_harness.Fleet, node: str) -> dict[str, Any]:
    """The operator's side: wait for the node's check-now request, then remove it (as the operator does)."""

    def asked() -> dict[str, Any] | None:
        value = (fleet.gpunode(node)["metadata"].get("annotations") or {}).get(keys.CHECK_NOW_ANNOTATION)
        return json.loads(value) if value else None

    found: dict[str, Any] = waiting.wait_until(asked, timeout_seconds=TIMEOUT, message="a check-now request")
    fleet.annotate_gpunode(node, {keys.CHECK_NOW_ANNOTATION: None})
    return found


def write_runs(fleet: operator_harness.Fleet, node: str, runs: list[dict[str, Any]]) -> None:
    """The operator's record of check runs (GPUNode status.checks[])."""
    fleet.custom.patch_cluster_custom_object_status(
        resources.GROUP,
        resources.VERSION,
        resources.GPUNODE_PLURAL,
        node,
        {"status": {"checks": runs}},
        _content_type="application/merge-patch+json",
    )


def run(result: str, seconds_ago: float = 0, **more: Any) -> dict[str, Any]:
    return {
        "name": "quick",
        "template": "DcgmDiagQuick",
        "policy": "fleet",
        "started": now_stamp(seconds_ago + 20),
        "time": now_stamp(seconds_ago),
        "result": result,
        **more,
    }


def refuse(fleet: operator_harness.Fleet, node: str, message: str) -> None:
    """The operator's CheckRefused Event about the Node."""
    fleet.core.create_namespaced_event(
        "default",
        {
            "metadata": {"generateName": f"{node}."},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node},
            "reason": "CheckRefused",
            "message": message,
            "type": "Warning",
            "firstTimestamp": now_stamp(),
            "lastTimestamp": now_stamp(),
            "count": 1,
            "source": {"component": "gpu-health-operator"},
        },
    )


def test_check_waits_for_the_run_its_request_started_and_prints_it(
    fleet: operator_harness.Fleet, plugin: Any
) -> None:
    node = f"{fleet.label}-0"
    fleet.add_node(node)
    process = plugin("check", node, "--template", "DcgmDiag", "--timeout", "30")
    asked = take_request(fleet, node)
    assert asked["check"] == "DcgmDiag" and asked["id"]
    figures = {"busBandwidthGBps": 310.5}
    write_runs(
        fleet,
        node,
        [run("Passed", 600, requestId="someone-else"), run("Passed", requestId=asked["id"], figures=figures)],
    )
    code, out, err = finish(process)
    assert code == 0, err
    assert f"{node}: check quick (DcgmDiagQuick) Passed" in out and "busBandwidthGBps=310.5" in out


def test_a_failed_check_exits_1_with_its_message(fleet: operator_harness.Fleet, plugin: Any) -> None:
    node = f"{fleet.label}-0"
    fleet.add_node(node)
    process = plugin("-o", "json", "check", node)
    asked = take_request(fleet, node)
    assert "check" not in asked  # no --template: the node's first check
    write_runs(fleet, node, [run("Failed", requestId=asked["id"], message="GPU 3: memory test failed")])
    code, out, _ = finish(process)
    assert code == 1
    report = json.loads(out)
    assert (report["node"], report["result"], report["message"]) == (
        node,
        "Failed",
        "GPU 3: memory test failed",
    )


def test_a_refused_request_exits_1_and_says_why(fleet: operator_harness.Fleet, plugin: Any) -> None:
    node = f"{fleet.label}-0"
    fleet.add_node(node)
    process = plugin("check", node)
    asked = take_request(fleet, node)
    refuse(fleet, node, f"check request {asked['id']} refused: the node is cordoned")
    code, out, _ = finish(process)
    assert code == 1 and "refused" in out and "the node is cordoned" in out


def test_a_preempted_check_says_it_is_no_failure(fleet: operator_harness.Fleet, plugin: Any) -> None:
    node = f"{fleet.label}-0"
    fleet.add_node(node)
    process = plugin("check", node)
    asked = take_request(fleet, node)
    write_runs(fleet, node, [run("Preempted", requestId=asked["id"])])
    code, out, _ = finish(process)
    assert code == 1 and "Preempted" in out and "not a failure" in out


def test_no_wait_leaves_the_request_and_a_timeout_withdraws_it(
    fleet: operator_harness.Fleet, plugin: Any
) -> None:
    node = f"{fleet.label}-0"
    fleet.add_node(node)
    code, out, _ = finish(plugin("check", node, "--no-wait"))
    assert code == 0 and "requested" in out
    annotations = fleet.gpunode(node)["metadata"].get("annotations") or {}
    token = json.loads(annotations[keys.CHECK_NOW_ANNOTATION])["id"]
    assert token in out

    fleet.annotate_gpunode(node, {keys.CHECK_NOW_ANNOTATION: None})
    code, out, err = finish(plugin("check", node, "--timeout", "2"))
    assert code == 1 and "no result within 2s" in err
    assert keys.CHECK_NOW_ANNOTATION not in (fleet.gpunode(node)["metadata"].get("annotations") or {})


def test_usage_and_missing_nodes(fleet: operator_harness.Fleet, plugin: Any) -> None:
    assert finish(plugin("check"))[0] == 2
    assert finish(plugin("check", "x", "--timeout", "0"))[0] == 2
    code, _, err = finish(plugin("check", f"{fleet.label}-missing"))
    assert code == 1 and "no GPUNode" in err


def test_why_shows_the_history_and_status_the_overdue_nodes(
    fleet: operator_harness.Fleet, plugin: Any
) -> None:
    checked, late = f"{fleet.label}-0", f"{fleet.label}-1"
    fleet.add_node(checked)
    fleet.add_node(late)
    fleet.policy(fleet.label, {"rules": [CORDON], "activeChecks": [{**QUICK, "everySeconds": 1800}]})
    write_runs(fleet, checked, [run("Failed", 900, message="GPU 2: diag failed"), run("Passed", 60)])
    write_runs(fleet, late, [run("Passed", 3600)])

    code, out, err = finish(plugin("why", checked))
    assert code == 0, err
    assert "Active checks" in out and "GPU 2: diag failed" in out
    history = [line for line in out.splitlines() if line.strip().startswith("quick")]
    assert "Passed" in history[0] and "Failed" in history[1]  # newest first

    code, out, err = finish(plugin("status"))
    assert code == 0, err
    overdue = out[out.index("Checks overdue") :]
    assert late in overdue and checked not in overdue
    report = json.loads(finish(plugin("-o", "json", "status"))[1])
    mine = [o for o in report["checks"]["overdue"] if o["policy"] == fleet.label]
    assert [(o["node"], o["check"]) for o in mine] == [(late, "quick")]
    assert (
        json.loads(finish(plugin("-o", "json", "why", late))[1])["checks"]["overdue"][0]["check"] == "quick"
    )
