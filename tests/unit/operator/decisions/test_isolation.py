"""IsolateGPU decisions: whose fault, and isolate, wait or the node ladder."""

import dataclasses
import datetime
from typing import Any

import pytest

from gpuhealth_api import conditions, keys, vocabulary
from gpuhealth_operator.decisions import device_taints, isolation, model, policies, verdicts

Condition = vocabulary.Condition
Outcome = isolation.Outcome
ECC = (Condition.ECC_UNCORRECTABLE,)
NODE = "gpu-node-3"
DEVICES = {f"GPU-{i}": device_taints.Device("gpu.nvidia.com", NODE, f"gpu-{i}") for i in range(8)}
CRITICAL = policies.DEFAULT_CRITICAL_XIDS


def fault(index: int, *conditions: Condition, node_wide: str | None = None) -> isolation.GPUFault:
    return isolation.GPUFault(index, f"GPU-{index}", conditions or ECC, node_wide)


# --- decide ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "attribution", "inputs", "outcomes", "ladder"),
    [
        ("one faulty DRA GPU is isolated", [fault(3)], {}, {3: Outcome.ISOLATE}, None),
        (
            "no DeviceTaintRule API",
            [fault(3)],
            {"api_version": None},
            {3: Outcome.NODE_LADDER},
            "the cluster does not act on DeviceTaintRules",
        ),
        (
            "a device-plugin node has no DRA devices",
            [fault(3)],
            {"devices": {}},
            {3: Outcome.NODE_LADDER},
            "GPU 3 is no DRA device (no ResourceSlice of the node lists UUID GPU-3)",
        ),
        (
            "one GPU without a device takes the node to the ladder",
            [fault(1), fault(3)],
            {"devices": {"GPU-1": DEVICES["GPU-1"]}},
            {1: Outcome.NODE_LADDER, 3: Outcome.NODE_LADDER},
            "GPU 3 is no DRA device",
        ),
        (
            "a node-wide fault",
            [fault(3, Condition.RECOVERY_REQUIRED, node_wide="the driver asks for a node reboot")],
            {},
            {3: Outcome.NODE_LADDER},
            "node-wide fault on GPU 3: the driver asks for a node reboot",
        ),
        (
            "more faulty GPUs than maxGPUsPerNode",
            [fault(1), fault(3), fault(5)],
            {},
            {1: Outcome.NODE_LADDER, 3: Outcome.NODE_LADDER, 5: Outcome.NODE_LADDER},
            "3 GPUs of the node would be isolated, more than isolation.maxGPUsPerNode (2)",
        ),
        (
            "GPUs already isolated count towards maxGPUsPerNode",
            [fault(3)],
            {"already_isolated": {"GPU-0", "GPU-1"}},
            {3: Outcome.NODE_LADDER},
            "3 GPUs of the node would be isolated",
        ),
        (
            "two GPUs fit maxGPUsPerNode 2",
            [fault(5), fault(3)],
            {},
            {3: Outcome.ISOLATE, 5: Outcome.ISOLATE},
            None,
        ),
        (
            "maxUnavailableGPUs spent: the next GPU waits, lowest index first",
            [fault(5), fault(3)],
            {"budget_left": 1},
            {3: Outcome.ISOLATE, 5: Outcome.WAIT},
            None,
        ),
        (
            "an isolated GPU needs no new budget",
            [fault(3)],
            {"already_isolated": {"GPU-3"}, "budget_left": 0},
            {3: Outcome.ISOLATE},
            None,
        ),
        (
            "a GPU without a UUID",
            [isolation.GPUFault(3, None, ECC)],
            {},
            {3: Outcome.NODE_LADDER},
            "GPU 3 reports no UUID to find its DRA device by",
        ),
    ],
)
def test_decide(
    case: str,
    attribution: list[isolation.GPUFault],
    inputs: dict[str, Any],
    outcomes: dict[int, Outcome],
    ladder: str | None,
) -> None:
    arguments: dict[str, Any] = {
        "devices": DEVICES,
        "api_version": "v1beta2",
        "max_gpus_per_node": 2,
        "budget_left": 10,
        **inputs,
    }
    decided = isolation.decide(isolation.Attribution(tuple(attribution)), **arguments)
    assert {gpu.index: gpu.outcome for gpu in decided.gpus} == outcomes, case
    if ladder is None:
        assert decided.node_ladder is None, case
    else:
        assert decided.node_ladder is not None and decided.node_ladder.startswith(ladder), case
        assert all(gpu.reason for gpu in decided.gpus)


def test_an_isolated_gpu_carries_its_device() -> None:
    decided = isolation.decide(
        isolation.Attribution((fault(3),)),
        devices=DEVICES,
        api_version="v1beta2",
        max_gpus_per_node=2,
        budget_left=1,
    )
    (gpu,) = decided.with_outcome(Outcome.ISOLATE)
    assert gpu.device == device_taints.Device("gpu.nvidia.com", NODE, "gpu-3")
    assert gpu.reason == f"GPU 3 is device gpu-3 of pool {NODE}"


def test_a_dry_run_names_the_gpus_it_would_isolate_and_those_that_would_wait() -> None:
    decided = isolation.decide(
        isolation.Attribution((fault(3), fault(5))),
        devices=DEVICES,
        api_version="v1beta2",
        max_gpus_per_node=2,
        budget_left=1,
    )
    assert isolation.dry_run_changes(decided) == [
        "isolate GPU 3 (GPU-3)",
        "isolate GPU 5 (GPU-5) once maxUnavailableGPUs allows",
    ]


def test_a_dry_run_on_the_node_ladder_leaves_the_words_to_the_node_action() -> None:
    decided = isolation.decide(
        isolation.Attribution((fault(3),)),
        devices={},
        api_version="v1beta2",
        max_gpus_per_node=2,
        budget_left=1,
    )
    assert decided.node_ladder is not None
    assert isolation.dry_run_changes(decided) == []


def test_nothing_faulty_decides_nothing() -> None:
    decided = isolation.decide(
        isolation.Attribution(()), devices=DEVICES, api_version=None, max_gpus_per_node=2, budget_left=0
    )
    assert decided == isolation.NodeIsolation(())


def test_missing_gpus_nobody_can_name_take_the_node_to_the_ladder() -> None:
    attribution = isolation.Attribution((), unattributed="GPULost: 7 of 8 GPUs reported")
    decided = isolation.decide(
        attribution, devices=DEVICES, api_version="v1beta2", max_gpus_per_node=2, budget_left=5
    )
    assert decided.node_ladder == "node-wide fault: GPULost: 7 of 8 GPUs reported"


# --- attribute -------------------------------------------------------------------------------------


def node_facts(count: int = 8, **faulty: dict[str, Any]) -> Any:
    """`count` healthy GPUs; keyword gpu<N>= adds fields to GPU N."""
    gpus = [{"index": i, "uuid": f"GPU-{i}", **faulty.get(f"gpu{i}", {})} for i in range(count)]
    return {"agent": {"expectedGpuCount": 8}, "gpus": gpus}


GPU_NODE = model.NodeView(NODE, labels={keys.GPU_COUNT_LABEL: "8"})


@pytest.mark.parametrize(
    ("facts", "wanted", "faulty", "node_wide"),
    [
        (node_facts(gpu3={"ecc": {"uncorrectedVolatile": 2}}), ECC, {3: ECC}, None),
        (node_facts(gpu3={"ecc": {"uncorrectedVolatile": 2}}), (Condition.XID_CRITICAL,), {}, None),
        (
            node_facts(gpu2={"xids": [{"code": 48, "count": 1}]}, gpu3={"ecc": {"uncorrectedVolatile": 1}}),
            (Condition.XID_CRITICAL, Condition.ECC_UNCORRECTABLE),
            {2: (Condition.XID_CRITICAL,), 3: ECC},
            None,
        ),
        (
            node_facts(gpu2={"xids": [{"code": 74, "count": 1}]}),
            (Condition.XID_CRITICAL,),
            {2: (Condition.XID_CRITICAL,)},
            "XID 74 (NVLINK_ERROR) needs the NVLink fabric the node's GPUs share reset",
        ),
        (
            node_facts(gpu1={"recoveryAction": "NodeReboot"}),
            (Condition.RECOVERY_REQUIRED,),
            {1: (Condition.RECOVERY_REQUIRED,)},
            "the driver asks for a node reboot (recovery action NodeReboot)",
        ),
        (
            node_facts(gpu1={"recoveryAction": "GpuReset"}),
            (Condition.RECOVERY_REQUIRED,),
            {1: (Condition.RECOVERY_REQUIRED,)},
            None,
        ),
        (node_facts(gpu6={"lost": True}), (Condition.GPU_LOST,), {6: (Condition.GPU_LOST,)}, None),
    ],
)
def test_attribute(
    facts: Any, wanted: tuple[Condition, ...], faulty: dict[int, tuple[Condition, ...]], node_wide: str | None
) -> None:
    found = isolation.attribute(facts, GPU_NODE, wanted, critical_xids=CRITICAL)
    assert {gpu.index: gpu.conditions for gpu in found.gpus} == faulty
    assert [gpu.node_wide for gpu in found.gpus if gpu.node_wide] == ([node_wide] if node_wide else [])
    assert found.unattributed is None


def test_a_gpu_missing_from_the_list_is_nobody_to_isolate() -> None:
    found = isolation.attribute(node_facts(count=7), GPU_NODE, (Condition.GPU_LOST,), critical_xids=CRITICAL)
    assert found.gpus == ()
    assert (
        found.unattributed
        == "GPULost: 7 of 8 GPUs reported, and a GPU that is not listed has no device to taint"
    )


def test_missing_data_attributes_nothing() -> None:
    found = isolation.attribute(
        {}, GPU_NODE, conditions.PER_GPU_CONDITIONS - {Condition.GPU_LOST}, critical_xids=CRITICAL
    )
    assert found == isolation.Attribution(())


# --- the node action today -------------------------------------------------------------------------


@pytest.mark.parametrize("action", list(vocabulary.Action))
def test_only_isolate_gpu_falls_back_and_to_drain(action: vocabulary.Action) -> None:
    expected = vocabulary.Action.DRAIN if action is vocabulary.Action.ISOLATE_GPU else action
    assert isolation.node_action(action) is expected


# --- the verdict once GPUs are decided ----------------------------------------------------------


def _fired(*rules: model.Rule, health: vocabulary.Health = vocabulary.Health.UNHEALTHY) -> model.NodeVerdict:
    since = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    states = {
        r.condition: model.ConditionState(r.condition, "True", r.condition.value, "", since) for r in rules
    }
    ordered = sorted(rules, key=lambda r: -vocabulary.ACTION_ORDER[isolation.node_action(r.action)])
    return model.NodeVerdict(
        node="n",
        conditions=states,
        health=health,
        issues=tuple(states),
        fired_rules=tuple(ordered),
        wanted_action=isolation.node_action(ordered[0].action),
        wanted_labels={},
        wanted_taint=None,
        recovered=False,
        detected_at=since,
    )


ISOLATE_ECC = model.Rule("ecc", Condition.ECC_UNCORRECTABLE, vocabulary.Action.ISOLATE_GPU)
ISOLATED = isolation.NodeIsolation(
    (isolation.GPUDecision(3, "GPU-3", (Condition.ECC_UNCORRECTABLE,), isolation.Outcome.ISOLATE, "x"),)
)


def test_isolated_gpus_take_isolate_gpu_off_the_node_ladder() -> None:
    judged = _fired(ISOLATE_ECC)
    assert judged.wanted_action is vocabulary.Action.DRAIN, "undecided: IsolateGPU acts as Drain"
    assert verdicts.with_isolation(judged, None) is judged
    amended = verdicts.with_isolation(judged, ISOLATED)
    assert amended.wanted_action is None
    assert amended.detected_at is None


def test_the_node_ladder_keeps_the_drain() -> None:
    judged = _fired(ISOLATE_ECC)
    ladder = isolation.NodeIsolation(ISOLATED.gpus, "GPU 3 is no DRA device")
    assert verdicts.with_isolation(judged, ladder).wanted_action is vocabulary.Action.DRAIN


def test_other_rules_keep_their_action_but_never_grow() -> None:
    label = model.Rule("thermal", Condition.THERMAL_THROTTLED, vocabulary.Action.LABEL)
    drain = model.Rule("xid", Condition.XID_CRITICAL, vocabulary.Action.DRAIN)
    assert (
        verdicts.with_isolation(_fired(ISOLATE_ECC, label), ISOLATED).wanted_action is vocabulary.Action.LABEL
    )
    assert (
        verdicts.with_isolation(_fired(ISOLATE_ECC, drain), ISOLATED).wanted_action is vocabulary.Action.DRAIN
    )
    overridden = dataclasses.replace(_fired(ISOLATE_ECC, drain), wanted_action=None, overridden=True)
    assert verdicts.with_isolation(overridden, ISOLATED).wanted_action is None


def test_restore_waits_for_healthy_for_seconds_and_a_live_agent() -> None:
    policy = model.Policy("p", rules=(ISOLATE_ECC,), recovery_healthy_for_seconds=60)
    cleared = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    state = model.ConditionState(Condition.ECC_UNCORRECTABLE, "False", "Clear", "", cleared)
    healthy = dataclasses.replace(
        _fired(ISOLATE_ECC), conditions={Condition.ECC_UNCORRECTABLE: state}, health=vocabulary.Health.HEALTHY
    )
    assert not isolation.may_restore(policy, healthy, cleared + datetime.timedelta(seconds=59))
    assert isolation.may_restore(policy, healthy, cleared + datetime.timedelta(seconds=60))
    stale = dataclasses.replace(healthy, health=vocabulary.Health.UNKNOWN)
    assert not isolation.may_restore(policy, stale, cleared + datetime.timedelta(seconds=600))
    assert not isolation.may_restore(policy, _fired(ISOLATE_ECC), cleared + datetime.timedelta(seconds=600))
