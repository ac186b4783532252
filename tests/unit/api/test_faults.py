"""One definition of every fault: the XID catalogue's critical column and the physical GPU count."""

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth_api import conditions, faults, keys, status, vocabulary, xid_catalogue

PACKAGE = Path(__file__).resolve().parents[3] / "api" / "gpuhealth_api"
RESET_OR_WORSE = frozenset({"RESET_GPU", "RESTART_BM", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR"})
"""NVIDIA's immediate actions that mean a GPU reset, a node reboot or worse."""


def test_xid_catalogue_ships_with_the_api_package() -> None:
    text = (PACKAGE / xid_catalogue.DATA_FILE).read_text()
    assert "docs.nvidia.com/deploy/xid-errors" in text
    assert len(xid_catalogue.Catalogue.packaged()) == text.count("- {code:")


def test_critical_exactly_when_nvidia_resolves_with_a_reset_or_worse() -> None:
    for info in xid_catalogue.Catalogue.packaged().entries():
        assert info.critical is (info.action in RESET_OR_WORSE), info


def test_the_default_critical_set() -> None:
    assert xid_catalogue.default_critical() == {46, 48, 62, 64, 74, 79, 95, 109, 110, 119, 120, 140, 143, 158}
    # Not fatal by NVIDIA's resolution: a recorded remap (its pending reset is RowRemapFailure),
    # a high correctable-error rate, an error contained to one application.
    assert not {63, 92, 94} & xid_catalogue.default_critical()


def test_an_unknown_xid_is_not_critical() -> None:
    info = xid_catalogue.Catalogue.packaged().lookup(999)
    assert (info.name, info.action, info.critical) == ("XID_999", "CONTACT_SUPPORT", False)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("xids:\n- {code: 1, name: A, description: a, action: IGNORE}\n", r"xids\[0\]\.critical"),
        (
            "xids:\n- {code: 1, name: A, description: a, action: IGNORE, critical: false}\n"
            "- {code: 1, name: B, description: b, action: IGNORE, critical: false}\n",
            r"xids\[1\]\.code: duplicate XID 1",
        ),
    ],
)
def test_a_malformed_catalogue_names_the_entry(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        xid_catalogue.parse(text)


MIG_SINGLE = {keys.MIG_STRATEGY_LABEL: "single", keys.GPU_COUNT_LABEL: "56"}


@pytest.mark.parametrize(
    ("labels", "capacity", "seen", "expected"),
    [
        pytest.param({keys.GPU_COUNT_LABEL: "8"}, 8, None, 8, id="plain-gfd"),
        pytest.param(
            {keys.GPU_COUNT_LABEL: "8", keys.GPU_REPLICAS_LABEL: "4"}, 32, 8, 8, id="time-sliced-x4"
        ),
        pytest.param({keys.GPU_REPLICAS_LABEL: "4"}, 32, None, 8, id="replicas-without-count"),
        pytest.param({keys.GPU_REPLICAS_LABEL: "16"}, 128, None, 8, id="time-sliced-x16"),
        pytest.param({}, 32, None, None, id="bare-capacity-tells-nothing"),
        pytest.param({}, 32, 8, 8, id="bare-capacity-agent-saw-8"),
        pytest.param(MIG_SINGLE, 56, 8, 8, id="mig-single"),
        pytest.param(MIG_SINGLE, 56, None, None, id="mig-single-before-the-agent"),
        pytest.param({keys.MIG_STRATEGY_LABEL: "mixed", keys.GPU_COUNT_LABEL: "8"}, 0, 8, 8, id="mig-mixed"),
        pytest.param({keys.MIG_STRATEGY_LABEL: "none", keys.GPU_COUNT_LABEL: "8"}, 8, None, 8, id="mig-none"),
        pytest.param({keys.GPU_COUNT_LABEL: "7"}, 7, 8, 8, id="relabelled-after-a-loss"),
        pytest.param(
            {keys.GPU_COUNT_LABEL: "many", keys.GPU_REPLICAS_LABEL: "0"}, 8, None, None, id="garbage"
        ),
        pytest.param({keys.GPU_COUNT_LABEL: "1000"}, None, None, faults.MAX_GPUS, id="capped"),
    ],
)
def test_expected_gpu_count_is_the_physical_count(
    labels: dict[str, str], capacity: int | None, seen: int | None, expected: int | None
) -> None:
    assert faults.expected_gpu_count(labels, capacity, seen) == expected


def test_seen_by_agent_takes_the_larger_agent_count() -> None:
    assert faults.seen_by_agent({"agent": {"maxGpuCountSeen": 8, "expectedGpuCount": 7}}) == 8
    assert faults.seen_by_agent({"agent": {"expectedGpuCount": 4}}) == 4
    assert faults.seen_by_agent({"agent": {"maxGpuCountSeen": True}}) is None
    assert faults.seen_by_agent({}) is None


def test_missing_gpus() -> None:
    assert faults.missing_gpus(7, 8) == "7 of 8 GPUs reported"
    assert faults.missing_gpus(0, 1) == "0 of 1 GPU reported"
    assert faults.missing_gpus(8, 8) is None
    assert faults.missing_gpus(8, None) is None


_ANY = st.one_of(
    st.none(), st.booleans(), st.integers(-2, 300), st.floats(allow_nan=False), st.text(max_size=8)
)
_GPU_VALUES: dict[str, st.SearchStrategy[object]] = {
    "index": st.integers(0, 7),
    "uuid": st.sampled_from(["GPU-a", "GPU-b", ""]),
    "lost": st.one_of(st.booleans(), _ANY),
    "ecc": st.one_of(
        st.fixed_dictionaries({"uncorrectedVolatile": st.one_of(st.integers(0, 3), _ANY)}), _ANY
    ),
    "remappedRows": st.one_of(
        st.fixed_dictionaries({"failure": st.booleans(), "pending": st.one_of(st.booleans(), _ANY)}), _ANY
    ),
    "xids": st.one_of(
        st.lists(
            st.fixed_dictionaries(
                {"code": st.sampled_from([13, 31, 48, 79, 94]), "count": st.integers(0, 3)}
            ),
            max_size=3,
        ),
        _ANY,
    ),
    "recoveryAction": st.one_of(st.sampled_from(["None", "GpuReset", "NodeReboot", "Drain"]), _ANY),
    "clockEventReasons": st.one_of(
        st.lists(
            st.sampled_from(["HwSlowdown", "SwThermalSlowdown", "HwPowerBrakeSlowdown", "SwPowerCap", 5])
        ),
        _ANY,
    ),
    "temperatureCelsius": st.one_of(st.integers(20, 100), _ANY),
    "slowdownTemperatureCelsius": st.one_of(st.integers(80, 95), _ANY),
    "utilizationPercent": st.one_of(st.integers(0, 100), _ANY),
    "pcie": st.one_of(
        st.fixed_dictionaries(
            {
                "generation": st.integers(1, 5),
                "maxGeneration": st.integers(1, 5),
                "width": st.sampled_from([4, 8, 16]),
                "maxWidth": st.sampled_from([8, 16]),
            }
        ),
        _ANY,
    ),
    "observedTime": st.sampled_from(["2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"]),
    "smClockMHz": st.integers(0, 2000),
}
_GPUS = st.fixed_dictionaries({}, optional=_GPU_VALUES)


@settings(max_examples=400, deadline=None)
@given(
    a=_GPUS,
    b=_GPUS,
    condition=st.sampled_from(sorted(conditions.READS)),
    critical=st.frozensets(st.sampled_from([48, 79, 94]), min_size=1),
)
def test_a_predicate_reads_only_the_fields_it_declares(
    a: dict[str, object], b: dict[str, object], condition: vocabulary.Condition, critical: frozenset[int]
) -> None:
    """`READS` lets the operator keep a GPU's answers while those fields stay as they were: a GPU that
    takes another's values in every field a predicate reads gets that predicate's answer."""
    reads = conditions.READS[condition]
    alike = {k: v for k, v in b.items() if k not in reads} | {k: v for k, v in a.items() if k in reads}
    check = conditions.gpu_checks(critical)[condition]
    assert check(alike) == check(a)  # type: ignore[arg-type]


# --- recovery actions: which the driver means for one GPU, which for the whole node ----------------------

PER_GPU_RECOVERY = {"GpuReset", "BusReset"}
"""The only recovery actions that touch the faulty GPU alone (a GPU reset, a reset of its PCIe bus)."""


def test_every_nvml_recovery_action_is_in_the_vocabulary() -> None:
    # NVML_GPU_RECOVERY_ACTION_NONE .. SYSTEM_REBOOT (pynvml; cuda.bindings.nvml.DeviceGpuRecoveryAction).
    assert [a.value for a in vocabulary.RecoveryAction] == [
        "None",
        "GpuReset",
        "NodeReboot",
        "DrainP2P",
        "DrainAndReset",
        "RecoverImexDomain",
        "BusReset",
        "SystemReboot",
    ]


@pytest.mark.parametrize("action", [a.value for a in vocabulary.RecoveryAction])
def test_a_recovery_action_is_node_wide_unless_it_resets_the_gpu_alone(action: str) -> None:
    gpu = status.GPUStatus(index=0, recoveryAction=action)
    if action == "None":
        assert faults.recovery_required(gpu) is None
        assert faults.node_wide_recovery(gpu) is None
        return
    assert faults.recovery_required(gpu) is not None
    reason = faults.node_wide_recovery(gpu)
    if action in PER_GPU_RECOVERY:
        assert reason is None
    else:
        assert reason is not None and action in reason


def test_a_recovery_action_this_version_does_not_know_is_node_wide() -> None:
    gpu = status.GPUStatus(index=0, recoveryAction="Unknown9")
    assert faults.recovery_required(gpu) is not None
    assert (
        faults.node_wide_recovery(gpu)
        == "the driver asks for recovery action Unknown9, unknown to this version"
    )


def test_malformed_recovery_actions_are_no_fault() -> None:
    for value in (None, 3, ""):
        gpu: status.GPUStatus = {"index": 0, "recoveryAction": value}  # type: ignore[typeddict-item]
        assert faults.node_wide_recovery(gpu) is None


def test_node_reboot_keeps_its_words() -> None:
    gpu = status.GPUStatus(index=0, recoveryAction="NodeReboot")
    assert faults.node_wide_recovery(gpu) == "the driver asks for a node reboot (recovery action NodeReboot)"
