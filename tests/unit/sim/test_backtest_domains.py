"""The backtest replays a policy's topology domains (`spec.topology.domains`) with the operator's own
code: a trace keeps every Node label, so a clique with 5 of 8 nodes Unhealthy is marked in the replay
as live, and the report lists the domain's actions (issue 28)."""

import datetime
import pathlib

from gpuhealth_sim.backtest import replayer, traces
from gpunode_facts import agent_status

POLICY = pathlib.Path(__file__).parents[3] / "examples" / "topology" / "domains-nvl72-clique.yaml"
START = datetime.datetime(2026, 1, 5, tzinfo=datetime.UTC)
CLIQUE = "nvidia.com/gpu.clique"
NODES = {f"a{i}": "c1" for i in range(8)} | {f"b{i}": "c2" for i in range(3)}
FAULT, REPAIR, HOLD = 600.0, 1200.0, 300


def stamp(t: float) -> str:
    return (START + datetime.timedelta(seconds=t)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def write_trace(path: pathlib.Path, faulty: set[str], minutes: int) -> pathlib.Path:
    """Clique c1 (a0-a7) and c2 (b0-b2), reporting every minute; `faulty` have a DBE from FAULT to REPAIR."""
    with traces.Writer(path, {"start": START.timestamp()}) as writer:
        for name, clique in NODES.items():
            body = {
                "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true", CLIQUE: clique}},
                "spec": {"unschedulable": False},
                "status": {"capacity": {"nvidia.com/gpu": "4"}},
            }
            writer.write({"kind": "node", "t": 0, "object": body})
        for minute in range(minutes):
            for i, name in enumerate(NODES):
                t = minute * 60 + i
                broken = {0: {"ecc": {"uncorrectedVolatile": 1}, "observedTime": stamp(FAULT)}}
                faulty_now = name in faulty and FAULT <= t < REPAIR
                status = agent_status(
                    gpus=4, heartbeat=stamp(t), observed=stamp(0), overrides=broken if faulty_now else None
                )
                writer.write({"kind": "gpunode", "t": t, "name": name, "status": status})
    return path


def replay(tmp_path: pathlib.Path, faulty: set[str]) -> replayer.Result:
    policy = replayer.load_policy(POLICY)
    assert policy["spec"]["topology"]["domains"][0] == {"key": CLIQUE, "unhealthy": 5, "action": "Taint"}
    policy["spec"]["recovery"]["healthyForSeconds"] = HOLD
    policy["spec"]["breaker"] = {"maxNewUnhealthy": "100%"}  # five faults at once are no storm here
    return replayer.run(write_trace(tmp_path / "t.jsonl", faulty, minutes=40), policy)


def test_five_of_eight_mark_the_clique_in_the_replay_and_the_report_lists_it(tmp_path: pathlib.Path) -> None:
    faulty = {f"a{i}" for i in range(5)}
    result = replay(tmp_path, faulty)
    name = result.policy
    by_action: dict[str, dict[str, float]] = {}
    for action in result.actions:
        by_action.setdefault(action.action, {}).setdefault(action.node, action.t)
    c1 = {n for n, c in NODES.items() if c == "c1"}
    assert set(by_action["Label domain-degraded=true"]) == c1, "every node of the clique, none of c2"
    assert set(by_action["Taint domain-degraded"]) == c1
    assert list(by_action["DomainDegraded"]) == [name] and list(by_action["DomainRecovered"]) == [name]
    degraded = [a for a in result.actions if a.action == "DomainDegraded"]
    assert len(degraded) == 1 and f"{CLIQUE}=c1: 5 of 8 selected nodes Unhealthy" in degraded[0].reason
    assert FAULT <= by_action["DomainDegraded"][name] < FAULT + 120
    assert by_action["Unlabel domain-degraded"].keys() == c1
    assert min(by_action["Unlabel domain-degraded"].values()) >= REPAIR + HOLD, "held for healthyForSeconds"
    assert set(by_action["Untaint domain-degraded"]) == c1
    disrupted = {a.node for a in result.actions if a.action in ("Cordon", "Drain")}
    assert disrupted <= faulty, "a healthy node of a degraded clique is never cordoned"
    assert result.label_flaps == 0
    assert result.summary()["actions"]["DomainDegraded"] == 1


def test_four_of_eight_mark_nothing(tmp_path: pathlib.Path) -> None:
    result = replay(tmp_path, {f"a{i}" for i in range(4)})
    assert not [a for a in result.actions if "domain" in a.action.lower()], result.actions
