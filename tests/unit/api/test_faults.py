"""One definition of every fault: the XID catalogue's critical column and the physical GPU count."""

from pathlib import Path

import pytest

from gpuhealth_api import faults, keys, xid_catalogue

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
