"""IsolateGPU in GPUNode status: what the operator writes is what a restarted operator reads back."""

from gpuhealth_operator.decisions import isolation
from gpuhealth_operator.ladder.isolate import isolating


def test_isolated_gpus_round_trip_through_status() -> None:
    state = isolation.NodeState(
        None,
        in_place=(isolation.Isolated(3, "GPU-3", "gpuhealth-n-gpu-3", "2026-11-23T19:00:00.000Z"),),
        overridden=(isolation.Isolated(1, "GPU-1", "gpuhealth-n-gpu-1", None),),
    )
    written = isolating.to_status(state)
    assert [(g["index"], g["state"]) for g in written] == [(1, "Overridden"), (3, "Isolated")]
    assert isolating.from_status(written) == state


def test_nothing_isolated_writes_nothing_and_bad_status_reads_as_nothing() -> None:
    assert isolating.to_status(None) == []
    assert isolating.from_status(None) == isolation.NodeState()
    assert isolating.from_status([{"index": 2}, "junk", {"uuid": 5}]) == isolation.NodeState()
