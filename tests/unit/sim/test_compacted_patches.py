"""A replay patches its GPUs as compacted (issue 52): the same facts as patching the raw report and
compacting it whole, whatever the patch holds (the raw path is the reference, kept here)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth_operator.decisions import gpu_facts
from gpuhealth_operator.state import compaction
from gpuhealth_sim.backtest import memcluster, replayer, traces

_SCALARS = st.one_of(
    st.booleans(), st.integers(-10, 3000), st.floats(allow_nan=False, width=32), st.text(max_size=8)
)
_AER = st.dictionaries(
    st.sampled_from(["correctable", "nonFatal", "fatal"]),
    st.one_of(st.none(), st.integers(0, 900)),
    max_size=3,
)
_PCIE = st.dictionaries(
    st.sampled_from(["width", "generation", "maxWidth", "maxGeneration", "aer", "other"]),
    st.one_of(st.none(), st.integers(1, 16), _AER),
    max_size=6,
)
_VALUES = st.one_of(
    st.none(),
    _SCALARS,
    st.lists(st.sampled_from(["SwPowerCap", "HwSlowdown"]), max_size=2),
    _PCIE,
    st.dictionaries(
        st.sampled_from(["crcErrors", "linksUp", "linksDown", "uncorrectedVolatile", "pending", "other"]),
        st.one_of(st.none(), st.integers(0, 5), _AER),
        max_size=4,
    ),
)
_KEYS = st.sampled_from([*compaction.GPU_FIELDS, "powerDrawWatts", "pciBusId"])
_GPU = st.dictionaries(_KEYS, _VALUES.filter(lambda v: v is not None), max_size=12)
_CHANGE = st.dictionaries(_KEYS, _VALUES, max_size=6)


def _reference(raw: dict[str, Any], change: dict[str, Any]) -> Any:
    """The replay before issue 52: the raw GPU patched, then compacted whole."""
    return compaction.compact_gpu(traces.merge_patch(raw, change))


@settings(max_examples=600, deadline=None)
@given(raw=_GPU, changes=st.lists(_CHANGE, min_size=1, max_size=4))
def test_a_patch_of_the_compacted_gpu_is_the_compacted_patch_of_the_raw_one(
    raw: dict[str, Any], changes: list[dict[str, Any]]
) -> None:
    """Patch after patch (each the next one's base), the compacted GPU is what compacting the raw
    GPU patched would keep: a field not kept changes nothing kept, a kept part's merge keeps its keys."""
    compacted = compaction.compact_gpu(raw)
    for change in changes:
        raw = traces.merge_patch(raw, change)
        compacted = replayer._patch_compacted(compacted, change)
        assert type(compacted) is gpu_facts.GPUFacts
        assert compacted == compaction.compact_gpu(raw)
        assert dict(compacted) == dict(compaction.compact_gpu(raw))
        assert list(compacted) == list(compaction.compact_gpu(raw))  # keys in the same order


@settings(max_examples=300, deadline=None)
@given(
    gpus=st.lists(_GPU, min_size=1, max_size=4),
    patches=st.lists(
        st.dictionaries(
            st.sampled_from(["0", "1", "2", "3", "4"]), st.one_of(st.none(), _CHANGE), max_size=3
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_a_status_patched_as_compacted_is_the_raw_status_patched_and_compacted(
    gpus: list[dict[str, Any]], patches: list[dict[str, Any]]
) -> None:
    """`traces.apply_status_patch` with the replay's GPU hooks: GPUs patched, appended and removed as
    the raw report's are, each compacted."""
    raw: dict[str, Any] = {"agent": {"lastHeartbeatTime": "t0"}, "gpus": gpus}
    compacted = replayer._compacted(raw)
    for number, per_gpu in enumerate(patches):
        patch = {"agent": {"lastHeartbeatTime": f"t{number + 1}"}, "gpus": per_gpu}
        try:
            raw = traces.apply_status_patch(raw, patch)
        except IndexError:  # a removal past the end, in both: a bad trace
            return
        compacted = replayer._compacted(
            traces.apply_status_patch(
                compacted, patch, patch_gpu=replayer._patch_compacted, new_gpu=replayer._new_compacted
            )
        )
        assert compacted == {**raw, "gpus": [compaction.compact_gpu(g) for g in raw["gpus"]]}


def test_the_cluster_holds_an_adopted_value_only_for_the_version_given() -> None:
    """`MemoryKube.adopt_status`: the cache's equal conditions for the version both hold, not a write."""
    kube = memcluster.MemoryKube()
    body = kube.put_gpunode("n", {"agent": {}})
    body["status"]["conditions"] = [{"type": "A"}]
    version = body["metadata"]["resourceVersion"]
    kept: list[Any] = [{"type": "A"}]
    kube.adopt_status("n", str(int(version) + 1), "conditions", kept)
    assert kube.gpunodes["n"]["status"]["conditions"] is not kept  # another version: not held
    kube.adopt_status("n", version, "conditions", kept)
    assert kube.gpunodes["n"]["status"]["conditions"] is kept
    assert kube.gpunodes["n"]["metadata"]["resourceVersion"] == version  # no new version
    kube.adopt_status("n", version, "isolatedGPUs", [0])
    assert "isolatedGPUs" not in kube.gpunodes["n"]["status"]  # a field it does not hold: nothing
