"""hack/replay_equivalence.py: two trees' reports compared but for their timing, a difference shown."""

import dataclasses
import pathlib

import pytest
import yaml

import hack_scripts

equivalence = hack_scripts.load("replay_equivalence.py", "hack_replay_equivalence")
REPO = pathlib.Path(__file__).resolve().parents[2]


def test_timing_keys_are_dropped_at_every_depth() -> None:
    report = {"replaySeconds": 1.5, "policies": [{"replayCpuSeconds": 2.0, "actions": {"Drain": 1}}]}
    assert equivalence.comparable(report) == {"policies": [{"actions": {"Drain": 1}}]}


def test_isolate_policy_judges_every_node(tmp_path: pathlib.Path) -> None:
    policy = yaml.safe_load(equivalence.isolate_policy(tmp_path).read_text())
    demo = yaml.safe_load(equivalence.DEMO.read_text())
    assert "nodeSelector" in demo["spec"]
    assert "nodeSelector" not in policy["spec"]
    assert policy["spec"] == {k: v for k, v in demo["spec"].items() if k != "nodeSelector"}


def test_one_tree_against_itself_is_identical(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    # One small case of the six (each replay is a process of its own: seconds), and a trace of one's own.
    case = equivalence.Case("seed1", ("--seed", "1", "--nodes", "2"), "default")
    monkeypatch.setattr(equivalence, "CASES", (case,))
    trace = equivalence.generate(tmp_path, dataclasses.replace(case, trace="mine"), 0.1)
    argv = [str(REPO), str(REPO), "--workdir", str(tmp_path), "--node-days", "0.1"]
    code = equivalence.main([*argv, "--trace", str(trace), "--policy", str(equivalence.DEFAULT)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.splitlines() == [
        f"seed1-0.1 default: identical ({_lines(out, 0)} lines)",
        f"{trace.name} default-policy: identical ({_lines(out, 1)} lines)",
    ]


def test_a_difference_is_shown_and_fails(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    monkeypatch.setattr(equivalence, "CASES", ())
    reports = iter(['{\n"Drain": 1\n}', '{\n"Drain": 2\n}'])
    monkeypatch.setattr(equivalence, "replay", lambda *_: next(reports))
    trace = tmp_path / "t.jsonl"
    code = equivalence.main(["old", "new", "--trace", str(trace), "--policy", str(equivalence.DEFAULT)])
    out = capsys.readouterr().out
    assert code == 1
    assert "t.jsonl default-policy: DIFFERENT" in out
    assert '-"Drain": 1' in out and '+"Drain": 2' in out


def _lines(out: str, row: int) -> str:
    return out.splitlines()[row].rsplit("(", 1)[1].split()[0]
