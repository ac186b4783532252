"""The demo's ground truth for the backtest of its own run: the faults its fleet file scripts."""

from gpuhealth_sim.demo import demotrace, walkthrough
from gpuhealth_sim.fleet import fleetfile


def test_the_demo_fleets_scripted_faults_become_truth_records() -> None:
    spec = fleetfile.load(walkthrough.DEFAULT_FLEET)
    truth = list(demotrace.truth(spec, offset=2.0, end=80.0, human=("gpu-node-11", 1.5)))
    found = {(r["type"], r["node"], r.get("fault"), r["start"], r["end"]) for r in truth}
    assert found == {
        ("fatal", "gpu-node-3", "DBE", 17.0, 80.0),
        ("fatal", "gpu-node-12", "DBE", 17.0, 80.0),
        ("fatal", "gpu-node-7", "XID79", 32.0, 80.0),
        ("thermal", "gpu-node-5", None, 12.0, 27.0),
        ("straggler", "gpu-node-9", None, 2.0, 80.0),
        ("humanCordon", "gpu-node-11", None, 1.5, 80.0),
    }
    (straggler,) = [r for r in truth if r["type"] == "straggler"]
    assert straggler["slowdown"] >= 0.1 and all(r["kind"] == "truth" for r in truth)
