"""NvLinkDegraded, FabricUnhealthy, NicDegraded, PcieErrors and MemoryDegrading (issue 27).

Each is judged the way the operator judges it: GPUNode reports stored one after the other in the
cache (which keeps only `gpu_facts.FIELDS` and remembers `trends`), then `verdicts.judge`.
"""

import datetime
import json
from typing import Any

import pytest

import gpunode_facts
from gpuhealth_api import conditions, faults, vocabulary
from gpuhealth_operator.decisions import gpu_facts, model, policies, severity, signals, trends, verdicts
from gpuhealth_operator.state import cache

Condition = vocabulary.Condition
START = datetime.datetime(2026, 11, 24, tzinfo=datetime.UTC)
NEW = (
    Condition.NVLINK_DEGRADED,
    Condition.FABRIC_UNHEALTHY,
    Condition.NIC_DEGRADED,
    Condition.PCIE_ERRORS,
    Condition.MEMORY_DEGRADING,
)
NODE = model.NodeView(name="n", labels={"nvidia.com/gpu.count": "2"}, gpu_capacity=2)
POLICY = policies.parse_policy(
    "p", 1, {"rules": [{"name": c.lower(), "condition": str(c), "action": "Label"} for c in NEW]}
)
NVLINK = {"linksUp": 18, "linksDown": 0, "crcErrors": 0, "replayErrors": 0, "recoveryErrors": 0}
NIC = {
    "name": "mlx5_0",
    "port": 1,
    "state": "ACTIVE",
    "physState": "LinkUp",
    "rateGbps": 400.0,
    "linkDowned": 0,
    "symbolErrors": 0,
    "rcvErrors": 0,
}


def status(gpu0: dict[str, Any] | None = None, nics: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    facts = gpunode_facts.agent_status(gpus=2, overrides={0: gpu0 or {}})
    if nics is not None:
        facts["nics"] = nics
    return facts


class Node:
    """One node's reports as the operator's cache receives them, each a heartbeat later."""

    def __init__(self, policy: model.Policy = POLICY) -> None:
        self.store = cache.ClusterCache()
        self.policy = policy
        self.version = 0
        self.previous: dict[Condition, model.ConditionState] = {}

    def report(self, facts: dict[str, Any], at: datetime.datetime) -> set[Condition]:
        """The new conditions true after this report (judged at once, then again a minute later)."""
        self.version += 1
        facts = json.loads(json.dumps(facts))
        facts["agent"]["lastHeartbeatTime"] = gpunode_facts.rfc3339(at)
        body = {"metadata": {"name": "n", "uid": "u", "resourceVersion": str(self.version)}, "status": facts}
        record = self.store.put_gpunode(body, at)
        verdict = verdicts.judge(
            self.policy,
            NODE,
            record.status,
            self.previous,
            None,
            at,
            known_signals=record.fact_signals,
            memory=record.memory,
        )
        self.previous = dict(verdict.conditions)
        return set(verdict.issues) & set(NEW)


def minutes(n: float) -> datetime.datetime:
    return START + datetime.timedelta(minutes=n)


# --- one report -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fabric", "fault"),
    [
        ({"state": "Completed", "status": "Success", "cliqueId": 7}, None),
        ({"state": "Completed", "status": "Unknown"}, "fabric registration failed (Unknown)"),
        ({"state": "InProgress"}, "fabric registration not completed (InProgress)"),
        ({"state": "NotStarted"}, "fabric registration not completed (NotStarted)"),
        ({"state": "NotSupported"}, None),
        ({}, None),
        ({"state": 3}, None),
    ],
)
def test_fabric(fabric: dict[str, Any], fault: str | None) -> None:
    assert faults.fabric_unhealthy({"fabric": fabric}) == fault  # type: ignore[typeddict-item]


def test_pcie_errors_fatal_once_and_never_correctable() -> None:
    assert faults.pcie_errors({"pcie": {"aer": {"fatal": 2, "nonFatal": 0}}}) == "2 fatal AER errors"
    assert faults.pcie_errors({"pcie": {"aer": {"fatal": 0, "nonFatal": 9, "correctable": 999}}}) is None
    assert faults.pcie_errors({"pcie": {"generation": 5}}) is None


def test_memory_degrading_from_one_report() -> None:
    xid92: Any = {"xids": [{"code": 92, "count": 1, "lastSeen": "2026-11-24T00:00:00Z"}]}
    assert faults.memory_degrading(xid92) == "XID 92 (high single-bit ECC rate)"
    assert (
        faults.memory_degrading({"retiredPages": {"pending": True, "doubleBit": 0}})
        == "retired pages pending a GPU reset (single-bit errors only)"
    )
    assert (
        faults.memory_degrading({"retiredPages": {"pending": False}, "ecc": {"correctedVolatile": 9}}) is None
    )


def test_severity_classes() -> None:
    assert {Condition.FABRIC_UNHEALTHY, Condition.PCIE_ERRORS} <= severity.FATAL
    assert {
        Condition.NVLINK_DEGRADED,
        Condition.NIC_DEGRADED,
        Condition.MEMORY_DEGRADING,
    } <= severity.SUSTAINED
    assert not severity.FATAL & severity.SUSTAINED


@pytest.mark.parametrize("condition", NEW)
def test_every_new_condition_has_every_table_row(condition: Condition) -> None:
    assert condition in conditions.RULE_CONDITIONS
    assert condition in signals.FACT_CONDITIONS
    assert condition in severity.ORDER
    assert (condition in severity.FATAL) != (condition in severity.SUSTAINED)
    assert condition in signals._HEALTHY_MESSAGES
    if condition is not Condition.NIC_DEGRADED:  # node-level: status.nics, kept whole
        assert condition in conditions.gpu_checks(frozenset())
        assert conditions.READS[condition] <= set(gpu_facts.FIELDS)


# --- every new condition through the cache to a verdict --------------------------------------------------

FAULTY: dict[Condition, tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]] | None]] = {
    # condition: (GPU 0 first, GPU 0 later, NICs later); every first report has NVLink and a NIC up
    Condition.NVLINK_DEGRADED: (
        {"nvlink": NVLINK},
        {"nvlink": {**NVLINK, "linksUp": 16, "linksDown": 2}},
        None,
    ),
    Condition.FABRIC_UNHEALTHY: ({}, {"fabric": {"state": "Completed", "status": "Timeout"}}, None),
    Condition.NIC_DEGRADED: ({}, {}, [{**NIC, "state": "DOWN", "physState": "Polling"}]),
    Condition.PCIE_ERRORS: ({}, {"pcie": {"aer": {"fatal": 1, "nonFatal": 0, "correctable": 0}}}, None),
    Condition.MEMORY_DEGRADING: ({}, {"ecc": {"correctedVolatile": 500, "correctedAggregate": 500}}, None),
}


@pytest.mark.parametrize("condition", NEW)
def test_each_condition_reaches_the_verdict_through_the_cache(condition: Condition) -> None:
    """A fact the cache does not keep (`gpu_facts.FIELDS`) would make its predicate never fire here."""
    first, later, nics = FAULTY[condition]
    node = Node()
    assert node.report(status({"nvlink": NVLINK, **first}, [NIC]), minutes(0)) == set()
    merged = gpunode_facts.merge({"nvlink": NVLINK, **first}, later)
    assert node.report(status(merged, nics if nics is not None else [NIC]), minutes(5)) == {condition}


@pytest.mark.parametrize("condition", NEW)
def test_boards_without_the_feature_never_show_it(condition: Condition) -> None:
    """No NVLink, no fabric, no AER, no NIC: absent facts, judged healthy report after report."""
    node = Node()
    bare = {"nvlink": None, "fabric": None}
    facts = status()
    for i in range(10):
        gpu0 = facts["gpus"][0]
        for key in bare:
            gpu0.pop(key, None)
        gpu0["ecc"]["correctedVolatile"] = 0
        assert condition not in node.report(facts, minutes(6 * i))
    signal = signals.fact_signals(facts, NODE, frozenset())[condition]  # type: ignore[arg-type]
    assert signal.present is False


# --- trends ---------------------------------------------------------------------------------------------


def test_a_link_down_that_was_never_up_is_no_fault() -> None:
    node = Node()
    assert node.report(status({"nvlink": {**NVLINK, "linksUp": 16, "linksDown": 2}}), minutes(0)) == set()
    assert node.report(status({"nvlink": {**NVLINK, "linksUp": 16, "linksDown": 2}}), minutes(1)) == set()


def test_a_link_back_up_clears_the_evidence() -> None:
    node = Node()
    node.report(status({"nvlink": NVLINK}), minutes(0))
    assert node.report(status({"nvlink": {**NVLINK, "linksUp": 17, "linksDown": 1}}), minutes(1)) == {
        Condition.NVLINK_DEGRADED
    }
    signals_now = signals.fact_signals(
        status({"nvlink": NVLINK}),  # type: ignore[arg-type]
        NODE,
        frozenset(),
        memory=node.store.gpunode("n").memory,  # type: ignore[union-attr]
    )
    assert signals_now[Condition.NVLINK_DEGRADED].present is False


@pytest.mark.parametrize("counter", ["crcErrors", "replayErrors", "recoveryErrors"])
def test_nvlink_errors_faster_than_the_threshold(counter: str) -> None:
    node = Node()
    node.report(status({"nvlink": NVLINK}), minutes(0))
    assert node.report(status({"nvlink": {**NVLINK, counter: 60}}), minutes(10)) == set()  # 60/h ≤ 100/h
    assert node.report(status({"nvlink": {**NVLINK, counter: 160}}), minutes(20)) == {
        Condition.NVLINK_DEGRADED
    }


def test_the_rule_threshold_decides_and_the_lowest_rule_wins() -> None:
    spec = {
        "rules": [
            {"name": "a", "condition": "NvLinkDegraded", "action": "Label", "threshold": 1000},
            {"name": "b", "condition": "NvLinkDegraded", "action": "Event", "threshold": 5},
        ]
    }
    policy = policies.parse_policy("p", 1, spec)
    assert trends.thresholds(policy) == ((Condition.NVLINK_DEGRADED, 5.0),)
    node = Node(policy)
    node.report(status({"nvlink": NVLINK}), minutes(0))
    assert node.report(status({"nvlink": {**NVLINK, "crcErrors": 6}}), minutes(1)) == {
        Condition.NVLINK_DEGRADED
    }


def test_a_counter_reset_by_a_gpu_reset_is_no_growth() -> None:
    node = Node()
    node.report(status({"ecc": {"correctedVolatile": 95, "correctedAggregate": 95}}), minutes(0))
    # The GPU is reset: the volatile count starts over from 0; then grows by 5 (below 10/h).
    assert (
        node.report(status({"ecc": {"correctedVolatile": 0, "correctedAggregate": 95}}), minutes(5)) == set()
    )
    assert (
        node.report(status({"ecc": {"correctedVolatile": 5, "correctedAggregate": 100}}), minutes(10))
        == set()
    )
    # A reboot resets the NVLink counters too.
    node.report(status({"nvlink": {**NVLINK, "crcErrors": 5000}}), minutes(15))
    assert node.report(status({"nvlink": {**NVLINK, "crcErrors": 3}}), minutes(20)) == set()


def test_a_link_back_up_brings_its_count_back_without_growth() -> None:
    """The agent sums NVLink errors over the links up: a link leaving and rejoining is no growth."""
    node = Node()
    node.report(status({"nvlink": {**NVLINK, "crcErrors": 5000}}), minutes(0))
    down = {**NVLINK, "linksUp": 17, "linksDown": 1, "crcErrors": 1000}
    assert node.report(status({"nvlink": down}), minutes(1)) == {Condition.NVLINK_DEGRADED}  # the link
    back = status({"nvlink": {**NVLINK, "crcErrors": 5001}})
    node.report(back, minutes(2))
    memory = node.store.gpunode("n").memory  # type: ignore[union-attr]
    assert memory.gpu(back["gpus"][0]).per_hour("nvlink.crcErrors") == 0
    signal = signals.fact_signals(back, NODE, frozenset(), memory=memory)[Condition.NVLINK_DEGRADED]  # type: ignore[arg-type]
    assert (
        signal.present is False
    )  # the evidence is gone; the sustained condition clears after healthyForSeconds


def test_growth_older_than_the_window_is_forgotten() -> None:
    node = Node()
    node.report(status(), minutes(0))
    grown = {"ecc": {"correctedVolatile": 50, "correctedAggregate": 50}}
    assert node.report(status(grown), minutes(10)) == {Condition.MEMORY_DEGRADING}
    # No more growth: once the growth is older than the window the evidence is gone (MemoryDegrading is
    # sustained, so the condition itself clears after healthyForSeconds).
    node.report(status(grown), minutes(75))
    memory = node.store.gpunode("n").memory  # type: ignore[union-attr]
    assert memory.gpu(status(grown)["gpus"][0]).per_hour("ecc.correctedVolatile") == 0


def test_memory_stays_bounded() -> None:
    node = Node()
    for i in range(500):
        node.report(status({"nvlink": {**NVLINK, "crcErrors": i}}), minutes(i / 2))
    memory = node.store.gpunode("n").memory  # type: ignore[union-attr]
    for track in memory.gpus.values():
        assert all(len(points) <= trends.MAX_POINTS for points in track.counters.values())
    node.report(gpunode_facts.agent_status(gpus=1), minutes(300))
    assert len(node.store.gpunode("n").memory.gpus) == 1  # type: ignore[union-attr]  # GPU 1 is forgotten


def test_healthy_gpus_share_one_track() -> None:
    node = Node()
    for i in range(3):
        node.report(status({"nvlink": NVLINK}), minutes(i))
    other = Node()
    other.report(status({"nvlink": NVLINK}), minutes(7))
    tracks = [*node.store.gpunode("n").memory.gpus.values(), *other.store.gpunode("n").memory.gpus.values()]  # type: ignore[union-attr]
    assert len(tracks) == 4 and tracks[0] is not tracks[1]  # GPU 0 has NVLink, GPU 1 not
    assert (
        tracks[0] is tracks[2] and tracks[1] is tracks[3]
    )  # the same facts on another node, at another time


def test_nic_down_after_active_slow_and_flapping() -> None:
    node = Node()
    disabled = {**NIC, "state": "DOWN", "physState": "Disabled"}
    assert node.report(status(nics=[disabled]), minutes(0)) == set()  # switched off by an administrator
    assert node.report(status(nics=[{**NIC, "state": "INIT"}]), minutes(1)) == set()  # never seen ACTIVE
    assert node.report(status(nics=[NIC]), minutes(2)) == set()
    assert node.report(status(nics=[{**NIC, "state": "INIT"}]), minutes(3)) == {Condition.NIC_DEGRADED}
    # Issue 45, item 7: DOWN without an administrator is a fault from one report, seen ACTIVE or not.
    node = Node()
    polling = {**NIC, "state": "DOWN", "physState": "Polling"}
    assert node.report(status(nics=[polling]), minutes(0)) == {Condition.NIC_DEGRADED}
    node = Node()
    node.report(status(nics=[NIC]), minutes(0))
    assert node.report(status(nics=[{**NIC, "rateGbps": 200.0}]), minutes(1)) == {Condition.NIC_DEGRADED}
    node = Node()
    node.report(status(nics=[NIC]), minutes(0))
    assert node.report(status(nics=[{**NIC, "symbolErrors": 99}]), minutes(5)) == set()
    assert node.report(status(nics=[{**NIC, "symbolErrors": 99, "rcvErrors": 150}]), minutes(10)) == {
        Condition.NIC_DEGRADED
    }


def test_nic_message_names_the_port() -> None:
    node = Node()
    node.report(status(nics=[NIC]), minutes(0))
    node.report(status(nics=[{**NIC, "state": "DOWN", "physState": "Polling"}]), minutes(1))
    message = node.previous[Condition.NIC_DEGRADED].message
    assert message == "mlx5_0/1: DOWN (physState Polling)"
    node = Node()
    node.report(status(nics=[NIC]), minutes(0))
    node.report(status(nics=[{**NIC, "state": "INIT"}]), minutes(1))
    assert node.previous[Condition.NIC_DEGRADED].message == "mlx5_0/1: INIT (was ACTIVE)"


def test_pcie_non_fatal_growth_is_an_error_at_the_default_threshold() -> None:
    node = Node()
    node.report(status({"pcie": {"aer": {"fatal": 0, "nonFatal": 3, "correctable": 0}}}), minutes(0))
    assert (
        node.report(status({"pcie": {"aer": {"fatal": 0, "nonFatal": 3, "correctable": 50}}}), minutes(1))
        == set()
    )
    assert node.report(
        status({"pcie": {"aer": {"fatal": 0, "nonFatal": 4, "correctable": 50}}}), minutes(2)
    ) == {Condition.PCIE_ERRORS}


def test_memory_degrading_is_degraded_not_unhealthy() -> None:
    node = Node()
    node.report(status({"retiredPages": {"pending": True, "doubleBit": 0}}), minutes(0))
    record = node.store.gpunode("n")
    assert record is not None
    verdict = verdicts.judge(
        POLICY, NODE, record.status, node.previous, None, minutes(0), memory=record.memory
    )
    assert verdict.health is vocabulary.Health.DEGRADED


def test_a_registration_in_progress_is_a_fault_only_after_the_rules_for_seconds() -> None:
    policy = policies.parse_policy(
        "p",
        1,
        {"rules": [{"name": "f", "condition": "FabricUnhealthy", "action": "Drain", "forSeconds": 600}]},
    )
    node = Node(policy)
    pending = status({"fabric": {"state": "InProgress"}})
    assert node.report(pending, minutes(0)) == set()
    assert node.report(pending, minutes(9)) == set()
    assert node.report(pending, minutes(10.1)) == {Condition.FABRIC_UNHEALTHY}
    done = status({"fabric": {"state": "Completed", "status": "Success", "cliqueId": 4}})
    assert node.report(done, minutes(11)) == set()  # fatal: clears with its evidence


COUNTERS = [(condition, path) for condition, paths in conditions.GPU_COUNTERS.items() for path in paths]


@pytest.mark.parametrize(("condition", "path"), COUNTERS, ids=[p for _, p in COUNTERS])
def test_every_tracked_counter_is_kept_by_the_cache_and_judged(condition: Condition, path: str) -> None:
    """Each counter a trend reads, grown by 1000 in an hour, fires its condition through the cache."""

    def at(value: int) -> dict[str, Any]:
        nested: dict[str, Any] = {path.rsplit(".", 1)[-1]: value}
        for part in reversed(path.split(".")[:-1]):
            nested = {part: nested}
        return gpunode_facts.merge({"nvlink": NVLINK, "pcie": {"aer": {"fatal": 0, "nonFatal": 0}}}, nested)

    node = Node()
    assert node.report(status(at(0)), minutes(0)) == set()
    assert node.report(status(at(1000)), minutes(30)) == {condition}
