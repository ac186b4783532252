"""A burst of faults: every node is cordoned by its own GPUNode event, never by the timer's safety net.

The timer's full pass (every node judged, due or not) is pushed out of the test's
reach (`--full-pass-seconds=600`), so a watch event the operator failed to act on
shows as a node left schedulable. The burst is shaped as agents make it: each
agent's first report lands, and a moment later its fault, while the operator is
still busy writing the status of the first reports; the answer to such a status
write already carries the fault, and the fault's own watch event must still
reconcile the node. Each cordon is one Node write, carrying the taint a rule asks for too.
"""

import concurrent.futures
import datetime
import json
import time

import pytest

import gpunode_facts
import operator_fixtures
import operator_harness
from gpuhealth_api import keys
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

NODES = 100
WRITERS = 25
"""Concurrent writers of the burst, as many agents report at once."""
FAULT_AFTER_SECONDS = 0.3
"""An agent's fault follows its first report by more than kopf's batch window (0.1 s), so the operator
handles the first report on its own, and by less than the operator takes to answer a burst of them."""
FAULT = {"ecc": {"uncorrectedVolatile": 1}, "remappedRows": {"failure": True}}
"""Both a cordon (EccUncorrectable) and a taint (RowRemapFailure) are wanted."""


operator = operator_fixtures.operator_fixture(
    "burst", ["--full-pass-seconds=600", "--resync-seconds=600"], scope="function", log_tail=10000
)


fleet = operator_fixtures.fleet_fixture("burst")


def cordoned(fleet: operator_harness.Fleet, name: str) -> bool:
    return bool(fleet.node(name)["spec"].get("unschedulable"))


def node_writes(
    plane: local.ControlPlane, since: datetime.datetime, names: set[str]
) -> tuple[list[str], list[str]]:
    """The operator's writes of these Nodes' spec and metadata (not their status) since `since`.

    Returns the names written, and a line for each request the API server refused: a write
    made from a view older than the node (409 on its resourceVersion precondition, 422 on a
    JSON-patch test) changed nothing and is retried from a fresh read: the safety rule at work,
    not a second write.
    """
    found: list[str] = []
    refused: list[str] = []
    for line in plane.audit_log.read_text().splitlines():
        entry = json.loads(line)
        ref = entry.get("objectRef") or {}
        if (
            entry.get("stage") == "ResponseComplete"
            and entry.get("verb") in ("patch", "update")
            and ref.get("resource") == "nodes"
            and ref.get("name") in names
            and not ref.get("subresource")
            and entry.get("userAgent", "").startswith("gpu-health-operator")
            and datetime.datetime.fromisoformat(entry["requestReceivedTimestamp"]) >= since
        ):
            code = (entry.get("responseStatus") or {}).get("code", 0)
            if 200 <= code < 300:
                found.append(ref["name"])
            else:
                refused.append(f"{ref['name']} {entry['verb']} {code} {entry['requestReceivedTimestamp']}")
    return found, refused


def test_every_node_of_a_burst_is_cordoned_by_its_own_event(
    crds: local.ControlPlane, fleet: operator_harness.Fleet
) -> None:
    fleet.policy(
        f"{fleet.label}-policy",
        {
            "maxUnavailable": "100%",
            "rules": [
                {"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"},
                {"name": "rows", "condition": "RowRemapFailure", "action": "Taint"},
            ],
        },
    )
    names = [f"{fleet.label}-{i}" for i in range(NODES)]
    for name in names:
        fleet.add_node(name, report=False)

    def agent(name: str) -> None:
        fleet.report(name, gpunode_facts.agent_status())  # the operator writes this node's status (Healthy)
        time.sleep(FAULT_AFTER_SECONDS)  # the burst's shape, not a wait for the operator
        fleet.report(name, gpunode_facts.agent_status(overrides={0: FAULT}))

    started = datetime.datetime.now(datetime.UTC)
    with concurrent.futures.ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(agent, names))
    last_fault = time.monotonic()
    try:
        waiting.wait_until(
            lambda: all(cordoned(fleet, n) for n in names),
            timeout_seconds=30,
            message="every node of the burst cordoned",
        )
    except TimeoutError:
        left = [n for n in names if not cordoned(fleet, n)]
        raise AssertionError(f"{len(left)} node(s) of the burst never cordoned: {left}") from None
    # The bound that matters is the wait's: without the fix, lost nodes waited for the full pass (600 s).
    print(f"last node cordoned {time.monotonic() - last_fault:.1f}s after the last fault")
    for name in names:
        taints = fleet.node(name)["spec"].get("taints") or []
        assert any(t["key"] == keys.UNHEALTHY_TAINT for t in taints), name
    # Two Node writes each: the health label of the first report, then the cordon carrying the taint.
    writes, refused = node_writes(crds, started, set(names))
    print(f"{len(refused)} write(s) refused: {refused}")
    more = sorted({n for n in writes if writes.count(n) > 2})
    assert not more, f"nodes written more than twice (cordon and taint apart?): {more}; refused: {refused}"
    conflicts = [line for line in refused if line.split()[2] in ("409", "422")]
    assert conflicts == refused, f"writes refused for another reason than a conflict: {refused}"
