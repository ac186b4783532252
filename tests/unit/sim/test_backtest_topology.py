"""The backtest replays a policy's topology budgets as the operator would act: a trace keeps every
Node label, so a rack budget holds in the replay as live (issue 28)."""

import datetime
import pathlib

from gpuhealth_sim.backtest import replayer, traces
from gpunode_facts import agent_status

POLICY = pathlib.Path(__file__).parents[3] / "examples" / "topology" / "rack-budget.yaml"
START = datetime.datetime(2026, 1, 5, tzinfo=datetime.UTC)
RACK = "example.com/rack"
RACKS = {"n0": "r1", "n1": "r1", "n2": "r1", "n3": "r1", "n4": "r2", "n5": "r2", "n6": None}


def stamp(t: float) -> str:
    return (START + datetime.timedelta(seconds=t)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def write_trace(path: pathlib.Path, faults: dict[str, tuple[float, float]], minutes: int) -> pathlib.Path:
    """Seven H100 nodes in racks r1 (n0-n3) and r2 (n4, n5), n6 in none, reporting every minute;
    `faults`: node → (DBE at, repaired at)."""
    with traces.Writer(path, {"start": START.timestamp()}) as writer:
        for name, rack in RACKS.items():
            labels = {"nvidia.com/gpu.present": "true", **({RACK: rack} if rack else {})}
            body = {
                "metadata": {"name": name, "labels": labels},
                "spec": {"unschedulable": False},
                "status": {"capacity": {"nvidia.com/gpu": "8"}},
            }
            writer.write({"kind": "node", "t": 0, "object": body})
        for minute in range(minutes):
            for i, name in enumerate(RACKS):
                t = minute * 60 + i
                start, end = faults.get(name, (1e9, 1e9))
                broken = {0: {"ecc": {"uncorrectedVolatile": 1}, "observedTime": stamp(start)}}
                status = agent_status(
                    heartbeat=stamp(t), observed=stamp(0), overrides=broken if start <= t < end else None
                )
                writer.write({"kind": "gpunode", "t": t, "name": name, "status": status})
    return path


def out_per_rack(actions: list[replayer.Action]) -> dict[str, int]:
    """The most nodes of each rack out of service at once over the replay."""
    out: set[str] = set()
    most: dict[str, int] = {}
    for action in sorted(actions, key=lambda a: a.t):
        if action.action in ("Cordon", "Drain"):
            out.add(action.node)
        elif action.action == "Uncordon":
            out.discard(action.node)
        for rack in {r for r in RACKS.values() if r}:
            most[rack] = max(most.get(rack, 0), sum(1 for n in out if RACKS[n] == rack))
    return most


def test_a_rack_budget_drains_one_node_per_rack_in_the_replay(tmp_path: pathlib.Path) -> None:
    faults = {
        "n0": (600.0, 1200.0),
        "n1": (600.0, 1e9),
        "n2": (600.0, 1e9),
        "n4": (600.0, 1e9),
        "n6": (600.0, 1e9),
    }
    trace = write_trace(tmp_path / "t.jsonl", faults, minutes=40)
    policy = replayer.load_policy(POLICY)
    assert policy["spec"]["topology"]["budgets"] == [{"key": RACK, "maxUnavailable": 1}]
    policy["spec"]["recovery"]["healthyForSeconds"] = 300
    policy["spec"]["maxUnavailable"] = 5  # 10% of 7 nodes would be 1 node in all: let the racks bind
    policy["spec"]["breaker"] = {"maxNewUnhealthy": "100%"}  # five faults at once are no storm here
    result = replayer.run(trace, policy)
    drains = {a.node: a.t for a in result.actions if a.action == "Drain"}
    assert set(drains) == {"n0", "n1", "n4", "n6"}, result.actions
    assert max(drains["n0"], drains["n4"], drains["n6"]) < 600 + 60, "one per rack, and n6 is in no rack"
    uncordon = next(a.t for a in result.actions if a.action == "Uncordon" and a.node == "n0")
    assert uncordon >= 1200 + 300
    assert drains["n1"] >= uncordon, "n1 waits for r1's place"
    assert result.pending_nodes == {"n1", "n2"}
    assert out_per_rack(result.actions) == {"r1": 1, "r2": 1}
    waits = [e for e in result.events if e.get("reason") == "DisruptionBudgetExceeded"]
    assert waits and all(f"topology budget {RACK}=r1" in e["message"] for e in waits), waits
