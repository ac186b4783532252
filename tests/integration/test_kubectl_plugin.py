"""`kubectl gpuhealth` against a real API server and a real operator, run as a user runs it.

The plugin runs as its console script with $KUBECONFIG (the way kubectl runs
`kubectl-gpuhealth`); tests assert what a user reads: `why` names the condition,
the rule that fired, the action and its Events; `status` the policy, its budget
and its breaker; `drill` starts the operator's fire drill; `pause` is the
documented emergency stop (`spec.dryRun: true`) and `resume` undoes it, or
resets an open circuit breaker. One operator process serves the module.
"""

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

import gpunode_facts
import operator_fixtures
import operator_harness
from gpuhealth_api import keys, resources
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

TIMEOUT = 30.0
ECC = {3: {"ecc": {"uncorrectedVolatile": 1}}}
DRAIN = {"name": "ecc-drain", "condition": "EccUncorrectable", "action": "Drain"}
CORDON = {"name": "ecc-cordon", "condition": "EccUncorrectable", "action": "Cordon"}
PLUGIN = str(pathlib.Path(sys.executable).parent / "kubectl-gpuhealth")


operator = operator_fixtures.operator_fixture("plugin-it")
fleet = operator_fixtures.fleet_fixture("kp")


@pytest.fixture
def plugin(crds: local.ControlPlane) -> Any:
    """Run `kubectl-gpuhealth ARGS` with $KUBECONFIG as a user has it; the finished process."""

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(crds.kubeconfig)}
        done = subprocess.run(
            [PLUGIN, *args], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        if check:
            assert done.returncode == 0, f"{args}: exit {done.returncode}: {done.stderr}"
        return done

    return run


def make(fleet: operator_harness.Fleet, count: int, spec: dict[str, Any]) -> list[str]:
    names = [f"{fleet.label}-{i}"[:63] for i in range(count)]
    for name in names:
        fleet.add_node(name)
    fleet.policy(fleet.label, spec)
    for name in names:
        waiting.wait_until(
            lambda n=name: (
                (fleet.node(n)["metadata"].get("labels") or {}).get(keys.HEALTH_LABEL) == "healthy"
            ),
            timeout_seconds=TIMEOUT,
            message=f"{name} judged healthy",
        )
    return names


def action(fleet: operator_harness.Fleet, name: str) -> str | None:
    return (fleet.gpunode(name).get("status") or {}).get("action")


def policy_body(fleet: operator_harness.Fleet) -> dict[str, Any]:
    body = fleet.custom.get_cluster_custom_object(
        resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, fleet.label
    )
    assert isinstance(body, dict)
    return body


def test_why_and_status_explain_a_drained_node(fleet: operator_harness.Fleet, plugin: Any) -> None:
    faulty, healthy = make(fleet, 2, {"rules": [DRAIN], "maxUnavailable": 1, "drain": {"timeoutSeconds": 30}})
    fleet.report(faulty, gpunode_facts.agent_status(overrides=ECC))
    waiting.wait_until(lambda: action(fleet, faulty) == "Drained", timeout_seconds=TIMEOUT, message="drained")
    waiting.wait_until(
        lambda: fleet.events(faulty, "NodeDrained"), timeout_seconds=TIMEOUT, message="NodeDrained Event"
    )

    text = plugin("why", faulty).stdout
    assert f"{faulty}: Unhealthy (EccUncorrectable), action Drained" in text
    assert f"cordoned (unschedulable) by policy {fleet.label}" in text
    assert "GPU 3 " in text and "ecc.uncorrectedVolatile=1" in text  # the fact
    assert "EccUncorrectable=True" in text  # the condition
    assert "rule ecc-drain: EccUncorrectable -> Drain fired  <- wins" in text  # the rule
    assert "NodeCordoned" in text and "NodeDrained" in text  # the action's Events

    report = json.loads(plugin("why", faulty, "-o", "json").stdout)
    (verdict,) = report["policies"]
    assert verdict["policy"] == fleet.label and verdict["wins"]["rule"] == "ecc-drain"
    assert {"EccUncorrectable", "NodeCordoned", "NodeDrained"} <= {e["reason"] for e in report["events"]}
    assert json.loads(plugin("why", healthy, "-o", "json").stdout)["policies"][0]["fired"] == []

    text = plugin("status").stdout
    row = next(line for line in text.splitlines() if line.startswith(fleet.label + " "))
    assert "acting" in row and "1/1 unschedulable" in row and "Closed" in row
    assert any(line.startswith(faulty) and "Drained" in line for line in text.splitlines())
    report = json.loads(plugin("-o", "json", "status").stdout)
    (mine,) = [p for p in report["policies"] if p["name"] == fleet.label]
    assert mine["health"] == {"Healthy": 1, "Unhealthy": 1}
    assert mine["budget"] == {"maxUnavailable": 1, "allowed": 1, "unavailable": 1}

    missing = plugin("why", f"{fleet.label}-nope", check=False)
    assert missing.returncode == 1 and "no Node and no GPUNode" in missing.stderr


def test_kubectl_runs_it_as_kubectl_gpuhealth(crds: local.ControlPlane) -> None:
    """kubectl finds `kubectl-gpuhealth` on PATH: `kubectl gpuhealth status` is the plugin."""
    env = crds.env()
    env["PATH"] = f"{pathlib.Path(PLUGIN).parent}{os.pathsep}{env['PATH']}"
    done = subprocess.run(
        [str(crds.binaries / "kubectl"), "gpuhealth", "-o", "json", "status"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "policies" in json.loads(done.stdout)
    listed = subprocess.run(
        [str(crds.binaries / "kubectl"), "plugin", "list"],
        env=env,
        check=False,  # exit 1 on a warning about another plugin on PATH
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "kubectl-gpuhealth" in listed.stdout
    # `kubectl gpuhealth <TAB>`: kubectl asks kubectl_complete-gpuhealth (kubectl 1.26+).
    completed = subprocess.run(
        [str(crds.binaries / "kubectl"), "__complete", "gpuhealth", "drill", "any-node", "ecc"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert completed.stdout.splitlines()[:2] == ["EccUncorrectable", ":4"]


def test_drill_starts_the_operators_fire_drill_and_stops_it(
    fleet: operator_harness.Fleet, plugin: Any
) -> None:
    (name,) = make(fleet, 1, {"rules": [DRAIN], "maxUnavailable": 1})

    refused = plugin("drill", name, "NoSuchCondition", check=False)
    assert refused.returncode == 1 and "EccUncorrectable" in refused.stderr
    assert plugin("drill", name, "EccUncorrectable", "--ttl", "0s", check=False).returncode == 1
    gone = plugin("drill", f"{fleet.label}-nope", "EccUncorrectable", check=False)
    assert gone.returncode == 1 and "no GPUNode named" in gone.stderr
    assert keys.DRILL_ANNOTATION not in (fleet.gpunode(name)["metadata"].get("annotations") or {})

    said = json.loads(plugin("drill", name, "eccuncorrectable", "--ttl", "5m", "-o", "json").stdout)
    assert said["drill"] == {"condition": "EccUncorrectable", "ttl": "5m"}
    waiting.wait_until(lambda: fleet.events(name, "Drill"), timeout_seconds=TIMEOUT, message="Drill Event")
    waiting.wait_until(
        lambda: action(fleet, name) == "Drill", timeout_seconds=TIMEOUT, message="action Drill"
    )
    assert not fleet.node(name)["spec"].get("unschedulable")  # said, not done
    text = plugin("why", name).stdout
    assert "drill running: EccUncorrectable (ttl 5m" in text and "Drill: " in text

    plugin("drill", name, "--stop")
    assert keys.DRILL_ANNOTATION not in (fleet.gpunode(name)["metadata"].get("annotations") or {})
    waiting.wait_until(lambda: action(fleet, name) == "None", timeout_seconds=TIMEOUT, message="drill over")


def test_pause_is_the_emergency_stop_and_resume_undoes_it(fleet: operator_harness.Fleet, plugin: Any) -> None:
    (name,) = make(fleet, 1, {"rules": [CORDON], "maxUnavailable": 1})

    assert "paused: spec.dryRun=true" in plugin("pause", fleet.label).stdout
    assert policy_body(fleet)["spec"]["dryRun"] is True
    assert "already paused" in plugin("pause", fleet.label).stdout
    fleet.report(name, gpunode_facts.agent_status(overrides=ECC))
    waiting.wait_until(lambda: action(fleet, name) == "DryRun", timeout_seconds=TIMEOUT, message="DryRun")
    assert not fleet.node(name)["spec"].get("unschedulable")  # paused: decided and said, not done
    assert "dry-run" in plugin("status").stdout

    resumed = json.loads(plugin("resume", fleet.label, "-o", "json").stdout)
    assert resumed["changed"] == ["spec.dryRun=false"]
    waiting.wait_until(
        lambda: fleet.node(name)["spec"].get("unschedulable"), timeout_seconds=TIMEOUT, message="cordoned"
    )
    assert "nothing to resume" in plugin("resume", fleet.label).stdout

    missing = plugin("pause", f"{fleet.label}-nope", check=False)
    assert missing.returncode == 1 and "not found" in missing.stderr


def test_resume_resets_an_open_breaker(fleet: operator_harness.Fleet, plugin: Any) -> None:
    spec = {
        "rules": [CORDON],
        "maxUnavailable": "100%",
        "breaker": {"maxNewUnhealthy": 1, "windowSeconds": 600},
    }
    first, second, _ = make(fleet, 3, spec)
    fleet.report(first, gpunode_facts.agent_status(overrides=ECC))
    waiting.wait_until(
        lambda: fleet.node(first)["spec"].get("unschedulable"),
        timeout_seconds=TIMEOUT,
        message="first cordoned",
    )
    fleet.report(second, gpunode_facts.agent_status(overrides=ECC))
    waiting.wait_until(
        lambda: action(fleet, second) == "Pending", timeout_seconds=TIMEOUT, message="held back"
    )

    def breaker() -> dict[str, Any]:
        report = json.loads(plugin("status", "-o", "json").stdout)
        return next(p for p in report["policies"] if p["name"] == fleet.label)["breaker"]

    waiting.wait_until(lambda: breaker()["state"] == "Open", timeout_seconds=TIMEOUT, message="status: Open")
    assert f"breaker of {fleet.label} is Open" in plugin("status").stdout
    assert "breaker Open" in plugin("why", second).stdout

    text = plugin("resume", fleet.label).stdout
    assert "Reset requested (gpuhealth.io/breaker-reset=" in text
    assert keys.BREAKER_RESET_ANNOTATION in policy_body(fleet)["metadata"]["annotations"]
    waiting.wait_until(
        lambda: fleet.node(second)["spec"].get("unschedulable"), timeout_seconds=TIMEOUT, message="admitted"
    )
    waiting.wait_until(lambda: breaker()["state"] == "Closed", timeout_seconds=TIMEOUT, message="Closed")
