"""The steady-state write budget: a quiet fleet writes nothing to the API server in a minute.

Real agents (the fleet simulator runs the agent's own code, one loop per node)
with the default heartbeat, 300 s, and the operator judging them under a
policy: once every node has reported and been judged Healthy, a 60 s window
of the API server's audit log must hold no GPUNode write at all (agent or
operator) and no write of the operator but its leader Lease. The issue's
budget is at most one write per node per 5 minutes; the heartbeat is the one.

The operator's side alone, with agents that do write: a fleet whose agents report
every second with clocks jittering a little from sample to sample (no straggler,
no fault) gets no write from the operator at all: an unchanged condition is
byte-identical (no heartbeat time in a message) and straggler scores that only
jitter are not rewritten.
"""

import datetime
import json
import random
import secrets
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

import gpunode_facts
import operator_fixtures
import operator_harness
import sim_fleets
from gpuhealth_api import heartbeats, resources
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local
from gpuhealth_sim.fleet import agentpool, fleetfile

pytestmark = pytest.mark.integration

WINDOW_SECONDS = 60.0
NODES = 3


@pytest.fixture
def prefix() -> str:
    return f"quiet-{secrets.token_hex(2)}"


operator = operator_fixtures.operator_fixture("quiet", (), scope="function", log_tail=10000)


@pytest.fixture
def quiet_fleet(crds: local.ControlPlane, k8s: client.ApiClient, prefix: str) -> Iterator[agentpool.Fleet]:
    spec = fleetfile.parse(
        {
            "seed": 5,
            "agent": {"intervalSeconds": 1},  # the heartbeat is the default
            "labels": {"gpuhealth.io/test": prefix},
            "pools": [
                {
                    "name": prefix,
                    "nodes": f"{prefix}-{{0..{NODES - 1}}}",
                    "gpu": {"model": "NVIDIA H100 80GB HBM3", "count": 8},
                    "scenario": {"defaults": {"temperatureCelsius": 45, "utilizationPercent": 95}},
                }
            ],
        },
        source="quiet fleet",
    )
    assert spec.heartbeat_seconds == heartbeats.DEFAULT_HEARTBEAT_SECONDS == 300
    with sim_fleets.running(k8s, spec, workers=1) as sim:
        yield sim


def writes(plane: local.ControlPlane, since: datetime.datetime) -> list[dict[str, Any]]:
    """Completed writes in the audit log received since `since`."""
    found = []
    for line in plane.audit_log.read_text().splitlines():
        entry: dict[str, Any] = json.loads(line)
        received = datetime.datetime.fromisoformat(entry["requestReceivedTimestamp"])
        if entry.get("stage") == "ResponseComplete" and received >= since:
            found.append(entry)
    return found


def ours(entry: dict[str, Any], names: set[str]) -> str | None:
    """`resource/name[/subresource] by user-agent` if the write is one the budget counts, else None."""
    ref = entry.get("objectRef") or {}
    agent = entry.get("userAgent", "")
    gpunode = ref.get("resource") == resources.GPUNODE_PLURAL and ref.get("name") in names
    by_operator = agent.startswith("gpu-health-operator") and ref.get("resource") != "leases"
    if not (gpunode or by_operator):
        return None
    what = "/".join(str(ref[k]) for k in ("resource", "name", "subresource") if ref.get(k))
    return f"{entry['verb']} {what} by {agent}"


def test_a_quiet_fleet_writes_nothing_for_a_minute(
    crds: local.ControlPlane,
    k8s: client.ApiClient,
    operator: operator_harness.OperatorProcess,
    quiet_fleet: agentpool.Fleet,
    prefix: str,
) -> None:
    started = datetime.datetime.now(datetime.UTC)
    names = {plan.name for plan in quiet_fleet.spec.nodes}
    harness = operator_harness.Fleet(k8s, label=prefix)
    harness.policy(
        f"{prefix}-policy", {"rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}]}
    )
    try:
        for name in sorted(names):
            waiting.wait_until(
                lambda n=name: (harness.gpunode(n).get("status") or {}).get("health") == "Healthy",
                timeout_seconds=60,
                message=f"{name} reported and judged Healthy",
            )
        window_start = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=3)
        before = [w for e in writes(crds, started) if (w := ours(e, names))]
        assert any("gpunodes" in w and "/status" in w for w in before), "the audit log sees the first reports"
        waiting.wait_until(
            lambda: (
                datetime.datetime.now(datetime.UTC)
                >= window_start + datetime.timedelta(seconds=WINDOW_SECONDS)
            ),
            timeout_seconds=WINDOW_SECONDS + 10,
            message="the window passes",
        )
        in_window = [w for e in writes(crds, window_start) if (w := ours(e, names))]
        turns = quiet_fleet.stats.turns
        assert turns >= NODES * WINDOW_SECONDS * 0.5, f"the agents kept collecting ({turns} turns)"
        assert in_window == [], f"writes in a quiet {WINDOW_SECONDS:g}s window: {in_window}"
    finally:
        harness.cleanup()


JITTER_NODES = 6
JITTER_WINDOW_SECONDS = 20.0


def jittery_report(rng: random.Random, lowest_clock_mhz: int) -> dict[str, Any]:
    """A healthy agent's report now: every GPU busy at a clock between `lowest_clock_mhz` and its maximum."""
    clocks = {i: {"smClockMHz": rng.randint(lowest_clock_mhz, 1980)} for i in range(8)}
    return gpunode_facts.agent_status(overrides=clocks, heartbeat_seconds=5)


@pytest.mark.parametrize(
    "lowest_clock_mhz",
    [
        pytest.param(1968, id="clocks-within-a-percent"),
        # GPU Boost moves each busy GPU's clock by several percent from sample to sample: the
        # node's score (its slowest GPU) then moves by 0.02 on a good part of its reports.
        pytest.param(1830, id="gpu-boost-jitter"),
    ],
)
def test_steady_jittery_heartbeats_get_no_operator_write(
    crds: local.ControlPlane,
    k8s: client.ApiClient,
    operator: operator_harness.OperatorProcess,
    prefix: str,
    lowest_clock_mhz: int,
) -> None:
    harness = operator_harness.Fleet(k8s, label=prefix)
    names = [f"{prefix}-j{i}" for i in range(JITTER_NODES)]
    harness.policy(
        f"{prefix}-policy",
        {
            "rules": [
                {"name": "straggler", "condition": "Straggler", "action": "Label", "forSeconds": 5},
                {"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"},
            ]
        },
    )
    stop = threading.Event()
    rng = random.Random(14)

    def agents() -> None:
        while not stop.is_set():
            for name in names:
                harness.report(name, jittery_report(rng, lowest_clock_mhz))
            stop.wait(1.0)  # the agents' pace, not a wait for the operator

    try:
        for name in names:
            harness.add_node(name, report=False)
        reporting = threading.Thread(target=agents, daemon=True)
        reporting.start()
        for name in names:
            waiting.wait_until(
                lambda n=name: (
                    (s := harness.gpunode(n).get("status") or {}).get("health") == "Healthy"
                    and "straggler" in s
                ),
                timeout_seconds=60,
                message=f"{name} judged Healthy with a straggler score",
            )
        window_start = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=3)
        waiting.wait_until(
            lambda: (
                datetime.datetime.now(datetime.UTC)
                >= window_start + datetime.timedelta(seconds=JITTER_WINDOW_SECONDS)
            ),
            timeout_seconds=JITTER_WINDOW_SECONDS + 10,
            message="the window passes",
        )
        stop.set()
        reporting.join(timeout=10)
        in_window = [w for e in writes(crds, window_start) if (w := ours(e, set(names)))]
        by_agents = [w for w in in_window if "gpu-health-operator" not in w]
        by_operator = [w for w in in_window if "gpu-health-operator" in w]
        assert len(by_agents) >= JITTER_NODES * JITTER_WINDOW_SECONDS * 0.5, "the agents kept reporting"
        assert by_operator == [], (
            f"operator writes in a steady {JITTER_WINDOW_SECONDS:g}s window: {by_operator}"
        )
    finally:
        stop.set()
        harness.cleanup()
