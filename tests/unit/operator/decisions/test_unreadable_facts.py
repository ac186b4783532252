"""A fact the agent cannot read (gpus[].unreadable) neither fires nor clears the conditions that read it."""

import datetime
from typing import Any

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import gpu_facts, model, policies, signals, times, verdicts

Condition = vocabulary.Condition
Health = vocabulary.Health
T0 = datetime.datetime(2026, 11, 22, 1, 0, 0, tzinfo=datetime.UTC)
NODE = model.NodeView(name="gpu-node-3", labels={"gpu": "yes"})
POLICY = policies.parse_policy(
    "default",
    1,
    {
        "nodeSelector": {"matchLabels": {"gpu": "yes"}},
        "rules": [
            {"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"},
            {"name": "thermal", "condition": "ThermalThrottled", "action": "Label", "forSeconds": 60},
        ],
        "recovery": {"healthyForSeconds": 0, "uncordon": True},
    },
)


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def facts(now: datetime.datetime, *gpus: dict[str, Any]) -> Any:
    return {"agent": {"lastHeartbeatTime": times.render(now), "heartbeatSeconds": 60}, "gpus": list(gpus)}


def gpu(index: int, **fields: Any) -> dict[str, Any]:
    return {"index": index, "uuid": f"GPU-{index}", "temperatureCelsius": 40, **fields}


ECC_UNREAD = {"ecc": {"correctedVolatile": 0}, "unreadable": ["ecc.uncorrectedVolatile"]}


def test_an_unread_ecc_count_does_not_release_a_node_with_an_ecc_fault() -> None:
    """Old code: the unreadable count read as no fault, EccUncorrectable cleared, the node 'recovered'."""
    faulty = facts(at(0), gpu(0, ecc={"uncorrectedVolatile": 2}), gpu(1, ecc={"uncorrectedVolatile": 0}))
    first = verdicts.judge(POLICY, NODE, faulty, {}, None, at(0))
    assert first.conditions[Condition.ECC_UNCORRECTABLE].status == "True"
    unread = facts(at(30), gpu(0, **ECC_UNREAD), gpu(1, ecc={"uncorrectedVolatile": 0}))
    later = verdicts.judge(POLICY, NODE, unread, first.conditions, None, at(30))
    assert later.conditions[Condition.ECC_UNCORRECTABLE].status == "True"
    assert later.health is Health.UNHEALTHY
    assert not later.recovered


def test_an_unread_fact_is_an_unknown_signal_naming_it() -> None:
    signal = signals.raw_signals(facts(at(0), gpu(0, **ECC_UNREAD), gpu(1)), NODE, frozenset(), at(0))[
        Condition.ECC_UNCORRECTABLE
    ]
    assert signal.present is None
    assert signal.message == "unknown: GPU 0 (GPU-0): cannot read ecc.uncorrectedVolatile"


def test_another_gpu_showing_the_fault_is_still_the_fault() -> None:
    both = facts(at(0), gpu(0, **ECC_UNREAD), gpu(1, ecc={"uncorrectedVolatile": 1}))
    signal = signals.raw_signals(both, NODE, frozenset(), at(0))[Condition.ECC_UNCORRECTABLE]
    assert signal.present is True


def test_an_unread_fact_leaves_the_conditions_that_do_not_read_it_alone() -> None:
    found = signals.raw_signals(facts(at(0), gpu(0, **ECC_UNREAD)), NODE, frozenset(), at(0))
    assert found[Condition.THERMAL_THROTTLED].present is False
    assert found[Condition.ROW_REMAP_FAILURE].present is False


def test_the_cache_keeps_what_cannot_be_read() -> None:
    kept = gpu_facts.GPUFacts({k: v for k, v in gpu(0, **ECC_UNREAD).items() if k in gpu_facts.FIELDS})
    signal = signals.raw_signals(facts(at(0), kept), NODE, frozenset(), at(0))[Condition.ECC_UNCORRECTABLE]
    assert signal.present is None
